// Package monitoring tests the chart's alerts against Prometheus' own tools: the PrometheusRule rendered with
// values/monitoring.yaml must pass promtool's rule unit tests (tests/monitoring/testdata), and every PromQL
// expression the chart ships, in rules and dashboards, must parse and select only metrics that an exporter the chart
// configures emits. promtool and the checker come from the separate module ci/prometheus (ci/build-prometheus.sh).
package monitoring

import (
	"bytes"
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// ownMetrics are the series the stack's own node status exporter serves, as its code names them (ownmetrics).
func ownMetrics(t *testing.T) []string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "run", "./ownmetrics")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run ./ownmetrics: %v\n%s", err, stderr.String())
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		t.Fatal("ownmetrics names no metrics")
	}
	return names
}

// prometheusMetrics are the series Prometheus itself writes for every scrape target.
var prometheusMetrics = []string{"up"}

// healthCSV is the ConfigMap key the DCGM exporter reads its collectors from.
const healthCSV = "dcgm-metrics.csv"

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// tools builds (or reuses) promtool and promcheck once per test binary and returns their folder.
func tools(t *testing.T) string {
	t.Helper()
	toolsOnce.Do(func() {
		cmd := exec.Command(filepath.Join(chartrender.RepoRoot(), "ci", "build-prometheus.sh"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			toolsErr = err
			toolsDir = stderr.String()
			return
		}
		toolsDir = strings.TrimSpace(string(out))
	})
	if toolsErr != nil {
		t.Fatalf("ci/build-prometheus.sh: %v\n%s", toolsErr, toolsDir)
	}
	return toolsDir
}

// rendered is what the monitoring profile renders that the checks need.
type rendered struct {
	rules   map[string]any   // the PrometheusRule's spec (groups)
	csv     string           // the DCGM exporter's collectors CSV
	objects []map[string]any // every object
}

var profile = filepath.Join(chartrender.RepoRoot(), "values", "monitoring.yaml")

func render(t *testing.T, files []string, set ...string) rendered {
	t.Helper()
	stream, err := chartrender.RenderRepo(t.Context(), files, set)
	if err != nil {
		t.Fatalf("render %v %v: %v", files, set, err)
	}
	var r rendered
	for _, doc := range strings.Split(stream, "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(doc), "---")), &o); err != nil {
			t.Fatal(err)
		}
		if o == nil {
			continue
		}
		r.objects = append(r.objects, o)
		switch o["kind"] {
		case "PrometheusRule":
			if r.rules != nil {
				t.Fatal("more than one PrometheusRule rendered")
			}
			r.rules, _ = o["spec"].(map[string]any)
		case "ConfigMap":
			data, _ := o["data"].(map[string]any)
			if s, ok := data[healthCSV].(string); ok {
				r.csv = s
			}
		}
	}
	return r
}

// alert is one alerting rule as rendered.
type alert struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func (r rendered) alerts(t *testing.T) []alert {
	t.Helper()
	b, err := yaml.Marshal(r.rules)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Groups []struct {
			Rules []alert `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	var out []alert
	for _, g := range spec.Groups {
		for _, a := range g.Rules {
			if a.Alert != "" { // not a recording rule
				out = append(out, a)
			}
		}
	}
	return out
}

// writeRules writes the PrometheusRule's groups as a plain Prometheus rules file.
func (r rendered) writeRules(t *testing.T, path string) {
	t.Helper()
	if r.rules == nil {
		t.Fatal("the monitoring profile renders no PrometheusRule")
	}
	b, err := yaml.Marshal(r.rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// csvMetrics are the metric names a dcgm-exporter collectors CSV emits, read as the exporter reads it.
func csvMetrics(t *testing.T, data string) []string {
	t.Helper()
	r := csv.NewReader(strings.NewReader(data))
	r.Comment = '#'
	records, err := r.ReadAll()
	if err != nil {
		t.Fatalf("collectors CSV: %v", err)
	}
	var out []string
	for _, rec := range records {
		if len(rec) != 3 {
			t.Fatalf("collectors CSV: %q has %d fields, the exporter wants 3", rec, len(rec))
		}
		// label rows become labels of the other metrics, not metrics
		if strings.TrimSpace(rec[1]) != "label" {
			out = append(out, strings.TrimSpace(rec[0]))
		}
	}
	return out
}

func run(t *testing.T, dir, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAlertRuleUnitTests runs promtool's rule unit tests on the rendered rules: every alert fires on the series
// that should fire it and stays silent on those that should not.
func TestAlertRuleUnitTests(t *testing.T) {
	bin := tools(t)
	r := render(t, []string{profile})
	dir := t.TempDir()
	r.writeRules(t, filepath.Join(dir, "rules.yaml"))
	if out, err := run(t, dir, filepath.Join(bin, "promtool"), "check", "rules", "rules.yaml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	tests, err := filepath.Glob(filepath.Join("testdata", "*.test.yaml"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no rule unit tests in tests/monitoring/testdata: %v", err)
	}
	args := []string{"test", "rules"}
	for _, f := range tests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, filepath.Base(f))
	}
	out, err := run(t, dir, filepath.Join(bin, "promtool"), args...)
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Log(out)
}

// TestEveryAlertIsUnitTested: each rendered alert has a unit test where it fires and one where it stays silent, so
// a new alert cannot ship untested.
func TestEveryAlertIsUnitTested(t *testing.T) {
	r := render(t, []string{profile})
	fires, silent := map[string]bool{}, map[string]bool{}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.test.yaml"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string `json:"alertname"`
					ExpAlerts []any  `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range doc.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
	}
	alerts := r.alerts(t)
	if len(alerts) == 0 {
		t.Fatal("no alerts rendered")
	}
	for _, a := range alerts {
		if !fires[a.Alert] {
			t.Errorf("alert %s has no unit test in which it fires", a.Alert)
		}
		if !silent[a.Alert] {
			t.Errorf("alert %s has no unit test in which it stays silent", a.Alert)
		}
	}
}

