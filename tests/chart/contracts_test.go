package chart

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// knownOpenFindings are chart defects the contract table finds that are not fixed yet. A violation matching one is
// logged instead of failing; a finding that no render shows any more fails the test, so the list only shrinks.
// Delete each entry with its fix.
var knownOpenFindings = []struct{ finding, container, violation string }{}

// chartEnv are env vars the chart sets on purpose on a container whose image ignores them, by container name, with
// why. Keep it short: an entry is a decision, not a way past the check.
var chartEnv = map[string]map[string]string{
	"nvidia-driver-ctr": {
		"DRIVER_CONFIG_DIGEST": "the precompiled nvidia-driver ignores it; every driver container carries its pool's config digest all the same (the upgrade test requires it beside the driver manager's, the e2e stand-in records it from the driver container)",
	},
}

// contractRenders are the extra renders beyond each profile alone and with every optional operand: GPUDirect RDMA
// with a host MOFED, and a named device plugin config (its config managers), which no profile turns on.
var contractRenders = map[string][]string{
	"host-mofed": {"driver.rdma.enabled=true", "driver.rdma.useHostMofed=true"},
	"device-plugin-config": {"devicePlugin.config.name=gpu-sharing", "devicePlugin.config.create=true",
		"devicePlugin.config.default=shared", "devicePlugin.config.data.shared=version: v1"},
}

