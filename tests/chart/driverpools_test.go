package chart

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// driver-pools: every GPU node is a container node; the host pool's nodes get everything but the driver.
func init() {
	m := sandboxOff(containerRole)
	m["pool-host"] = containerHostDriver
	roleMatrix["driver-pools"] = m
}

var driverPoolsProfile = filepath.Join(chartrender.RepoRoot(), "values", "driver-pools.yaml")

// driverTemplates returns the pod template of every driver DaemonSet in a rendered stream, as YAML, by name.
func driverTemplates(t *testing.T, stream string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objects(t, stream) {
		if o.kind() != "DaemonSet" || !strings.HasPrefix(o.Source, "kube-gpu-stack/charts/driver/") {
			continue
		}
		spec, _ := o.Raw["spec"].(map[string]any)
		b, err := yaml.Marshal(spec["template"])
		if err != nil {
			t.Fatal(err)
		}
		out[o.name()] = string(b)
	}
	if len(out) == 0 {
		t.Fatal("no driver DaemonSets rendered")
	}
	return out
}

// configDigest is the value of the DRIVER_CONFIG_DIGEST env entry of a driver pod template.
func configDigest(t *testing.T, template string) string {
	t.Helper()
	_, rest, ok := strings.Cut(template, "name: DRIVER_CONFIG_DIGEST")
	if !ok {
		t.Fatal("no DRIVER_CONFIG_DIGEST in the driver pod template")
	}
	for _, l := range strings.Split(rest, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "value: "); ok {
			return v
		}
	}
	return ""
}

// driverDaemonSet decodes the rendered DaemonSet called name.
func driverDaemonSet(t *testing.T, stream, name string) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() == "DaemonSet" && o.name() == name {
			b, err := yaml.Marshal(o.Raw)
			if err != nil {
				t.Fatal(err)
			}
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal(b, &ds); err != nil {
				t.Fatal(err)
			}
			return &ds
		}
	}
	t.Fatalf("no DaemonSet %s", name)
	return nil
}

func sameTemplates(t *testing.T, want, got map[string]string) {
	t.Helper()
	if a, b := slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)); !slices.Equal(a, b) {
		t.Fatalf("driver DaemonSets differ: %v vs %v", a, b)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("driver DaemonSet %s: pod template changed:\n%s", name, lineDiff(w, got[name]))
		}
	}
}

// A chart release that changes nothing about the driver renders byte-identical driver pod templates, so no
// driver pod restarts (and no workload is drained) on a chart-only upgrade.
func TestDriverPodTemplatesIgnoreChartVersion(t *testing.T) {
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	chrt := umbrella(t)
	chrt.Metadata.Version, chrt.Metadata.AppVersion = "9.8.7", "9.8.7"
	for _, d := range chrt.Dependencies() {
		d.Metadata.Version, d.Metadata.AppVersion = "9.8.7", "9.8.7"
		for _, dd := range d.Dependencies() {
			dd.Metadata.Version, dd.Metadata.AppVersion = "9.8.7", "9.8.7"
		}
	}
	for _, d := range chrt.Metadata.Dependencies {
		d.Version = "9.8.7"
	}
	vals, err := chartrender.Values([]string{driverPoolsProfile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := chartrender.Render(t.Context(), chrt, vals, newestKube)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "helm.sh/chart: driver-9.8.7") {
		t.Fatal("the bumped chart version does not show in the render; the test would prove nothing")
	}
	sameTemplates(t, base, driverTemplates(t, out))
}

// Values of other operands are not part of the driver pod template.
func TestDriverPodTemplatesIgnoreOtherOperands(t *testing.T) {
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	got := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile},
		"devicePlugin.args={--fail-on-init-error=false}", "toolkit.image.tag=v9.9.9", "dcgmExporter.enabled=false"))
	sameTemplates(t, base, got)
}

// Changing one pool's driver version moves exactly that pool's DRIVER_CONFIG_DIGEST.
func TestDriverConfigDigestPerPool(t *testing.T) {
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	for _, tc := range []struct{ set, prefix string }{
		{"driver.pools[0].image.tag=570.200.01", "nvidia-driver-r570-"},
		{"driver.pools[1].image.tag=575", "nvidia-driver-precompiled-"},
		{"driver.image.tag=595.100.01", "nvidia-driver-daemonset-"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			// --set-string: a driver branch such as 575 is a tag, not a number
			vals, err := (&values.Options{ValueFiles: []string{driverPoolsProfile}, StringValues: []string{tc.set}}).MergeValues(getter.Providers{})
			if err != nil {
				t.Fatal(err)
			}
			out, err := chartrender.Render(t.Context(), umbrella(t), vals, newestKube)
			if err != nil {
				t.Fatal(err)
			}
			got := driverTemplates(t, out)
			moved := 0
			for name, tmpl := range base {
				changed := configDigest(t, tmpl) != configDigest(t, got[name])
				if changed != strings.HasPrefix(name, tc.prefix) {
					t.Errorf("%s: digest changed=%v after %s", name, changed, tc.set)
				}
				if changed {
					moved++
				}
			}
			if moved == 0 {
				t.Errorf("%s moved no digest", tc.set)
			}
		})
	}
}

// The profile renders one DaemonSet per pool x OS (x kernel), with names within 63 characters, and precompiled
// images tagged <branch>-<kernel>-<os tag>.
func TestDriverPoolsFanOut(t *testing.T) {
	stream := render(t, newestKube, []string{driverPoolsProfile})
	got := slices.Sorted(maps.Keys(driverTemplates(t, stream)))
	want := []string{
		"nvidia-driver-daemonset-rhel9", "nvidia-driver-daemonset-ubuntu2204", "nvidia-driver-daemonset-ubuntu2404",
		"nvidia-driver-precompiled-ubuntu2204-5-15-0-140-generic", "nvidia-driver-precompiled-ubuntu2204-6-8-0-60-generic",
		"nvidia-driver-r570-rhel9", "nvidia-driver-r570-ubuntu2404",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("driver DaemonSets:\n got  %v\n want %v", got, want)
	}
	ds := driverDaemonSet(t, stream, "nvidia-driver-precompiled-ubuntu2204-5-15-0-140-generic")
	if img := ds.Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/driver:580-5.15.0-140-generic-ubuntu22.04" {
		t.Errorf("precompiled image %s", img)
	}
	if ds.Spec.Template.Labels["nvidia.com/precompiled"] != "true" {
		t.Errorf("precompiled pod without nvidia.com/precompiled=true: %v", ds.Spec.Template.Labels)
	}

	// a long pool name and kernel: cut to 63 characters with a hash, still distinct per kernel
	long := render(t, newestKube, []string{driverPoolsProfile}, "driver.pools[1].name=precompiled-a100-xl",
		"driver.pools[1].kernels={5.14.0-570.12.1.el9_6.x86_64-long-suffix-one,5.14.0-570.12.1.el9_6.x86_64-long-suffix-two}")
	names := slices.Sorted(maps.Keys(driverTemplates(t, long)))
	seen := 0
	for _, n := range names {
		if len(n) > 63 {
			t.Errorf("%s is longer than 63 characters", n)
		}
		if strings.HasPrefix(n, "nvidia-driver-precompiled-a100-xl-") {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("want two distinct precompiled DaemonSets, got %v", names)
	}
}
