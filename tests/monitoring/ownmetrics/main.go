// Command ownmetrics prints the metrics the stack's own node status exporter serves, one a line, for the PromQL
// check of tests/monitoring. It is a command, not a package that test imports, because the exporter's code links
// NVML and the chart tests link Helm; one binary with both does not load on a machine without the NVIDIA driver.
package main

import (
	"fmt"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/validation"
)

// ownMetrics are the series the node status exporter serves: the GPU Operator's per-check gauges and the per-node
// validation, driver upgrade state and driver info series.
func ownMetrics() []string {
	var out []string
	for _, c := range validation.MetricsComponents {
		out = append(out, "gpu_operator_node_"+c+"_ready")
	}
	return append(out,
		"kube_gpu_stack_node_validation_ready",
		"kube_gpu_stack_node_driver_upgrade_state",
		"kube_gpu_stack_node_driver_upgrade_state_seconds",
		"kube_gpu_stack_node_driver_info",
	)
}

func main() {
	for _, m := range ownMetrics() {
		fmt.Println(m)
	}
}
