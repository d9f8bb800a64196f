package main

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// fleetOverview is the whole fleet at a glance: how many GPUs work and how hard, which nodes report hardware
// errors, and where the driver rollout and the validations stand. Every panel can be narrowed to some nodes.
func fleetOverview() *dashboard.DashboardBuilder {
	var i ids
	dcgm := `Hostname=~"$node"`
	stack := `node=~"$node"`
	d := base("kube-gpu-stack-fleet", "GPU fleet overview",
		"Every GPU node of the cluster: utilisation, memory, temperature and power (DCGM exporter), Xid, ECC, "+
			"NVLink and row-remap errors, and the stack's own state per node: driver version, upgrade state, validations.").
		WithVariable(labelVariable("node", "Hostname", gpuUtil, "", true))

	d = d.WithRow(dashboard.NewRowBuilder("Fleet").Id(i.id())).
		WithPanel(single(&i, "GPU nodes", "Nodes whose DCGM exporter reports at least one GPU.", "none", 4, 4,
			query("A", fmt.Sprintf("count(count by (Hostname) (%s{%s}))", gpuUtil, dcgm), ""))).
		WithPanel(single(&i, "GPUs", "GPUs the DCGM exporters report.", "none", 4, 4,
			query("A", fmt.Sprintf("count(%s{%s})", gpuUtil, dcgm), ""))).
		WithPanel(single(&i, "Mean GPU utilisation", "Mean over all GPUs.", "percent", 4, 4,
			query("A", fmt.Sprintf("avg(%s{%s})", gpuUtil, dcgm), "")).
			Min(0).Max(100)).
		WithPanel(single(&i, "Xid errors", "Xid errors over the dashboard's time range, all tiers (DCGM_EXP_XID_ERRORS_COUNT).", "none", 4, 4,
			query("A", fmt.Sprintf("sum(increase(%s{%s}[$__range])) or vector(0)", xidCount, dcgm), "")).
			Thresholds(thresholds(step(1, "orange")))).
		WithPanel(single(&i, "Nodes with a validation not ready", "Nodes where at least one operand's validation has not passed.", "none", 4, 4,
			query("A", fmt.Sprintf("count(max by (node) (%s{%s} == 0)) or vector(0)", validationReady, stack), "")).
			Thresholds(thresholds(step(1, "red")))).
		WithPanel(single(&i, "Nodes upgrade-failed", "Nodes whose driver change failed (nvidia.com/gpu-driver-upgrade-state=upgrade-failed).", "none", 4, 4,
			query("A", fmt.Sprintf(`sum(%s{%s, state="upgrade-failed"}) or vector(0)`, upgradeState, stack), "")).
			Thresholds(thresholds(step(1, "red"))))

	d = d.WithRow(dashboard.NewRowBuilder("Utilisation").Id(i.id())).
		WithPanel(series(&i, "GPU utilisation by node", "Mean utilisation of each node's GPUs.", "percent", 12, 8,
			query("A", fmt.Sprintf("avg by (Hostname) (%s{%s})", gpuUtil, dcgm), "{{Hostname}}")).Min(0).Max(100)).
		WithPanel(series(&i, "GPU memory used by node", "Framebuffer used over framebuffer total, all GPUs of each node.", "percentunit", 12, 8,
			query("A", fmt.Sprintf("sum by (Hostname) (%[1]s{%[3]s}) / sum by (Hostname) (%[1]s{%[3]s} + %[2]s{%[3]s})", fbUsed, fbFree, dcgm), "{{Hostname}}")).
			Min(0).Max(1)).
		WithPanel(series(&i, "Hottest GPU by node", "The highest GPU temperature of each node.", "celsius", 12, 8,
			query("A", fmt.Sprintf("max by (Hostname) (%s{%s})", gpuTemp, dcgm), "{{Hostname}}"))).
		WithPanel(series(&i, "Power by node", "Power drawn by all GPUs of each node.", "watt", 12, 8,
			query("A", fmt.Sprintf("sum by (Hostname) (%s{%s})", powerUsage, dcgm), "{{Hostname}}")).Min(0))

	d = d.WithRow(dashboard.NewRowBuilder("GPU health").Id(i.id())).
		WithPanel(events(&i, "Xid errors", "New Xid errors per node and Xid, from the exporter's counter "+
			"DCGM_EXP_XID_ERRORS_COUNT (a repeated Xid counts again). See docs/gpu-health.md for the Xid tiers.", 12, 8,
			query("A", fmt.Sprintf("sum by (Hostname, xid) (increase(%s{%s}[$__rate_interval])) > 0", xidCount, dcgm), "{{Hostname}} Xid {{xid}}"))).
		WithPanel(events(&i, "ECC double-bit errors", "New uncorrectable (double-bit) ECC errors per node.", 12, 8,
			query("A", fmt.Sprintf("sum by (Hostname) (increase(%s{%s}[$__rate_interval])) > 0", eccDBE, dcgm), "{{Hostname}}"))).
		WithPanel(events(&i, "NVLink errors", "New NVLink CRC, replay and recovery errors per node.", 12, 8,
			query("A", fmt.Sprintf("sum by (Hostname) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkCRCFlit, dcgm), "{{Hostname}} CRC flit"),
			query("B", fmt.Sprintf("sum by (Hostname) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkCRCData, dcgm), "{{Hostname}} CRC data"),
			query("C", fmt.Sprintf("sum by (Hostname) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkReplay, dcgm), "{{Hostname}} replay"),
			query("D", fmt.Sprintf("sum by (Hostname) (increase(%s{%s}[$__rate_interval])) > 0", nvlinkRecovery, dcgm), "{{Hostname}} recovery"))).
		WithPanel(series(&i, "Throttling", "Share of time each node's most throttled GPU was held back by its power or "+
			"thermal limit (DCGM violation counters, microseconds).", "percentunit", 12, 8,
			query("A", fmt.Sprintf("max by (Hostname) (rate(%s{%s}[$__rate_interval])) / 1e6", powerViolation, dcgm), "{{Hostname}} power"),
			query("B", fmt.Sprintf("max by (Hostname) (rate(%s{%s}[$__rate_interval])) / 1e6", thermalViolation, dcgm), "{{Hostname}} thermal")).
			Min(0)).
		WithPanel(grid(&i, "GPUs with row remapping pending or failed", "A pending remap needs a GPU reset; a failed one "+
			"means the GPU should be replaced.", 24, 6,
			tableQuery("A", fmt.Sprintf("max by (Hostname, gpu) (%s{%s}) > 0", rowRemapPending, dcgm)),
			tableQuery("B", fmt.Sprintf("max by (Hostname, gpu) (%s{%s}) > 0", rowRemapFailure, dcgm))).
			WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
			WithTransformation(organize([]string{"Time"}, map[string]string{"Hostname": "Node", "gpu": "GPU",
				"Value #A": "Remap pending", "Value #B": "Remap failed"})))

	// the recorded series have no node: these panels show the whole fleet whatever $node says
	d = d.WithRow(dashboard.NewRowBuilder("GPU allocation and waste").Id(i.id())).
		WithPanel(series(&i, "GPUs held by pods, by namespace", "GPUs the DCGM exporter maps to a pod (held through the "+
			"device plugin), per namespace, for the whole fleet.", "none", 12, 8,
			query("A", fmt.Sprintf("sum by (namespace) (%s)", gpusAllocated), "{{namespace}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).Min(0)).
		WithPanel(series(&i, "Held GPUs idle, by namespace", "GPUs held by a pod whose utilisation is below "+
			"monitoring.prometheusRule.idleGPU.utilizationBelow: no other workload can use them (GPUAllocatedIdle fires "+
			"after idleGPU.for).", "none", 12, 8,
			query("A", fmt.Sprintf("sum by (namespace) (%s)", gpusIdle), "{{namespace}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).Min(0)).
		WithPanel(grid(&i, "GPU-hours by workload", "GPU-hours each workload held over the dashboard's time range, and "+
			"how many of them idle (from the hourly recorded GPU-hours).", 24, 8,
			tableQuery("A", fmt.Sprintf("sum by (namespace, workload) (sum_over_time(%s[$__range:1h]))", gpuHours)),
			tableQuery("B", fmt.Sprintf("sum by (namespace, workload) (sum_over_time(%s[$__range:1h]))", idleGPUHours))).
			WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}}).
			WithTransformation(organize([]string{"Time"}, map[string]string{"namespace": "Namespace", "workload": "Workload",
				"Value #A": "GPU-hours", "Value #B": "Idle GPU-hours"})))

	d = d.WithRow(dashboard.NewRowBuilder("Driver and validation").Id(i.id())).
		WithPanel(series(&i, "Nodes per driver upgrade state", "How many nodes are in each state of "+
			"nvidia.com/gpu-driver-upgrade-state: a rollout moves nodes from upgrade-required to upgrade-done.", "none", 12, 8,
			query("A", fmt.Sprintf("sum by (state) (%s{%s})", upgradeState, stack), "{{state}}")).
			Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).Min(0)).
		WithPanel(grid(&i, "Nodes in a driver change", "Nodes not upgrade-done, with the time they have been in their state.", 12, 8,
			tableQuery("A", fmt.Sprintf(`max by (node, state) (%s{%s, state!="upgrade-done"} == 1)`, upgradeState, stack)),
			tableQuery("B", fmt.Sprintf("max by (node) (%s{%s})", upgradeStateSecs, stack))).
			Unit("s").
			WithTransformation(dashboard.DataTransformerConfig{Id: "joinByField", Options: map[string]any{"byField": "node", "mode": "inner"}}).
			WithTransformation(organize([]string{"Time", "Time 1", "Time 2", "Value #A"},
				map[string]string{"node": "Node", "state": "State", "Value #B": "Time in state"}))).
		WithPanel(grid(&i, "Driver per node", "The loaded driver version (from gpu-feature-discovery) and the config "+
			"digest of the node's driver (recorded by the driver manager).", 12, 8,
			tableQuery("A", fmt.Sprintf("max by (node, version, config_digest) (%s{%s})", driverInfo, stack))).
			WithTransformation(organize([]string{"Time", "Value"},
				map[string]string{"node": "Node", "version": "Driver version", "config_digest": "Config digest"}))).
		WithPanel(grid(&i, "Validations not ready", "Each operand validation that has not passed on a node (its status "+
			"file is missing): the node's operands that wait on it do not start.", 12, 8,
			tableQuery("A", fmt.Sprintf("max by (node, component) (%s{%s} == 0)", validationReady, stack))).
			WithTransformation(organize([]string{"Time", "Value"}, map[string]string{"node": "Node", "component": "Validation"})))
	return d
}
