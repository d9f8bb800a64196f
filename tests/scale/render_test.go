package scale

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// profileFiles are the values files of the benchmark's install: the mixed roles, the driver pools and the trim.
func profileFiles() []string {
	root := chartrender.RepoRoot()
	return []string{filepath.Join(root, "values", "mixed.yaml"), filepath.Join(root, "values", "driver-pools.yaml"),
		filepath.Join(root, "tests", "scale", "testdata", "scale.yaml")}
}

// render loads the chart (rendering prunes disabled subcharts from it, so once per render) and renders files for
// the newest Kubernetes.
func render(ctx context.Context, files []string) (string, error) {
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		return "", err
	}
	vals, err := chartrender.Values(files, nil)
	if err != nil {
		return "", err
	}
	return chartrender.Render(ctx, chrt, vals, chartrender.Newest)
}

// BenchmarkRenderLargestProfile renders the profile whose manifest is the longest (load, values and render, as
// `helm template` does).
func BenchmarkRenderLargestProfile(b *testing.B) {
	profiles, err := chartrender.Profiles(chartrender.RepoRoot())
	if err != nil {
		b.Fatal(err)
	}
	var largest []string
	size := 0
	for _, p := range profiles {
		out, err := render(b.Context(), p.Files())
		if err != nil {
			b.Fatalf("%s: %v", p.Name, err)
		}
		if len(out) > size {
			largest, size = p.Files(), len(out)
		}
	}
	b.Logf("largest profile: %s (%d bytes, %d documents)", filepath.Base(largest[0]), size, docs(largest, b))
	b.ResetTimer()
	for b.Loop() {
		if _, err := render(b.Context(), largest); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderAllProfiles renders every profile under values/ once per iteration.
func BenchmarkRenderAllProfiles(b *testing.B) {
	profiles, err := chartrender.Profiles(chartrender.RepoRoot())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		for _, p := range profiles {
			if _, err := render(b.Context(), p.Files()); err != nil {
				b.Fatalf("%s: %v", p.Name, err)
			}
		}
	}
	b.ReportMetric(float64(len(profiles)), "profiles")
}

// BenchmarkRenderScaleProfile renders the 1,000-node benchmark's own values (mixed, driver pools and the trim).
func BenchmarkRenderScaleProfile(b *testing.B) {
	for b.Loop() {
		if _, err := render(b.Context(), profileFiles()); err != nil {
			b.Fatal(err)
		}
	}
}

func docs(files []string, b *testing.B) int {
	out, err := render(b.Context(), files)
	if err != nil {
		b.Fatal(err)
	}
	return strings.Count(out, "\n---\n") + 1
}

// TestScaleProfileDaemonSets checks the trim leaves the DaemonSets the gate and the measured components need (a
// render only; the benchmarks are what start the cluster).
func TestScaleProfileDaemonSets(t *testing.T) {
	out, err := render(t.Context(), profileFiles())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, doc := range strings.Split(out, "\n---\n") {
		if strings.Contains(doc, "\nkind: DaemonSet\n") {
			_, rest, _ := strings.Cut(doc, "\n  name: ")
			name, _, _ := strings.Cut(rest, "\n")
			names = append(names, name)
		}
	}
	t.Logf("%d DaemonSets: %s", len(names), strings.Join(names, " "))
	all := strings.Join(names, " ")
	for _, want := range []string{"nvidia-operator-validator", "nvidia-sandbox-validator", "nvidia-driver-r570", "nvidia-driver-precompiled"} {
		if !strings.Contains(all, want) {
			t.Errorf("no DaemonSet %s among %s", want, all)
		}
	}
	for _, gone := range []string{"dcgm-exporter", "gpu-feature-discovery", "node-feature-discovery", "nvidia-container-toolkit", "nvidia-device-plugin-daemonset"} {
		if strings.Contains(all, gone) {
			t.Errorf("DaemonSet %s rendered; the trim should drop it", gone)
		}
	}
}
