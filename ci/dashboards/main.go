// Command dashboards writes the chart's Grafana dashboards (charts/kube-gpu-stack/dashboards/*.json) from their Go
// definitions: `make generate`. The chart ships the generated files; a test fails when they are stale.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	out := flag.String("out", "charts/kube-gpu-stack/dashboards", "directory to write the dashboards to")
	flag.Parse()
	if err := Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards:", err)
		os.Exit(1)
	}
}
