package chart

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// leftOut names, in the release notes and in a refusal, each monitoring object the monitoring profile asks for.
var leftOut = []string{"dcgmExporter.serviceMonitor.enabled", "nodeStatusExporter.serviceMonitor.enabled", "monitoring.prometheusRule.enabled"}

// dryRunMonitoring installs (dry run) the monitoring profile, plus set, against an API server that serves
// apiVersions beyond the built-in ones.
func dryRunMonitoring(t *testing.T, apiVersions []string, set ...string) (manifest, notes string, err error) {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartrender.Values([]string{filepath.Join(chartrender.RepoRoot(), "values", "monitoring.yaml")}, set)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := chartrender.DryRun(context.Background(), chrt, vals, chartrender.Newest, apiVersions)
	if err != nil {
		return "", "", err
	}
	return rel.Manifest, rel.Info.Notes, nil
}

// The monitoring profile on a cluster without the Prometheus Operator rendered no ServiceMonitor and no
// PrometheusRule, and nothing said so: the install succeeded and Prometheus never scraped the stack. Now the
// release notes name each object left out (warn, the default), or the render fails naming them (fail).
func TestMonitoringWithoutThePrometheusOperatorSaysWhatIsLeftOut(t *testing.T) {
	t.Run("warn", func(t *testing.T) {
		manifest, notes, err := dryRunMonitoring(t, nil)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(manifest, "kind: ServiceMonitor") || strings.Contains(manifest, "kind: PrometheusRule") {
			t.Fatal("a monitoring.coreos.com object rendered for an API server that does not serve the API")
		}
		if !strings.Contains(notes, "WARNING: the values ask for monitoring") {
			t.Fatalf("notes without the warning:\n%s", notes)
		}
		for _, key := range leftOut {
			if !strings.Contains(notes, key) {
				t.Errorf("the notes' warning does not name %s:\n%s", key, notes)
			}
		}
	})
	t.Run("fail", func(t *testing.T) {
		_, _, err := dryRunMonitoring(t, nil, "monitoring.whenPrometheusOperatorAbsent=fail")
		if err == nil {
			t.Fatal("the render succeeded; want it refused")
		}
		for _, key := range append(leftOut, "monitoring.whenPrometheusOperatorAbsent=fail") {
			if !strings.Contains(err.Error(), key) {
				t.Errorf("the refusal does not name %s: %v", key, err)
			}
		}
	})
	t.Run("only what is asked for", func(t *testing.T) {
		_, notes, err := dryRunMonitoring(t, nil, "monitoring.prometheusRule.enabled=false", "nodeStatusExporter.enabled=false")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(notes, leftOut[0]) || strings.Contains(notes, leftOut[1]) || strings.Contains(notes, leftOut[2]) {
			t.Fatalf("want the warning to name the DCGM exporter's ServiceMonitor alone:\n%s", notes)
		}
	})
	t.Run("served", func(t *testing.T) {
		manifest, notes, err := dryRunMonitoring(t, chartrender.APIVersions, "monitoring.whenPrometheusOperatorAbsent=fail")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(manifest, "kind: ServiceMonitor") != 2 || !strings.Contains(manifest, "kind: PrometheusRule") {
			t.Fatal("the monitoring objects did not render where the API is served")
		}
		if strings.Contains(notes, "WARNING") {
			t.Fatalf("a warning where the API is served:\n%s", notes)
		}
	})
	t.Run("not asked for", func(t *testing.T) {
		chrt, err := chartrender.Load(chartrender.ChartDir())
		if err != nil {
			t.Fatal(err)
		}
		rel, err := chartrender.DryRun(context.Background(), chrt, map[string]any{}, chartrender.Newest, nil)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(rel.Info.Notes, "WARNING") {
			t.Fatalf("a warning with the default values, which ask for no monitoring:\n%s", rel.Info.Notes)
		}
	})
}
