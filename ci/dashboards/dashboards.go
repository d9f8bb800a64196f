package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

// The DCGM exporter's metrics the panels read: standard DCGM fields, and the exporter's own Xid counter (never
// DCGM_FI_DEV_XID_ERRORS, a gauge holding the last Xid, which a repeated Xid does not move). The chart's DCGM
// metrics profile must enable each one.
const (
	gpuUtil          = "DCGM_FI_DEV_GPU_UTIL"
	fbUsed           = "DCGM_FI_DEV_FB_USED"
	fbFree           = "DCGM_FI_DEV_FB_FREE"
	gpuTemp          = "DCGM_FI_DEV_GPU_TEMP"
	powerUsage       = "DCGM_FI_DEV_POWER_USAGE"
	eccDBE           = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
	nvlinkCRCFlit    = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
	nvlinkCRCData    = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
	nvlinkReplay     = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
	nvlinkRecovery   = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
	rowRemapFailure  = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
	rowRemapPending  = "DCGM_FI_DEV_ROW_REMAP_PENDING"
	powerViolation   = "DCGM_FI_DEV_POWER_VIOLATION"
	thermalViolation = "DCGM_FI_DEV_THERMAL_VIOLATION"
	xidCount         = "DCGM_EXP_XID_ERRORS_COUNT"
)

// DCGMMetrics are the DCGM exporter metrics the dashboards use, sorted.
func DCGMMetrics() []string {
	m := []string{gpuUtil, fbUsed, fbFree, gpuTemp, powerUsage, eccDBE, nvlinkCRCFlit, nvlinkCRCData, nvlinkReplay,
		nvlinkRecovery, rowRemapFailure, rowRemapPending, powerViolation, thermalViolation, xidCount}
	slices.Sort(m)
	return m
}

// The chart's recording rules the panels read (monitoring.prometheusRule, group kube-gpu-stack.gpu-usage): GPUs
// held by pods, and those idle, per namespace and workload, and GPU-hours of each hour. tests/monitoring checks that
// the rendered rules record them.
const (
	gpusAllocated = "namespace_workload:kube_gpu_stack_gpus_allocated:count"
	gpusIdle      = "namespace_workload:kube_gpu_stack_gpus_idle:count"
	gpuHours      = "namespace_workload:kube_gpu_stack_gpu_hours:1h"
	idleGPUHours  = "namespace_workload:kube_gpu_stack_idle_gpu_hours:1h"
)

// RecordedSeries are the recorded series the dashboards use.
func RecordedSeries() []string { return []string{gpusAllocated, gpusIdle, gpuHours, idleGPUHours} }

// The stack's own metrics (the node status exporter's).
const (
	validationReady   = validation.MetricValidationReady
	upgradeState      = validation.MetricUpgradeState
	upgradeStateSecs  = validation.MetricUpgradeStateSeconds
	driverInfo        = validation.MetricDriverInfo
	datasourceVarName = "datasource"
)

// datasource is every panel's and query's datasource: the dashboard variable, so the dashboards work with any
// Prometheus without editing.
var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${" + datasourceVarName + "}")}

// File is one generated dashboard: its file name under the chart's dashboards/ and its definition.
type File struct {
	Name      string
	Dashboard *dashboard.DashboardBuilder
}

// Files are the chart's dashboards.
func Files() []File {
	return []File{
		{Name: "gpu-fleet-overview.json", Dashboard: fleetOverview()},
		{Name: "gpu-node.json", Dashboard: gpuNode()},
	}
}