// TestContractTableCoversEveryImage: every third-party image images.txt lists has a row in the contract table.
func TestContractTableCoversEveryImage(t *testing.T) {
	t.Parallel()
	listed, err := imagelist.ParseFile(filepath.Join(chartrender.ChartDir(), imagelist.FileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range listed {
		if isProjectImage(img) {
			continue
		}
		if _, ok := contracts.Lookup(img); !ok {
			t.Errorf("%s has no row in tests/contracts.Table: read its upstream source at the tag and add one", img)
		}
	}
}

func isProjectImage(img string) bool { return strings.Contains(img, "kube-gpu-stack/kube-gpu-stack:") }

// TestContracts renders every profile for every supported Kubernetes version, alone, with every optional operand
// and with the extra contractRenders, and checks every container of a third-party image (init containers and
// sidecars, DaemonSets, Deployments, Jobs and Pods) against its row of the contract table: the command exists in
// the image, the chart sets only env the image reads (or the runtime, or a chart script in the container), the
// image's required env is set, the mounts provide the paths it needs; and a device plugin hands out the devices of
// the GPUDirect features its node's driver enables.
func TestContracts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string][]string{} // violation -> renders
	checked := 0
	t.Run("render", func(t *testing.T) {
		for _, p := range profiles(t) {
			for _, kv := range p.kubeVersions() {
				sets := map[string][]string{"alone": nil, "every-optional-operand": everythingOn}
				for name, extra := range contractRenders {
					sets[name] = extra
				}
				for name, set := range sets {
					where := p.name + "/" + kv + "/" + name
					t.Run(where, func(t *testing.T) {
						t.Parallel()
						found, n := contractViolations(t, render(t, kv, p.files, set...))
						mu.Lock()
						defer mu.Unlock()
						checked += n
						for _, v := range found {
							seen[v] = append(seen[v], where)
						}
					})
				}
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	if checked == 0 {
		t.Fatal("no third-party container was checked: the renders lost their operands")
	}
	used := map[int]bool{}
	for _, v := range slices.Sorted(func(yield func(string) bool) {
		for v := range seen {
			if !yield(v) {
				return
			}
		}
	}) {
		i := slices.IndexFunc(knownOpenFindings, func(f struct{ finding, container, violation string }) bool {
			return strings.Contains(v, "container "+f.container+" ") && strings.Contains(v, f.violation)
		})
		if i >= 0 {
			used[i] = true
			t.Logf("known open finding (%s): %s [%s]", knownOpenFindings[i].finding, v, summarize(seen[v]))
			continue
		}
		t.Errorf("%s [%s]", v, summarize(seen[v]))
	}
	for i, f := range knownOpenFindings {
		if !used[i] {
			t.Errorf("known open finding %q no longer shows in any render: delete it from knownOpenFindings", f.finding)
		}
	}
	t.Logf("%d third-party containers checked", checked)
}

// contractViolations checks one render's third-party containers and returns their violations, each naming the
// workload, container and image, and how many containers it checked.
func contractViolations(t *testing.T, stream string) ([]string, int) {
	t.Helper()
	objs := objects(t, stream)
	configMaps := map[string]map[string]any{}
	for _, o := range objs {
		if o.kind() == "ConfigMap" {
			data, _ := o.Raw["data"].(map[string]any)
			configMaps[o.name()] = data
		}
	}
	type ctr struct {
		where string
		c     corev1.Container
		spec  *corev1.PodSpec
	}
	var all []ctr
	for _, o := range objs {
		for where, raw := range podSpecs(o) {
			b, err := yaml.Marshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			var spec corev1.PodSpec
			if err := yaml.Unmarshal(b, &spec); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				all = append(all, ctr{where, c, &spec})
			}
		}
	}
	var out []string
	n := 0
	// GPUDirect features a driver container enables, which the device plugin must then hand to pods.
	// GDS needs MOFED_ENABLED too (the GPU Operator sets both with nvidia_fs loaded); GPUDirect RDMA alone needs
	// none of the plugin's (the RDMA device plugin hands out /dev/infiniband).
	gpuDirect := map[string][]string{"GDS_ENABLED": {"GDS_ENABLED", "MOFED_ENABLED"}, "GDRCOPY_ENABLED": {"GDRCOPY_ENABLED"}}
	enabled := map[string]bool{}
	for _, x := range all {
		if x.c.Name != "nvidia-driver-ctr" {
			continue
		}
		for _, e := range x.c.Env {
			if e.Value == "true" {
				for _, name := range gpuDirect[e.Name] {
					enabled[name] = true
				}
			}
		}
	}
	// A device plugin config names sharing settings GFD must label by: GFD reads the same config.
	pluginConfig, gfdConfig := false, false
	for _, x := range all {
		hasEnv := func(names ...string) bool {
			return slices.ContainsFunc(x.c.Env, func(e corev1.EnvVar) bool { return slices.Contains(names, e.Name) })
		}
		switch x.c.Name {
		case "nvidia-device-plugin":
			pluginConfig = pluginConfig || hasEnv("CONFIG_FILE")
		case "gpu-feature-discovery":
			gfdConfig = gfdConfig || hasEnv("CONFIG_FILE", "GFD_CONFIG_FILE")
		}
	}
	if pluginConfig && !gfdConfig {
		out = append(out, "DaemonSet/gpu-feature-discovery container gpu-feature-discovery : the device plugin runs with a named config (CONFIG_FILE) but GFD reads none, so its sharing labels ignore it")
	}
	for _, x := range all {
		if isProjectImage(x.c.Image) || imagelist.UserSupplied(x.c.Image) {
			continue
		}
		what := fmt.Sprintf("%s container %s (%s)", x.where, x.c.Name, x.c.Image)
		row, ok := contracts.Lookup(x.c.Image)
		if !ok {
			out = append(out, what+": no row in the contract table")
			continue
		}
		n++
		// chart scripts mounted into the container from the chart's ConfigMaps (e.g. the driver's startup probe)
		var scripts []string
		for _, m := range x.c.VolumeMounts {
			for _, v := range x.spec.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					for _, d := range configMaps[v.ConfigMap.Name] {
						s, _ := d.(string)
						scripts = append(scripts, s)
					}
				}
			}
		}
		for _, v := range row.Check(x.c, x.spec.Volumes, scripts...) {
			if name, ok := strings.CutPrefix(v, "sets env "); ok {
				name, _, _ = strings.Cut(name, ",")
				if _, ok := chartEnv[x.c.Name][name]; ok {
					continue
				}
			}
			out = append(out, what+": "+v)
		}
		if row.NoAPI && contracts.GetsToken(*x.spec, x.c) {
			out = append(out, what+": the image never calls the Kubernetes API but gets the pod's service-account token; set automountServiceAccountToken: false and mount it only into the containers that need it (gpu-stack-lib.apiAccessMount)")
		}
		if contracts.HasProgram(row, x.c, "nvidia-device-plugin") {
			for _, name := range slices.Sorted(func(yield func(string) bool) {
				for k := range enabled {
					if !yield(k) {
						return
					}
				}
			}) {
				if !slices.ContainsFunc(x.c.Env, func(e corev1.EnvVar) bool { return e.Name == name && e.Value == "true" }) &&
					!exportsFromDriverCtrReady(x.c, name) {
					out = append(out, fmt.Sprintf("%s: the driver enables the feature but %s is not \"true\" (nor exported from the driver pod's .driver-ctr-ready), so pods get none of its devices", what, name))
				}
			}
		}
	}
	return out, n
}

// exportsFromDriverCtrReady: the container's shell command reads the .driver-ctr-ready the driver pod's startup
// probe writes (its own GDS_ENABLED, GDRCOPY_ENABLED, GPU_DIRECT_RDMA_ENABLED) while exporting every variable, and
// sets name from it, so each node's plugin follows that node's driver pool (TestDevicePluginGPUDirectFollowsTheDriver
// runs the script).
func exportsFromDriverCtrReady(c corev1.Container, name string) bool {
	script := strings.Join(slices.Concat(c.Command, c.Args), " ")
	_, exported, ok := strings.Cut(script, "set -a;")
	if !ok || !strings.Contains(exported, "< /run/nvidia/validations/.driver-ctr-ready") {
		return false
	}
	if name == "MOFED_ENABLED" {
		return strings.Contains(exported, "MOFED_ENABLED=$GDS_ENABLED")
	}
	return strings.Contains(exported, name+"=false")
}
