package chart

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/valuesschema"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/gpumigrate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// migrateInputs is where the GPU Operator inputs of the migrate tests live (the operator's own defaults vendored).
var migrateInputs = filepath.Join(chartrender.RepoRoot(), "hooks", "admin", "gpumigrate", "testdata")

// migrated converts one GPU Operator input with `migrate`'s code path and renders the chart with the values file
// it writes, as `helm install -f` would.
func migrated(t *testing.T, input string, kernels ...string) (string, gpumigrate.Result) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "values.yaml")
	o := gpumigrate.Options{File: filepath.Join(migrateInputs, input), Out: out, Report: filepath.Join(t.TempDir(), "report.txt"), Kernels: kernels}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	r, err := o.Run(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := renderErr(t, newestKube, []string{out})
	if err != nil {
		body, _ := os.ReadFile(out)
		t.Fatalf("the values migrate wrote for %s do not render: %v\n%s", input, err, body)
	}
	return stream, r
}

// podOf is the pod spec of the rendered DaemonSet name.
func migratedPod(t *testing.T, stream, name string) *corev1.PodSpec {
	t.Helper()
	return &daemonSet(t, stream, name).Spec.Template.Spec
}

// images are the images of a pod spec's containers and init containers.
func images(spec *corev1.PodSpec) []string {
	var out []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		out = append(out, c.Image)
	}
	return out
}

// envWith is the environment of the pod's container that sets key.
func envWith(t *testing.T, spec *corev1.PodSpec, key string) map[string]string {
	t.Helper()
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if env := containerEnv(c); env[key] != "" {
			return env
		}
	}
	t.Fatalf("no container sets %s", key)
	return nil
}

// mounted are the host paths a pod spec mounts.
func mounted(spec *corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	return out
}

