package main

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// gpuNode is one node, GPU by GPU: what the stack says about it (driver, upgrade state, validations) above what
// each GPU does and the errors it reports.
func gpuNode() *dashboard.DashboardBuilder {
	var i ids
	dcgm := `Hostname="$node", gpu=~"$gpu"`
	stack := `node="$node"`
	d := base("kube-gpu-stack-node", "GPU node",
		"One GPU node: its driver, driver upgrade state and operand validations (the stack's node status exporter), "+
			"then per GPU utilisation, memory, temperature, power, and Xid, ECC, NVLink, row-remap and throttling (DCGM exporter).").
		WithVariable(labelVariable("node", "Hostname", gpuUtil, "", false)).
		WithVariable(labelVariable("gpu", "gpu", gpuUtil, `{Hostname="$node"}`, true))

	d = d.WithRow(dashboard.NewRowBuilder("Stack").Id(i.id())).
		WithPanel(single(&i, "Driver", "Loaded driver version and config digest.", "none", 6, 4,
			query("A", fmt.Sprintf("%s{%s}", driverInfo, stack), "{{version}} ({{config_digest}})")).
			TextMode(common.BigValueTextModeName).ColorMode(common.BigValueColorModeNone)).
		WithPanel(single(&i, "Driver upgrade state", "nvidia.com/gpu-driver-upgrade-state of the node.", "none", 6, 4,
			query("A", fmt.Sprintf("%s{%s} == 1", upgradeState, stack), "{{state}}")).
			TextMode(common.BigValueTextModeName).ColorMode(common.BigValueColorModeNone)).
		WithPanel(single(&i, "Time in upgrade state", "Since the node entered its current driver upgrade state.", "s", 4, 4,
			query("A", fmt.Sprintf("%s{%s}", upgradeStateSecs, stack), ""))).
		WithPanel(single(&i, "Validations", "Each operand validation on the node: ready once its status file exists.", "none", 8, 4,
			query("A", fmt.Sprintf("%s{%s}", validationReady, stack), "{{component}}")).
			Mappings(readyMapping()).TextMode(common.BigValueTextModeValueAndName).ColorMode(common.BigValueColorModeBackground)).
		WithPanel(series(&i, "Driver upgrade state over time", "1 while the node is in a state.", "none", 24, 6,
			query("A", fmt.Sprintf("%s{%s} == 1", upgradeState, stack), "{{state}}")).
			DrawStyle(common.GraphDrawStyleBars).FillOpacity(80).Min(0).Max(1))

	d = d.WithRow(dashboard.NewRowBuilder("GPUs").Id(i.id())).
		WithPanel(series(&i, "Utilisation", "", "percent", 12, 8,
			query("A", fmt.Sprintf("%s{%s}", gpuUtil, dcgm), "GPU {{gpu}}")).Min(0).Max(100)).
		WithPanel(series(&i, "Memory used", "Framebuffer used (MiB, DCGM reports MiB).", "decmbytes", 12, 8,
			query("A", fmt.Sprintf("%s{%s}", fbUsed, dcgm), "GPU {{gpu}} used"),
			query("B", fmt.Sprintf("%[1]s{%[3]s} + %[2]s{%[3]s}", fbUsed, fbFree, dcgm), "GPU {{gpu}} total")).Min(0)).
		WithPanel(series(&i, "Temperature", "", "celsius", 12, 8,
			query("A", fmt.Sprintf("%s{%s}", gpuTemp, dcgm), "GPU {{gpu}}"))).
		WithPanel(series(&i, "Power", "", "watt", 12, 8,
			query("A", fmt.Sprintf("%s{%s}", powerUsage, dcgm), "GPU {{gpu}}")).Min(0))

	d = d.WithRow(dashboard.NewRowBuilder("Errors").Id(i.id())).
		WithPanel(events(&i, "Xid errors", "New Xid errors per GPU and Xid (DCGM_EXP_XID_ERRORS_COUNT).", 12, 8,
			query("A", fmt.Sprintf("sum by (gpu, xid) (increase(%s{%s}[$__rate_interval])) > 0", xidCount, dcgm), "GPU {{gpu}} Xid {{xid}}"))).
		WithPanel(events(&i, "ECC double-bit errors", "New uncorrectable ECC errors per GPU.", 12, 8,
			query("A", fmt.Sprintf("sum by (gpu) (increase(%s{%s}[$__rate_interval])) > 0", eccDBE, dcgm), "GPU {{gpu}}"))).
		WithPanel(events(&i, "NVLink errors", "New NVLink CRC, replay and recovery errors per GPU.", 12, 8,
			query("A", fmt.Sprintf("sum by (gpu) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkCRCFlit, dcgm), "GPU {{gpu}} CRC flit"),
			query("B", fmt.Sprintf("sum by (gpu) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkCRCData, dcgm), "GPU {{gpu}} CRC data"),
			query("C", fmt.Sprintf("sum by (gpu) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkReplay, dcgm), "GPU {{gpu}} replay"),
			query("D", fmt.Sprintf("sum by (gpu) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkRecovery, dcgm), "GPU {{gpu}} recovery"))).
		WithPanel(series(&i, "Row remapping", "1 while a GPU has a remap pending (reset it) or a remap failure (replace it).", "none", 12, 8,
			query("A", fmt.Sprintf("%s{%s}", rowRemapPending, dcgm), "GPU {{gpu}} pending"),
			query("B", fmt.Sprintf("%s{%s}", rowRemapFailure, dcgm), "GPU {{gpu}} failed")).Min(0)).
		WithPanel(series(&i, "Throttling", "Share of time each GPU was held back by its power or thermal limit.", "percentunit", 24, 8,
			query("A", fmt.Sprintf("rate(%s{%s}[$__rate_interval]) / 1e6", powerViolation, dcgm), "GPU {{gpu}} power"),
			query("B", fmt.Sprintf("rate(%s{%s}[$__rate_interval]) / 1e6", thermalViolation, dcgm), "GPU {{gpu}} thermal")).Min(0))
	return d
}