// TestAlertsCarrySeverityAndRunbook: every alert has a severity and a runbook_url pointing at its own section of
// docs/monitoring.md, and that section exists.
func TestAlertsCarrySeverityAndRunbook(t *testing.T) {
	r := render(t, []string{profile})
	readme, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if h, ok := strings.CutPrefix(line, "#### "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	const base = "https://github.com/kube-gpu-stack/kube-gpu-stack/blob/main/docs/monitoring.md#"
	for _, a := range r.alerts(t) {
		if !slices.Contains([]string{"critical", "warning", "info"}, a.Labels["severity"]) {
			t.Errorf("%s: severity %q, want critical, warning or info", a.Alert, a.Labels["severity"])
		}
		anchor, ok := strings.CutPrefix(a.Annotations["runbook_url"], base)
		if !ok || anchor != strings.ToLower(a.Alert) {
			t.Errorf("%s: runbook_url %q, want %s%s", a.Alert, a.Annotations["runbook_url"], base, strings.ToLower(a.Alert))
		}
		if !anchors[anchor] {
			t.Errorf("%s: docs/monitoring.md has no runbook heading \"#### %s\"", a.Alert, a.Alert)
		}
		if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
			t.Errorf("%s: needs a summary and a description", a.Alert)
		}
	}
}

