// Command demo starts a local control plane with simulated GPU nodes, installs the chart and shows what runs
// where. `make demo` builds the control plane first.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func main() {
	var opts Options
	flag.StringVar(&opts.Profile, "values", "values/mixed.yaml", "values profile to install")
	flag.StringVar(&opts.UpgradeDriver, "upgrade-driver", "", "after the install, upgrade the driver to this version and show each node's upgrade states")
	flag.BoolVar(&opts.Keep, "keep", false, "keep the cluster running and print its kubeconfig")
	flag.Parse()
	opts.Stdin = os.Stdin
	if err := Run(context.Background(), opts, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
