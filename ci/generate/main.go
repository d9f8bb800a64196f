// Command generate writes the files the repository generates from its charts (`make generate`): every chart's
// values.schema.json from its values.yaml (ci/valuesschema), and the umbrella chart's images.txt and Chart.yaml
// artifacthub.io/images annotation from rendering every profile (ci/imagelist). Tests in tests/chart fail when a
// committed file differs from what this writes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/ci/valuesschema"
)

func main() {
	root := flag.String("root", ".", "the repository root")
	// The schemas take a moment; the image list renders every profile (about a minute on 2 cores).
	what := flag.String("what", "schemas,images", "what to write: schemas (values.schema.json), images (images.txt and the Chart.yaml annotation), or both")
	flag.Parse()
	if err := run(context.Background(), *root, strings.Split(*what, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, root string, what []string) error {
	for _, w := range what {
		if w != "schemas" && w != "images" {
			return fmt.Errorf("-what: unknown %q (want schemas, images or both)", w)
		}
	}
	if slices.Contains(what, "schemas") {
		if err := writeSchemas(root); err != nil {
			return err
		}
	}
	if slices.Contains(what, "images") {
		return writeImages(ctx, root)
	}
	return nil
}

func writeSchemas(root string) error {
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
	return nil
}

func writeImages(ctx context.Context, root string) error {
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
