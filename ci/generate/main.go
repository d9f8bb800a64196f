// Command generate writes the files the repository generates from its charts (`make generate`): every chart's
// values.schema.json from its values.yaml (ci/valuesschema), and the umbrella chart's images.txt and Chart.yaml
// artifacthub.io/images annotation from rendering every profile (ci/imagelist). Tests in tests/chart fail when a
// committed file differs from what this writes.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/ci/valuesschema"
)

func main() {
	root := flag.String("root", ".", "the repository root")
	flag.Parse()
	if err := run(context.Background(), *root); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root string) error {
	schemas, err := valuesschema.All(root)
	if err != nil {
		return err
	}
	for _, f := range schemas {
		if err := os.WriteFile(f.Path, f.Content, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("wrote %d values.schema.json files\n", len(schemas))

	log.SetOutput(io.Discard) // the chart loader logs one notice per operand symlink
	set, err := imagelist.Collect(ctx, root)
	if err != nil {
		return err
	}
	chartDir := filepath.Join(root, "charts", "kube-gpu-stack")
	if err := imagelist.Write(chartDir, set); err != nil {
		return err
	}
	fmt.Printf("wrote %s and its Chart.yaml annotation: %d images from %d renders\n",
		filepath.Join(chartDir, imagelist.FileName), len(set.Images()), set.Renders)
	return nil
}
