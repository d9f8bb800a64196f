// Command gen writes the simulated NVML's stubs (tests/node/simnvml/stubs_gen.c): run by go generate in that
// package's folder.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/internal/stubs"
)

func main() {
	out := flag.String("o", "stubs_gen.c", "the file to write")
	pkg := flag.String("pkg", ".", "the library's package folder")
	flag.Parse()
	b, err := stubs.Generate(*pkg)
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