// TestXidTiersFollowHealthPolicy: the Xid alerts take their tiers from global.health.xids, and only the fatal tier
// pages.
func TestXidTiersFollowHealthPolicy(t *testing.T) {
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("global: {health: {xids: {fatal: [31, 79], application: []}}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := render(t, []string{profile, policy})
	got := map[string]alert{}
	for _, a := range r.alerts(t) {
		got[a.Alert] = a
	}
	if e := got["GPUXidFatal"].Expr; !strings.Contains(e, `xid=~"31|79"`) {
		t.Errorf("GPUXidFatal does not follow global.health.xids.fatal: %s", e)
	}
	if _, ok := got["GPUXidApplication"]; ok {
		t.Error("GPUXidApplication rendered with an empty application tier")
	}
	if e := got["GPUXid"].Expr; !strings.Contains(e, `xid!~"31|79"`) {
		t.Errorf("GPUXid does not leave out the tiers: %s", e)
	}
	for name, a := range got {
		if a.Labels["severity"] == "critical" && strings.Contains(a.Expr, "DCGM_EXP_XID_ERRORS_COUNT") &&
			name != "GPUXidFatal" && name != "GPUFellOffBus" {
			t.Errorf("%s pages on Xids outside the fatal tier", name)
		}
	}
}

// knownMetrics writes the metrics some rendered exporter config emits: the DCGM exporter's from the CSV the chart
// renders, the stack's own, and Prometheus' per-target series.
func knownMetrics(t *testing.T, path, csvData string, drop ...string) {
	t.Helper()
	if csvData == "" {
		t.Fatal("the monitoring profile renders no DCGM exporter collectors CSV")
	}
	names := slices.Concat(csvMetrics(t, csvData), ownMetrics(t), prometheusMetrics)
	names = slices.DeleteFunc(names, func(n string) bool { return slices.Contains(drop, n) })
	if err := os.WriteFile(path, []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dashboards are the Grafana dashboards the chart ships.
func dashboards(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartrender.ChartDir(), "dashboards", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func promcheck(t *testing.T, dir, metrics, rules string) (string, error) {
	t.Helper()
	args := []string{"-metrics", metrics, "-rules", rules}
	for _, d := range dashboards(t) {
		args = append(args, "-dashboard", d)
	}
	return run(t, dir, filepath.Join(tools(t), "promcheck"), args...)
}

// TestPromQLSelectsEmittedMetrics: every expression of the rules and of every dashboard panel parses and selects
// only metrics an exporter the chart configures emits.
func TestPromQLSelectsEmittedMetrics(t *testing.T) {
	r := render(t, []string{profile})
	dir := t.TempDir()
	r.writeRules(t, filepath.Join(dir, "rules.yaml"))
	knownMetrics(t, filepath.Join(dir, "metrics.txt"), r.csv)
	out, err := promcheck(t, dir, "metrics.txt", "rules.yaml")
	if err != nil {
		t.Fatalf("promcheck: %v\n%s", err, out)
	}
	t.Log(out)
}

// TestPromQLCheckCatchesUnknownMetrics is the check's control: a rule on a metric no exporter emits, and a rule on a
// health counter the rendered CSV leaves out, must both fail it.
func TestPromQLCheckCatchesUnknownMetrics(t *testing.T) {
	r := render(t, []string{profile})
	dir := t.TempDir()
	r.writeRules(t, filepath.Join(dir, "rules.yaml"))

	// a rule on a metric nobody emits
	groups, _ := r.rules["groups"].([]any)
	extra := map[string]any{"name": "control", "rules": []any{map[string]any{
		"alert": "Control", "expr": "DCGM_FI_DEV_NOT_EMITTED > 0"}}}
	b, err := yaml.Marshal(map[string]any{"groups": append(slices.Clone(groups), extra)})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "unknown.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	knownMetrics(t, filepath.Join(dir, "metrics.txt"), r.csv)
	out, err := promcheck(t, dir, "metrics.txt", "unknown.yaml")
	if err == nil || !strings.Contains(out, "DCGM_FI_DEV_NOT_EMITTED") {
		t.Errorf("promcheck passed a rule on an unknown metric (err %v):\n%s", err, out)
	}

	// the Xid count left out of the exporter's CSV: the Xid alerts select a metric nothing emits
	knownMetrics(t, filepath.Join(dir, "no-xid.txt"), r.csv, "DCGM_EXP_XID_ERRORS_COUNT")
	out, err = promcheck(t, dir, "no-xid.txt", "rules.yaml")
	if err == nil || !strings.Contains(out, "GPUXidFatal") {
		t.Errorf("promcheck passed the Xid alerts without DCGM_EXP_XID_ERRORS_COUNT in the CSV (err %v):\n%s", err, out)
	}

	// an expression that does not parse
	bad := map[string]any{"name": "control", "rules": []any{map[string]any{"alert": "Control", "expr": "rate(up[5m]"}}}
	b, _ = yaml.Marshal(map[string]any{"groups": []any{bad}})
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := promcheck(t, dir, "metrics.txt", "bad.yaml"); err == nil {
		t.Errorf("promcheck passed an expression that does not parse:\n%s", out)
	}
}

// TestHealthProfileKeepsDashboardMetrics: the health profile adds to the exporter's default metrics and drops none
// (utilisation, memory, temperature and power feed the dashboards), and carries the counters the alerts read.
func TestHealthProfileKeepsDashboardMetrics(t *testing.T) {
	r := render(t, []string{profile})
	got := csvMetrics(t, r.csv)
	for _, m := range []string{
		"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
		"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
		"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
		"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
		"DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
		"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
		"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
	} {
		if !slices.Contains(got, m) {
			t.Errorf("the health metrics profile lacks %s", m)
		}
	}
	for _, o := range r.objects {
		if o["kind"] != "DaemonSet" || !strings.Contains(yamlString(t, o), "nvidia-dcgm-exporter-health-metrics") {
			continue
		}
		s := yamlString(t, o)
		for _, want := range []string{"DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "/etc/dcgm-exporter/dcgm-metrics.csv", "checksum/metrics-config"} {
			if !strings.Contains(s, want) {
				t.Errorf("the DCGM exporter DaemonSet with the health profile lacks %s", want)
			}
		}
		return
	}
	t.Error("no DCGM exporter DaemonSet mounts the health profile's ConfigMap")
}

func yamlString(t *testing.T, o map[string]any) string {
	t.Helper()
	b, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMonitoringObjectsNeedTheirAPIs: the ServiceMonitors and the PrometheusRule render only where the API server
// serves their kinds (a cluster without the Prometheus Operator would refuse the whole release otherwise), and
// where it does, the DCGM exporter's targets get the node label the alerts group by.
func TestMonitoringObjectsNeedTheirAPIs(t *testing.T) {
	kinds := func(r rendered) map[string]int {
		out := map[string]int{}
		for _, o := range r.objects {
			if k, _ := o["kind"].(string); k == "ServiceMonitor" || k == "PrometheusRule" {
				out[k]++
			}
		}
		return out
	}
	if got := kinds(render(t, []string{profile})); got["ServiceMonitor"] != 2 || got["PrometheusRule"] != 1 {
		t.Errorf("with the APIs served: %v, want 2 ServiceMonitors and 1 PrometheusRule", got)
	}

	// (a render reads chartrender.APIVersions; the tests of this package do not run in parallel)
	served := chartrender.APIVersions
	t.Cleanup(func() { chartrender.APIVersions = served })
	chartrender.APIVersions = slices.DeleteFunc(slices.Clone(served), func(v string) bool {
		return strings.HasPrefix(v, "monitoring.coreos.com/")
	})
	if got := kinds(render(t, []string{profile})); len(got) != 0 {
		t.Errorf("without the monitoring.coreos.com/v1 APIs the chart still renders %v", got)
	}
	chartrender.APIVersions = served

	for _, o := range render(t, []string{profile}).objects {
		meta, _ := o["metadata"].(map[string]any)
		if o["kind"] == "ServiceMonitor" && meta["name"] == "nvidia-dcgm-exporter" {
			if s := yamlString(t, o); !strings.Contains(s, "__meta_kubernetes_pod_node_name") || !strings.Contains(s, "targetLabel: node") {
				t.Errorf("the DCGM exporter's ServiceMonitor does not label targets with their node:\n%s", s)
			}
		}
	}
}

// TestPromQLCheckReadsDashboards: the checker reads Grafana dashboard JSON, panels nested in rows included, with
// Grafana's variables standing for values, and names a panel that selects an unknown metric.
func TestPromQLCheckReadsDashboards(t *testing.T) {
	r := render(t, []string{profile})
	dir := t.TempDir()
	knownMetrics(t, filepath.Join(dir, "metrics.txt"), r.csv)
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("good.json", `{"panels": [
	  {"id": 1, "title": "utilisation", "targets": [{"expr": "avg by (node) (DCGM_FI_DEV_GPU_UTIL{node=~\"$node\"})"}]},
	  {"id": 2, "type": "row", "panels": [
	    {"id": 3, "title": "xid", "targets": [{"expr": "sum(increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{node=~\"${node:regex}\"}[$__rate_interval]))"}]}]}]}`)
	write("bad.json", `{"panels": [{"id": 1, "type": "row", "panels": [
	    {"id": 7, "title": "nested", "targets": [{"expr": "rate(DCGM_FI_DEV_NOT_EMITTED[$__rate_interval])"}]}]}]}`)
	bin := filepath.Join(tools(t), "promcheck")
	if out, err := run(t, dir, bin, "-metrics", "metrics.txt", "-dashboard", "good.json"); err != nil || !strings.Contains(out, "2 expressions") {
		t.Errorf("promcheck on a good dashboard: %v\n%s", err, out)
	}
	if out, err := run(t, dir, bin, "-metrics", "metrics.txt", "-dashboard", "bad.json"); err == nil || !strings.Contains(out, `panel 7 "nested"`) {
		t.Errorf("promcheck passed a dashboard panel on an unknown metric (err %v):\n%s", err, out)
	}
}

// TestGPUUsageRulesFollowHonorLabels: scraped with honorLabels the DCGM exporter's namespace and pod labels keep
// their names, without it Prometheus renames them exported_*: the usage rules and GPUAllocatedIdle read the ones the
// ServiceMonitor leaves (the unit tests run the default, exported_*).
func TestGPUUsageRulesFollowHonorLabels(t *testing.T) {
	for honor, want := range map[string]string{"true": `DCGM_FI_DEV_GPU_UTIL{pod!=""}`, "false": `DCGM_FI_DEV_GPU_UTIL{exported_pod!=""}`} {
		r := render(t, []string{profile}, "dcgmExporter.serviceMonitor.honorLabels="+honor)
		b, err := yaml.Marshal(r.rules)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range r.alerts(t) {
			if a.Alert == "GPUAllocatedIdle" && !strings.Contains(a.Expr, want) {
				t.Errorf("honorLabels=%s: GPUAllocatedIdle %q, want it to select %s", honor, a.Expr, want)
			}
		}
		if got := strings.Count(string(b), want); got < 3 {
			t.Errorf("honorLabels=%s: %d rules select %s, want the alert and both counts", honor, got, want)
		}
	}
}
