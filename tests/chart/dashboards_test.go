package chart

// The chart's dashboard ConfigMaps (templates/dashboards.yaml), rendered and checked against the dashboard files the
// chart ships.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// dashboardConfigMaps renders the chart with set and returns its dashboard ConfigMaps, and the whole stream.
func dashboardConfigMaps(t *testing.T, set ...string) ([]corev1.ConfigMap, string) {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartrender.Values(nil, set)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := chartrender.Render(t.Context(), chrt, vals, newestKube)
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.ConfigMap
	for _, doc := range strings.Split(stream, "\n---\n") {
		if !strings.Contains(doc, "# Source: kube-gpu-stack/templates/dashboards.yaml") {
			continue
		}
		var cm corev1.ConfigMap
		// the separator took the document's last newline
		if err := yaml.UnmarshalStrict([]byte(doc+"\n"), &cm); err != nil {
			t.Fatalf("dashboard ConfigMap does not parse: %v\n%.400s", err, doc)
		}
		out = append(out, cm)
	}
	return out, stream
}

// Enabled: one ConfigMap per shipped dashboard file, carrying the sidecar's label and the configured annotations,
// holding the file byte for byte under its own name.
func TestDashboardConfigMapsRenderWithTheSidecarLabel(t *testing.T) {
	t.Parallel()
	cms, _ := dashboardConfigMaps(t, "monitoring.dashboards.enabled=true", "monitoring.dashboards.label=my_dashboards",
		"monitoring.dashboards.labelValue=yes", "monitoring.dashboards.annotations.grafana_folder=GPUs")
	files, _ := filepath.Glob(filepath.Join(chartrender.ChartDir(), "dashboards", "*.json"))
	if len(files) == 0 || len(cms) != len(files) {
		t.Fatalf("%d dashboard ConfigMaps for %d dashboard files", len(cms), len(files))
	}
	var names []string
	for _, cm := range cms {
		names = append(names, cm.Name)
		if cm.Kind != "ConfigMap" || cm.Namespace != chartrender.Namespace {
			t.Errorf("%s: kind %q namespace %q", cm.Name, cm.Kind, cm.Namespace)
		}
		if cm.Labels["my_dashboards"] != "yes" {
			t.Errorf("%s: labels %v lack my_dashboards=yes", cm.Name, cm.Labels)
		}
		if cm.Annotations["grafana_folder"] != "GPUs" {
			t.Errorf("%s: annotations %v lack grafana_folder=GPUs", cm.Name, cm.Annotations)
		}
		if len(cm.Data) != 1 {
			t.Errorf("%s holds %d keys, want one dashboard", cm.Name, len(cm.Data))
		}
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, cm := range cms {
			if got, ok := cm.Data[filepath.Base(f)]; ok {
				found = true
				if got != string(want) {
					t.Errorf("%s: %s differs from the shipped file (%d bytes, want %d)", cm.Name, filepath.Base(f), len(got), len(want))
				}
			}
		}
		if !found {
			t.Errorf("no ConfigMap holds %s", filepath.Base(f))
		}
	}
	if slices.Sort(names); len(slices.Compact(names)) != len(files) {
		t.Errorf("ConfigMap names repeat: %v", names)
	}
}

// The defaults: the sidecar label of kube-prometheus-stack, no annotations; the same render twice is the same.
func TestDashboardConfigMapsDefaults(t *testing.T) {
	t.Parallel()
	cms, stream := dashboardConfigMaps(t, "monitoring.dashboards.enabled=true")
	if len(cms) == 0 {
		t.Fatal("no dashboard ConfigMaps")
	}
	for _, cm := range cms {
		if cm.Labels["grafana_dashboard"] != "1" || len(cm.Annotations) != 0 {
			t.Errorf("%s: labels %v annotations %v, want grafana_dashboard=1 and none", cm.Name, cm.Labels, cm.Annotations)
		}
	}
	if _, again := dashboardConfigMaps(t, "monitoring.dashboards.enabled=true"); again != stream {
		t.Error("two renders of the same values differ")
	}
}

// Disabled (the default): no dashboard ConfigMaps.
func TestNoDashboardConfigMapsWhenDisabled(t *testing.T) {
	t.Parallel()
	if cms, _ := dashboardConfigMaps(t); len(cms) != 0 {
		t.Fatalf("%d dashboard ConfigMaps with monitoring.dashboards.enabled=false", len(cms))
	}
}