// TestMigrateRendersWithTheChart converts the GPU Operator's own default values and realistic files, renders the
// chart with each output and checks that the rendered objects carry the converted settings.
func TestMigrateRendersWithTheChart(t *testing.T) {
	t.Parallel()
	// the image by tag: the chart's default digest pins stay on the tags upstream published them for
	// (TestDefaultDigestsAreUpstreamsOwn)
	hasImage := func(t *testing.T, stream, ds, want string) *corev1.PodSpec {
		t.Helper()
		spec := migratedPod(t, stream, ds)
		if !slices.ContainsFunc(images(spec), func(img string) bool { tagged, _, _ := strings.Cut(img, "@"); return tagged == want }) {
			t.Errorf("%s runs %v, not %s", ds, images(spec), want)
		}
		return spec
	}
	cases := []struct {
		input   string
		kernels []string
		check   func(t *testing.T, stream string)
	}{
		{input: "gpu-operator-v26.7.0/values.yaml", check: func(t *testing.T, stream string) {
			hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404", "nvcr.io/nvidia/driver:595.91.07-ubuntu24.04")
			hasImage(t, stream, "nvidia-container-toolkit-daemonset", "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0")
			hasImage(t, stream, "nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0")
			hasImage(t, stream, "nvidia-dcgm-exporter", "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless")
		}},
		{input: "operator-typical.yaml", check: func(t *testing.T, stream string) {
			spec := hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404", "nvcr.io/nvidia/driver:570.195.03-ubuntu24.04")
			if spec.PriorityClassName != "gpu-critical" {
				t.Errorf("priorityClassName %q, want daemonsets.priorityClassName gpu-critical", spec.PriorityClassName)
			}
			if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "dedicated" && tl.Value == "gpu" }) {
				t.Errorf("tolerations %v lack daemonsets.tolerations dedicated=gpu", spec.Tolerations)
			}
			if !strings.Contains(stream, "team: ml-platform") {
				t.Error("daemonsets.labels team=ml-platform rendered nowhere")
			}
			mgr := envWith(t, spec, "ENABLE_AUTO_DRAIN")
			for k, want := range map[string]string{"ENABLE_AUTO_DRAIN": "true", "DRAIN_POD_SELECTOR_LABEL": "team=batch", "ENABLE_GPU_POD_EVICTION": "true"} {
				if mgr[k] != want {
					t.Errorf("driver manager %s=%q, want %q", k, mgr[k], want)
				}
			}
			for _, want := range []string{"900", "600"} {
				if !slices.ContainsFunc(mapValues(mgr), func(v string) bool { return strings.HasPrefix(v, want) }) {
					t.Errorf("driver manager env %v lacks the timeout %s s", mgr, want)
				}
			}
			if !strings.Contains(stream, `"maxUnavailable":2`) {
				t.Error("maxParallelUpgrades 2 did not become the default pool's maxUnavailable 2")
			}
			migratedPod(t, stream, "nvidia-sandbox-device-plugin-daemonset") // sandboxWorkloads reached global.sandboxWorkloads
		}},
		{input: "k3s.yaml", check: func(t *testing.T, stream string) {
			spec := migratedPod(t, stream, "nvidia-container-toolkit-daemonset")
			if !slices.ContainsFunc(mounted(spec), func(p string) bool { return strings.HasPrefix(p, "/run/k3s/containerd") }) ||
				!slices.ContainsFunc(mounted(spec), func(p string) bool { return strings.HasPrefix(p, "/var/lib/rancher/k3s/agent/etc/containerd") }) {
				t.Errorf("the toolkit mounts %v, not k3s's containerd socket and config", mounted(spec))
			}
		}},
		{input: "rke2.yaml", check: func(t *testing.T, stream string) {
			spec := migratedPod(t, stream, "nvidia-container-toolkit-daemonset")
			env := envWith(t, spec, "CONTAINERD_CONFIG")
			if !strings.HasSuffix(env["CONTAINERD_CONFIG"], "/config.toml.tmpl") || !slices.Contains(mounted(spec), "/var/lib/rancher/rke2/agent/etc/containerd") {
				t.Errorf("the toolkit (CONTAINERD_CONFIG=%s, mounts %v) does not edit rke2's containerd template", env["CONTAINERD_CONFIG"], mounted(spec))
			}
			if env["NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL"] != "debug" {
				t.Errorf("toolkit env %v lacks NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL=debug", env)
			}
		}},
		{input: "time-slicing.yaml", check: func(t *testing.T, stream string) {
			if !strings.Contains(stream, "name: time-slicing-config") || !strings.Contains(stream, "replicas: 4") {
				t.Error("no time-slicing-config ConfigMap with the time-slicing config")
			}
			if !strings.Contains(stringify(migratedPod(t, stream, "nvidia-device-plugin-daemonset").Volumes), "time-slicing-config") {
				t.Error("the device plugin does not mount time-slicing-config")
			}
		}},
		{input: "vgpu-licensing.yaml", check: func(t *testing.T, stream string) {
			spec := hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404", "registry.example.com/nvidia/vgpu-guest-driver:570.172.08-grid-ubuntu24.04")
			if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "licensing-config" }) {
				t.Error("no licensing-config Secret volume on the driver pod")
			}
			if !slices.ContainsFunc(spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == "ngc-secret" }) {
				t.Errorf("pull secrets %v lack ngc-secret", spec.ImagePullSecrets)
			}
		}},
		{input: "sandbox.yaml", check: func(t *testing.T, stream string) {
			hasImage(t, stream, "nvidia-vgpu-manager-daemonset-ubuntu2404", "registry.example.com/nvidia/vgpu-manager:570.172.07-ubuntu24.04")
			if !strings.Contains(stringify(migratedPod(t, stream, "nvidia-vgpu-device-manager")), "vgpu-devices-config") || !strings.Contains(stream, "A100-20C") {
				t.Error("vgpuDeviceManager.config not rendered")
			}
		}},
		{input: "private-registry.yaml", check: func(t *testing.T, stream string) {
			for _, ds := range []string{"nvidia-driver-daemonset-ubuntu2404", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset",
				"nvidia-dcgm-exporter", "gpu-feature-discovery", "nvidia-mig-manager"} {
				spec := migratedPod(t, stream, ds)
				if !slices.ContainsFunc(images(spec), func(i string) bool { return strings.HasPrefix(i, "registry.example.com/") }) {
					t.Errorf("%s runs %v, none from the private registry", ds, images(spec))
				}
				if !slices.ContainsFunc(spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == "regcred" }) {
					t.Errorf("%s pull secrets %v lack regcred", ds, spec.ImagePullSecrets)
				}
			}
			hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404", "registry.example.com/nvidia/driver:595.91.07-ubuntu24.04")
		}},
		{input: "mig-config.yaml", check: func(t *testing.T, stream string) {
			if !strings.Contains(stream, "all-3g.40gb-custom:") {
				t.Error("the custom MIG layout is rendered nowhere")
			}
			if !strings.Contains(stringify(migratedPod(t, stream, "nvidia-mig-manager")), "all-3g.40gb-custom") {
				t.Error("the MIG manager does not default to all-3g.40gb-custom")
			}
			if !strings.Contains(stringify(migratedPod(t, stream, "nvidia-device-plugin-daemonset")), "mixed") {
				t.Error("the device plugin does not run the mixed MIG strategy")
			}
		}},
		{input: "precompiled.yaml", kernels: []string{"6.8.0-60-generic"}, check: func(t *testing.T, stream string) {
			hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404-6-8-0-60-generic", "nvcr.io/nvidia/driver:570-6.8.0-60-generic-ubuntu24.04")
		}},
		{input: "nvidiadrivers.yaml", kernels: []string{"6.8.0-60-generic"}, check: func(t *testing.T, stream string) {
			hasImage(t, stream, "nvidia-driver-daemonset-ubuntu2404", "nvcr.io/nvidia/driver:595.91.07-ubuntu24.04")
			spec := hasImage(t, stream, "nvidia-driver-a100-r570-rhel9", "nvcr.io/nvidia/driver:570.195.03-rhel9")
			terms := stringify(spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
			if !strings.Contains(terms, "nvidia.com/driver.pool") || !strings.Contains(terms, "a100-r570") {
				t.Errorf("a100-r570 pool affinity %s does not select nvidia.com/driver.pool=a100-r570", terms)
			}
			hasImage(t, stream, "nvidia-driver-h100-precompiled-ubuntu2404-6-8-0-60-generic", "nvcr.io/nvidia/driver:580-6.8.0-60-generic-ubuntu24.04")
		}},
	}
	for _, tc := range cases {
		t.Run(strings.TrimSuffix(filepath.Base(strings.ReplaceAll(tc.input, "/values.yaml", "")), ".yaml"), func(t *testing.T) {
			stream, _ := migrated(t, tc.input, tc.kernels...)
			tc.check(t, stream)
		})
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func stringify(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}

// operatorKeyHints are the keys the values schemas carry for GPU Operator spellings (generated from the migrate
// table by TestValuesSchemaUpToDate): umbrella key path -> the sentence the schema accepts as its only value.
func operatorKeyHints(t *testing.T) (all, umbrella map[string]string) {
	t.Helper()
	hints := map[string]string{}
	var walk func(prefix string, s map[string]any)
	walk = func(prefix string, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		for k, v := range props {
			child, _ := v.(map[string]any)
			p := strings.TrimPrefix(prefix+"."+k, ".")
			if c, ok := child["const"].(string); ok && strings.Contains(c, "kube-gpu-stack migrate") {
				hints[p] = c
			}
			walk(p, child)
		}
	}
	load := func(dir string) map[string]any {
		var s map[string]any
		data, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	walk("", load(chartrender.ChartDir()))
	umbrella = maps.Clone(hints)
	keys, err := valuesschema.SubchartKeys(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range keys {
		if name != "gpu-stack-lib" {
			walk(key, load(filepath.Join(chartrender.ChartDir(), "charts", name)))
		}
	}
	return hints, umbrella
}

// TestOperatorKeysFailNamingTheReplacement renders a values file with each GPU Operator key that this chart spells
// differently: the render must still fail, and the error must name the key, its replacement and `migrate`.
func TestOperatorKeysFailNamingTheReplacement(t *testing.T) {
	t.Parallel()
	hints, umbrellaHints := operatorKeyHints(t)
	for key, want := range map[string]string{
		"driver.version":                           "use driver.image.tag",
		"sandboxWorkloads":                         "use global.sandboxWorkloads",
		"driver.upgradePolicy.maxParallelUpgrades": "use driver.upgradePolicy.maxUnavailable",
		"driver.upgradePolicy.drain":               "use driver.manager.drain",
		"driver.upgradePolicy.gpuPodDeletion":      "use driver.manager.gpuPodDeletion",
		"toolkit.env":                              "use toolkit.extraEnv",
		"daemonsets":                               "use global.tolerations",
		"driver.repository":                        "use driver.image.registry, driver.image.repository",
	} {
		if !strings.HasPrefix(hints[key], want) {
			t.Errorf("the schema's hint for %s is %q, want it to start %q", key, hints[key], want)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(hints)) {
		t.Run(key, func(t *testing.T) {
			vals := map[string]any{}
			cur := vals
			segs := strings.Split(key, ".")
			for _, s := range segs[:len(segs)-1] {
				next := map[string]any{}
				cur[s] = next
				cur = next
			}
			cur[segs[len(segs)-1]] = map[string]any{"fromTheGPUOperator": true}
			// Helm validates only enabled subcharts' values
			if _, umbrellaKey := umbrellaHints[key]; !umbrellaKey {
				vals[segs[0]].(map[string]any)["enabled"] = true
			}
			_, err := chartrender.Render(t.Context(), umbrella(t), vals, newestKube)
			if err == nil {
				t.Fatalf("%s rendered: the schema must still refuse it", key)
			}
			last := segs[len(segs)-1]
			if !strings.Contains(err.Error(), hints[key]) || !strings.Contains(err.Error(), last) {
				t.Fatalf("error does not name %s and %q:\n%v", last, hints[key], err)
			}
		})
	}
}

// TestMigrateTargetsExist resolves every chart key the migrate table writes against the values schemas (the
// umbrella's, and the operand chart's below its key): a mapping to a key the chart does not have fails here.
func TestMigrateTargetsExist(t *testing.T) {
	t.Parallel()
	load := func(dir string) map[string]any {
		var s map[string]any
		data, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	root := load(chartrender.ChartDir())
	sub := map[string]map[string]any{}
	keys, err := valuesschema.SubchartKeys(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range keys {
		if name != "gpu-stack-lib" {
			sub[key] = load(filepath.Join(chartrender.ChartDir(), "charts", name))
		}
	}
	resolve := func(target string) bool {
		target, _, _ = strings.Cut(target, "=")
		segs := strings.Split(target, ".")
		node := root
		if s, ok := sub[segs[0]]; ok {
			node, segs = s, segs[1:]
		}
		for _, seg := range segs {
			name, list := strings.CutSuffix(seg, "[]")
			props, _ := node["properties"].(map[string]any)
			if props == nil {
				// a free-form object (e.g. a pool's rdma, an env map) takes any key below it
				return node["type"] == "object" && node["const"] == nil
			}
			next, ok := props[name].(map[string]any)
			if !ok || next["const"] != nil {
				return false
			}
			if list {
				if next, ok = next["items"].(map[string]any); !ok {
					return false
				}
			}
			node = next
		}
		return true
	}
	n := 0
	for _, tc := range []struct {
		rules  []gpumigrate.Rule
		prefix string
	}{{gpumigrate.Rules(), ""}, {gpumigrate.DriverRules(), "driver.pools[]."}} {
		for _, r := range tc.rules {
			for _, target := range r.Targets {
				n++
				if !resolve(tc.prefix + target) {
					t.Errorf("%s maps to %s%s, which is not a key of the chart", r.From, tc.prefix, target)
				}
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d targets checked", n)
	}
}