// Render returns a dashboard's file content: indented JSON ending in a newline (byte-for-byte reproducible:
// structs marshal in field order, maps sorted).
func Render(b *dashboard.DashboardBuilder) ([]byte, error) {
	d, err := b.Build()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes every dashboard into dir and removes any other .json file there, so a dashboard dropped from
// Files does not linger in the chart.
func Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, f := range Files() {
		b, err := Render(f.Dashboard)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name), b, 0o644); err != nil {
			return err
		}
		keep[f.Name] = true
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return err
	}
	for _, p := range old {
		if !keep[filepath.Base(p)] {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// ids numbers the panels of one dashboard (rows included) from 1, in the order they are added.
type ids struct{ next uint32 }

func (i *ids) id() uint32 { i.next++; return i.next }

// query is one PromQL target; legend may be empty.
func query(ref, expr, legend string) *prometheus.DataqueryBuilder {
	q := prometheus.NewDataqueryBuilder().RefId(ref).Expr(expr).Datasource(datasource)
	if legend != "" {
		q = q.LegendFormat(legend)
	}
	return q
}

// tableQuery is an instant query shown as a table (one row per series).
func tableQuery(ref, expr string) *prometheus.DataqueryBuilder {
	return query(ref, expr, "").Instant().Format(prometheus.PromQueryFormatTable)
}

func targets(qs ...*prometheus.DataqueryBuilder) []cog.Builder[variants.Dataquery] {
	out := make([]cog.Builder[variants.Dataquery], 0, len(qs))
	for _, q := range qs {
		out = append(out, q)
	}
	return out
}

func series(i *ids, title, description, unit string, w, h uint32, qs ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	return timeseries.NewPanelBuilder().Id(i.id()).Title(title).Description(description).Unit(unit).
		Datasource(datasource).Targets(targets(qs...)).Span(w).Height(h).
		FillOpacity(10).ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).Calcs([]string{"max", "lastNotNull"}))
}

// events is a bar chart of counts per interval (Xid, ECC, NVLink errors): zero is the healthy line.
func events(i *ids, title, description string, w, h uint32, qs ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	return series(i, title, description, "short", w, h, qs...).DrawStyle(common.GraphDrawStyleBars).FillOpacity(80).Min(0)
}

func single(i *ids, title, description, unit string, w, h uint32, q *prometheus.DataqueryBuilder) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Id(i.id()).Title(title).Description(description).Unit(unit).
		Datasource(datasource).Targets(targets(q)).Span(w).Height(h).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		GraphMode(common.BigValueGraphModeNone)
}

// thresholds colours a value green below each step's value and the step's colour from it on.
func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).
		Steps(append([]dashboard.Threshold{{Value: nil, Color: "green"}}, steps...))
}

func step(v float64, color string) dashboard.Threshold {
	return dashboard.Threshold{Value: &v, Color: color}
}

func grid(i *ids, title, description string, w, h uint32, qs ...*prometheus.DataqueryBuilder) *table.PanelBuilder {
	return table.NewPanelBuilder().Id(i.id()).Title(title).Description(description).
		Datasource(datasource).Targets(targets(qs...)).Span(w).Height(h)
}

// organize drops the columns an instant table query carries but nobody reads, and renames the rest.
func organize(exclude []string, rename map[string]string) dashboard.DataTransformerConfig {
	ex := map[string]any{}
	for _, c := range exclude {
		ex[c] = true
	}
	return dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{"excludeByName": ex, "renameByName": rename}}
}

// readyMapping shows 1/0 gauges as ready / not ready.
func readyMapping() []dashboard.ValueMapping {
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText,
		Options: map[string]dashboard.ValueMappingResult{
			"0": {Text: cog.ToPtr("not ready"), Color: cog.ToPtr("red"), Index: cog.ToPtr[int32](0)},
			"1": {Text: cog.ToPtr("ready"), Color: cog.ToPtr("green"), Index: cog.ToPtr[int32](1)},
		}}}}
}

func datasourceVariable() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder(datasourceVarName).Label("Data source").Type("prometheus")
}

// labelVariable offers the values of label on metric (filtered by the PromQL selector sel, may be empty).
func labelVariable(name, label, metric, sel string, multi bool) *dashboard.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s%s, %s)", metric, sel, label)
	v := dashboard.NewQueryVariableBuilder(name).Label(name).Datasource(datasource).
		Query(dashboard.StringOrMap{Map: map[string]any{"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"}}).
		Definition(q).Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc)
	if multi {
		v = v.Multi(true).IncludeAll(true).AllValue(".*")
	}
	return v
}

func base(uid, title, description string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).Uid(uid).Description(description).
		Tags([]string{"kube-gpu-stack", "gpu", "nvidia"}).Editable().Refresh("1m").Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(datasourceVariable())
}
