// Command ownmetrics prints the metrics the stack's own node status exporter serves, one a line, for the PromQL
// check of tests/monitoring. It is a command, not a package that test imports, because the exporter's code links
// NVML and the chart tests link Helm; one binary with both does not load on a machine without the NVIDIA driver.
package main

import (
	"fmt"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

func main() {
	for _, m := range validation.StackMetricNames() {
		fmt.Println(m)
	}
}
