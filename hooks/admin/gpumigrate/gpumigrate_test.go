package gpumigrate

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	sigsyaml "sigs.k8s.io/yaml"
)

const vendored = "testdata/gpu-operator-v26.7.0"

func parse(t *testing.T, file string) Input {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	in, err := ParseFile(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return in
}

// leaves are the input's keys down to scalars, lists and empty maps.
func leaves(prefix string, v any) []string {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return []string{prefix}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, leaves(strings.TrimPrefix(prefix+"."+k, "."), m[k])...)
	}
	return out
}

// accounted reports whether the report has an entry for key or for a key above it.
func accounted(report []Entry, key string) bool {
	return slices.ContainsFunc(report, func(e Entry) bool {
		return e.Key == key || strings.HasPrefix(key, e.Key+".")
	})
}

// TestEveryInputKeyIsReported walks each input's tree: every key must be in the report, mapped, dropped with a
// reason, needing a decision or named as having no place.
func TestEveryInputKeyIsReported(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.yaml")
	files = append(files, vendored+"/values.yaml")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in := parse(t, f)
			r := Convert(in.Values, in.Drivers)
			keys := leaves("", in.Values)
			if len(in.Values) == 0 {
				keys = nil
			}
			for _, d := range in.Drivers {
				keys = append(keys, leaves("NVIDIADriver/"+objName(d)+".spec", d["spec"])...)
			}
			for _, k := range keys {
				if !accounted(r.Report, k) {
					t.Errorf("input key %s is not in the report", k)
				}
			}
			for _, e := range r.Report {
				if e.Action != Mapped && e.Why == "" {
					t.Errorf("%s is %s without a reason", e.Key, e.Action)
				}
			}
		})
	}
}

// TestOperatorDefaultsHaveAPlace: every key of the operator's own values.yaml is in the table, and its defaults
// need no decision: where this chart differs, the default is the behaviour it has.
func TestOperatorDefaultsHaveAPlace(t *testing.T) {
	in := parse(t, vendored+"/values.yaml")
	for _, e := range Convert(in.Values, nil).Report {
		switch e.Action {
		case Unknown:
			t.Errorf("%s of the GPU Operator's values.yaml is not in the table", e.Key)
		case Decision:
			t.Errorf("the GPU Operator's default %s needs a decision: %s", e.Key, e.Why)
		}
	}
}

// crdFields walks a CRD's spec schema down to leaves: scalars, lists, and objects without fixed properties.
func crdFields(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := sigsyaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	v := crd.Spec.Versions[len(crd.Spec.Versions)-1].Schema.OpenAPIV3Schema
	spec := v["properties"].(map[string]any)["spec"].(map[string]any)
	var out []string
	var walk func(string, map[string]any)
	walk = func(p string, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		if len(props) == 0 || s["type"] == "array" {
			out = append(out, p)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(props)) {
			walk(strings.TrimPrefix(p+"."+k, "."), props[k].(map[string]any))
		}
	}
	walk("", spec)
	return out
}

// TestCRDFieldsHaveAPlace: every field of the ClusterPolicy and NVIDIADriver specs (at the pinned tag) is in the
// table; a field set alone is never reported as unknown.
func TestCRDFieldsHaveAPlace(t *testing.T) {
	for _, tc := range []struct {
		crd     string
		convert func(map[string]any) Result
	}{
		{"nvidia.com_clusterpolicies.yaml", func(spec map[string]any) Result { return Convert(spec, nil) }},
		{"nvidia.com_nvidiadrivers.yaml", func(spec map[string]any) Result {
			return Convert(nil, []map[string]any{{"metadata": map[string]any{"name": "pool"}, "spec": spec}})
		}},
	} {
		fields := crdFields(t, filepath.Join(vendored, tc.crd))
		if len(fields) < 50 {
			t.Fatalf("%s: only %d fields", tc.crd, len(fields))
		}
		for _, f := range fields {
			spec := map[string]any{}
			setPath(spec, f, "x")
			for _, e := range tc.convert(spec).Report {
				if e.Action == Unknown {
					t.Errorf("%s: %s is not in the table", tc.crd, f)
				}
			}
		}
	}
}

func convertYAML(t *testing.T, doc string) Result {
	t.Helper()
	in, err := ParseFile([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return Convert(in.Values, in.Drivers)
}

func wantValues(t *testing.T, r Result, want string) {
	t.Helper()
	var w map[string]any
	if err := sigsyaml.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	got, _ := sigsyaml.Marshal(r.Values)
	norm, _ := sigsyaml.Marshal(w)
	if !bytes.Equal(got, norm) {
		t.Errorf("values:\n%s\nwant:\n%s", got, norm)
	}
}

func entry(t *testing.T, r Result, key string) Entry {
	t.Helper()
	for _, e := range r.Report {
		if e.Key == key {
			return e
		}
	}
	t.Fatalf("no report entry for %s: %v", key, r.Report)
	return Entry{}
}

func TestMappings(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"driver image", `driver: {repository: registry.example.com:5000/nvidia, version: "570.195.03"}`,
			`{driver: {image: {registry: "registry.example.com:5000", repository: nvidia/driver, tag: "570.195.03"}}, global: {stackImage: {registry: "registry.example.com:5000"}}}`},
		{"image with path and digest", `toolkit: {image: "quay.io/me/toolkit@sha256:abc"}`,
			`toolkit: {image: {registry: quay.io, repository: me/toolkit, digest: "sha256:abc"}}`},
		{"version only", `dcgmExporter: {version: 4.6.0-4.8.3-distroless}`, `dcgmExporter: {image: {tag: 4.6.0-4.8.3-distroless}}`},
		{"upgrade bound: maxParallelUpgrades under a percentage", `driver: {upgradePolicy: {maxParallelUpgrades: 3, maxUnavailable: 25%}}`,
			`driver: {upgradePolicy: {maxUnavailable: 3}}`},
		{"upgrade bound: the smaller count", `driver: {upgradePolicy: {maxParallelUpgrades: 3, maxUnavailable: "2"}}`,
			`driver: {upgradePolicy: {maxUnavailable: 2}}`},
		{"upgrade bound: unlimited parallel", `driver: {upgradePolicy: {maxParallelUpgrades: 0, maxUnavailable: 10%}}`,
			`driver: {upgradePolicy: {maxUnavailable: 10%}}`},
		{"drain and pod deletion", `driver: {upgradePolicy: {drain: {enable: true, podSelector: "a=b"}, gpuPodDeletion: {force: true}, podDeletion: {deleteEmptyDir: true}}}`,
			`driver: {manager: {drain: {enabled: true, podSelector: "a=b"}, gpuPodDeletion: {force: true, deleteEmptyDir: true}}}`},
		{"sandbox workloads and host paths", `{sandboxWorkloads: {enabled: true, mode: kata}, hostPaths: {rootFS: /host}, mig: {strategy: mixed}, cdi: {enabled: false}}`,
			`global: {sandboxWorkloads: {enabled: true, mode: kata}, hostPaths: {rootFS: /host}, mig: {strategy: mixed}, cdi: {enabled: false}}`},
		{"daemonsets", `daemonsets: {priorityClassName: p, labels: {a: b}, annotations: {c: d}, updateStrategy: OnDelete, rollingUpdate: {maxUnavailable: "3"}}`,
			`global: {priorityClassName: p, podLabels: {a: b}, podAnnotations: {c: d}, updateStrategy: {type: OnDelete, rollingUpdate: {maxUnavailable: 3}}}`},
		{"env lists", `{devicePlugin: {env: [{name: A, value: "1"}]}, validator: {plugin: {env: [{name: WITH_WORKLOAD, value: "true"}]}}}`,
			`{devicePlugin: {extraEnv: {A: "1"}}, validator: {plugin: {env: {WITH_WORKLOAD: "true"}}}}`},
		{"k3s toolkit env", `toolkit: {env: [{name: CONTAINERD_CONFIG, value: /var/lib/rancher/k3s/agent/etc/containerd/config.toml}, {name: CONTAINERD_SOCKET, value: /run/k3s/containerd/containerd.sock}]}`,
			`global: {platform: k3s}`},
		{"k3s template", `toolkit: {env: [{name: CONTAINERD_CONFIG, value: /var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl}]}`,
			`{global: {platform: k3s}, toolkit: {runtimeConfig: {config: /var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl}}}`},
		{"generic toolkit env", `toolkit: {env: [{name: CONTAINERD_CONFIG, value: /etc/containerd/config.toml}, {name: CONTAINERD_RUNTIME_CLASS, value: nvidia-x}, {name: FOO, value: bar}]}`,
			`{global: {runtimeClassName: nvidia-x}, toolkit: {runtimeConfig: {config: /etc/containerd/config.toml}, extraEnv: {FOO: bar}}}`},
		{"time slicing", `devicePlugin: {config: {create: true, name: ts, default: any, data: {any: "version: v1"}}}`,
			`devicePlugin: {config: {create: true, name: ts, default: any, data: {any: "version: v1"}}}`},
		{"vgpu licensing", `{vgpuManager: {enabled: true, repository: r.example.com/nvidia, version: "570.1"}, driver: {licensingConfig: {secretName: lic, nlsEnabled: true}}}`,
			`{vgpuManager: {enabled: true, image: {registry: r.example.com, repository: nvidia/vgpu-manager, tag: "570.1"}}, driver: {licensingConfig: {secretName: lic, nlsEnabled: true}},
				global: {stackImage: {registry: r.example.com}}}`},
		{"openshift and nfd", `{platform: {openshift: true}, nfd: {enabled: false}, psa: {enabled: true}}`,
			`{global: {platform: openshift}, nfd: {mode: external}}`},
		{"pull secrets and precompiled", `driver: {imagePullSecrets: [s], usePrecompiled: true, useOpenKernelModules: true}`,
			`driver: {imagePullSecrets: [s], usePrecompiled: true, kernelModuleType: open}`},
		{"MIG config the operator created", `migManager: {config: {create: true, name: custom-mig, default: all-1g.10gb, data: {config.yaml: "version: v1\n"}}}`,
			`migManager: {config: {default: all-1g.10gb, data: "version: v1\n"}}`},
		{"MIG config of your own", `migManager: {config: {name: my-mig, default: all-balanced}}`,
			`migManager: {config: {name: my-mig, default: all-balanced}}`},
		{"gds inside the driver", `gds: {enabled: true, version: "2.20"}`, `driver: {gds: {enabled: true, image: {tag: "2.20"}}}`},
		{"own images are not carried over", `validator: {repository: nvcr.io/nvidia, image: gpu-operator, version: v26.7.0}`, `{}`},
		{"NVIDIADriver pools", `
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: default}
spec: {default: true, version: "595.91.07", licensingConfig: {name: lic-cm}}
---
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: A100_Pool-with-a-very-long-name}
spec: {repository: nvcr.io/nvidia, image: driver, version: "570.1", nodeSelector: {pool: a}, repoConfig: {name: mirror}, useOpenKernelModules: true}`,
			`driver:
  image: {tag: "595.91.07"}
  licensingConfig: {configMapName: lic-cm}
  pools:
    - name: a100-pool-with-a-ver
      nodeSelector: {matchLabels: {pool: a}}
      image: {registry: nvcr.io, repository: nvidia/driver, tag: "570.1"}
      repoConfig: {configMapName: mirror}
      kernelModuleType: open`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantValues(t, convertYAML(t, tc.in), tc.want)
		})
	}
}

// TestDriversWithoutDefault: without a default NVIDIADriver the operator left unselected nodes without a driver,
// which the default pool here would not; the report says so.
func TestDriversWithoutDefault(t *testing.T) {
	r := convertYAML(t, `
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata: {name: a}
spec: {version: "570.1", nodeSelector: {pool: a}}`)
	if e := entry(t, r, "NVIDIADriver (none with default: true)"); e.Action != Decision {
		t.Errorf("no default NVIDIADriver: %s", e.Action)
	}
}

func TestReportSaysWhy(t *testing.T) {
	r := convertYAML(t, `{driver: {version: "1", upgradePolicy: {waitForCompletion: {timeoutSeconds: 600}}, certConfig: {name: ca}}, operator: {defaultRuntime: crio, logging: {level: debug}}, kataManager: {enabled: true}, madeUp: {x: 1}, node-feature-discovery: {worker: {tolerations: []}}, toolkit: {env: [{name: CONTAINERD_SET_AS_DEFAULT, value: "true"}]}}`)
	for key, want := range map[string]struct {
		a  Action
		to string
	}{
		"driver.version": {Mapped, "driver.image.tag"},
		"driver.upgradePolicy.waitForCompletion.timeoutSeconds": {Decision, ""},
		"driver.certConfig.name":                                {Decision, "driver.certConfig.name"},
		"operator.defaultRuntime":                               {Mapped, "toolkit.runtime"},
		"operator.logging":                                      {Dropped, ""},
		"kataManager":                                           {Decision, ""},
		"madeUp.x":                                              {Unknown, ""},
		"toolkit.env":                                           {Decision, ""},
	} {
		e := entry(t, r, key)
		if e.Action != want.a || (want.to != "" && !slices.Contains(e.To, want.to)) {
			t.Errorf("%s: %s -> %v (%s), want %s -> %s", key, e.Action, e.To, e.Why, want.a, want.to)
		}
	}
	if _, ok := getPath(r.Values, "driver.certConfig"); ok {
		t.Error("certConfig.name written without keys: the chart refuses that")
	}
	var buf bytes.Buffer
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "madeUp.x") || !strings.Contains(buf.String(), "no place in kube-gpu-stack") {
		t.Errorf("report does not name the key with no place:\n%s", buf.String())
	}
}

// TestFromCluster reads a ClusterPolicy, two NVIDIADrivers and the nodes through a fake dynamic client.
func TestFromCluster(t *testing.T) {
	obj := func(gvk schema.GroupVersionKind, name string, body map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: body}
		u.SetGroupVersionKind(gvk)
		u.SetName(name)
		return u
	}
	cp := obj(schema.GroupVersionKind{Group: "nvidia.com", Version: "v1", Kind: "ClusterPolicy"}, ClusterPolicyName, map[string]any{"spec": map[string]any{
		"driver":           map[string]any{"useNvidiaDriverCRD": true, "usePrecompiled": false},
		"toolkit":          map[string]any{"env": []any{map[string]any{"name": "CONTAINERD_CONFIG", "value": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"}}},
		"sandboxWorkloads": map[string]any{"enabled": true},
	}})
	ndGVK := schema.GroupVersionKind{Group: "nvidia.com", Version: "v1alpha1", Kind: "NVIDIADriver"}
	d1 := obj(ndGVK, "default", map[string]any{"spec": map[string]any{"default": true, "version": "595.91.07"}})
	d2 := obj(ndGVK, "h100", map[string]any{"spec": map[string]any{"version": "580", "usePrecompiled": true, "nodeSelector": map[string]any{"nvidia.com/driver.pool": "h100"}}})
	node := func(name string, labels map[string]any) *unstructured.Unstructured {
		return obj(schema.GroupVersionKind{Version: "v1", Kind: "Node"}, name, map[string]any{"metadata": map[string]any{"name": name, "labels": labels}})
	}
	gpu := map[string]any{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
		"feature.node.kubernetes.io/kernel-version.full": "6.8.0-60-generic", "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
		"feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04"}
	other := maps.Clone(gpu)
	other["feature.node.kubernetes.io/kernel-version.full"] = "6.8.0-71-generic"
	other["nvidia.com/mig.config"] = "all-1g.10gb"
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		ClusterPolicyGVR: "ClusterPolicyList", NVIDIADriverGVR: "NVIDIADriverList", nodeGVR: "NodeList",
	}, cp, d1, d2, node("gpu-1", gpu), node("gpu-2", other), node("cpu-1", map[string]any{"kubernetes.io/os": "linux"}))

	c, err := FromCluster(t.Context(), dyn)
	if err != nil {
		t.Fatal(err)
	}
	r := ConvertCluster(c)
	wantValues(t, r, `
global: {platform: rke2, sandboxWorkloads: {enabled: true}}
driver:
  usePrecompiled: false
  image: {tag: "595.91.07"}
  kernels: [6.8.0-60-generic, 6.8.0-71-generic]
  pools:
    - name: h100
      nodeSelector: {matchLabels: {nvidia.com/driver.pool: h100}}
      image: {tag: "580"}
      usePrecompiled: true`)
	var labels []string
	for _, l := range r.Nodes {
		labels = append(labels, l.Label+"="+l.Value+":"+string(rune('0'+l.Nodes)))
	}
	want := []string{"nvidia.com/gpu-driver-upgrade-state=upgrade-done:2", "nvidia.com/gpu.deploy.driver=true:2", "nvidia.com/gpu.present=true:2", "nvidia.com/mig.config=all-1g.10gb:1"}
	if !reflect.DeepEqual(labels, want) {
		t.Errorf("node labels %v, want %v", labels, want)
	}
	if e := entry(t, r, "(nodes) feature.node.kubernetes.io/system-os_release"); !strings.Contains(e.Why, "ubuntu24.04 x2") {
		t.Errorf("OS summary %q", e.Why)
	}
	for _, key := range []string{"NVIDIADriver/h100.spec.version", "NVIDIADriver/default.spec.default", "toolkit.env", "driver.useNvidiaDriverCRD"} {
		entry(t, r, key)
	}
}

// --from-cluster on a cluster without the operator's ClusterPolicy used to exit 0 with an empty values file: the
// report's one line was easy to miss, and installing those values drops every setting. It fails, naming what it
// looked for; a single ClusterPolicy of another name (OpenShift's documented one is gpu-cluster-policy) is read.
func TestFromClusterNeedsTheClusterPolicy(t *testing.T) {
	kinds := map[schema.GroupVersionResource]string{ClusterPolicyGVR: "ClusterPolicyList", NVIDIADriverGVR: "NVIDIADriverList", nodeGVR: "NodeList"}
	policy := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"sandboxWorkloads": map[string]any{"enabled": true}}}}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "nvidia.com", Version: "v1", Kind: "ClusterPolicy"})
		u.SetName(name)
		return u
	}
	for name, tc := range map[string]struct {
		objs []runtime.Object
		want []string // in the error
	}{
		"none":    {nil, []string{`no ClusterPolicy "cluster-policy"`, "nvidia.com/v1", "-f"}},
		"several": {[]runtime.Object{policy("a"), policy("b")}, []string{`no ClusterPolicy "cluster-policy"`, "a, b"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromCluster(t.Context(), dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds, tc.objs...))
			if err == nil {
				t.Fatal("no error: a cluster without the operator's ClusterPolicy converts to nothing")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}

	c, err := FromCluster(t.Context(), dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds, policy("gpu-cluster-policy")))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "gpu-cluster-policy" {
		t.Errorf("read ClusterPolicy %q, want gpu-cluster-policy", c.Policy)
	}
	wantValues(t, ConvertCluster(c), `{global: {sandboxWorkloads: {enabled: true}}}`)
}

// The operator finds each node's OS itself; this chart runs a driver only on the OS tags driver.os lists. From a
// values file alone the report said nothing about it, so a site on another OS learnt it from nodes with no driver.
func TestOSHintWithoutTheNodes(t *testing.T) {
	in, err := ParseFile([]byte(`{driver: {version: "580.95.05"}}`))
	if err != nil {
		t.Fatal(err)
	}
	e := entry(t, ConvertCluster(Cluster{Input: in}), "(nodes) feature.node.kubernetes.io/system-os_release")
	if e.Action != Decision || !slices.Contains(e.To, "driver.os") {
		t.Fatalf("OS hint: %s -> %v, want a decision on driver.os", e.Action, e.To)
	}
	for _, want := range []string{"--from-cluster", "kube-gpu-stack plan"} {
		if !strings.Contains(e.Why, want) {
			t.Errorf("the OS hint does not say %q: %s", want, e.Why)
		}
	}
}

// The operator's NFD subchart values were one "needs a decision" line naming no key: the reader had to diff a
// full values copy against the operator's by hand. The line names the keys changed from the operator's defaults,
// and values equal to them (a full upstream copy's) need no decision.
func TestNFDDecisionNamesTheChangedKeys(t *testing.T) {
	r := convertYAML(t, `node-feature-discovery:
  priorityClassName: system-node-critical
  gc: {enable: true, interval: 2h}
  worker:
    tolerations: [{key: dedicated, operator: Exists}]
    serviceAccount: {name: node-feature-discovery, create: false}
  master: {replicaCount: 2}`)
	e := entry(t, r, "node-feature-discovery")
	if e.Action != Decision {
		t.Fatalf("changed NFD values: %s (%s), want a decision", e.Action, e.Why)
	}
	for _, k := range []string{"node-feature-discovery.gc.interval", "node-feature-discovery.worker.tolerations", "node-feature-discovery.master.replicaCount"} {
		if !strings.Contains(e.Why, k) {
			t.Errorf("the decision does not name %s: %s", k, e.Why)
		}
	}
	for _, k := range []string{"priorityClassName", "gc.enable", "serviceAccount"} {
		if strings.Contains(e.Why, k) {
			t.Errorf("the decision names %s, which has the operator's default: %s", k, e.Why)
		}
	}

	same := convertYAML(t, `node-feature-discovery: {priorityClassName: system-node-critical, worker: {serviceAccount: {create: false}}}`)
	if e := entry(t, same, "node-feature-discovery"); e.Action != Dropped {
		t.Errorf("NFD values equal to the operator's defaults: %s (%s), want dropped", e.Action, e.Why)
	}
}

// A full upstream values copy carries gds.imagePullSecrets: [] and gdrcopy.imagePullSecrets: [] beside the site's
// driver.imagePullSecrets; all three go to driver.imagePullSecrets, and the empty ones sorted after the driver's
// used to replace it, so a private-registry site's driver pods had no pull secret. Now the lists add up.
func TestSideContainersPullSecretsAddToTheDrivers(t *testing.T) {
	for name, tc := range map[string]struct {
		gds, gdrcopy []any
		want         []any
	}{
		"empty upstream defaults": {[]any{}, []any{}, []any{"regcred"}},
		"another secret":          {[]any{"gds-cred"}, []any{}, []any{"regcred", "gds-cred"}},
		"the same secret":         {[]any{"regcred"}, []any{"regcred"}, []any{"regcred"}},
	} {
		t.Run(name, func(t *testing.T) {
			in := map[string]any{
				"driver":  map[string]any{"imagePullSecrets": []any{"regcred"}},
				"gds":     map[string]any{"imagePullSecrets": tc.gds},
				"gdrcopy": map[string]any{"imagePullSecrets": tc.gdrcopy},
			}
			got, _ := getPath(Convert(in, nil).Values, "driver.imagePullSecrets")
			if !equal(got, tc.want) {
				t.Fatalf("driver.imagePullSecrets = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPSAIsADecisionNotAMapping: namespace.podSecurityLabels does nothing unless the chart renders the namespace
// (namespace.create=true), so psa.enabled=true is reported as a choice, naming both ways, and writes no value that
// would read as done.
func TestPSAIsADecisionNotAMapping(t *testing.T) {
	r := Convert(map[string]any{"psa": map[string]any{"enabled": true}}, nil)
	if _, ok := r.Values["namespace"]; ok {
		t.Errorf("psa.enabled wrote namespace values %v", r.Values["namespace"])
	}
	for _, e := range r.Report {
		if e.Key == "psa.enabled" {
			if e.Action != Decision || !strings.Contains(e.Why, "namespace.create=true") || !strings.Contains(e.Why, "pod-security.kubernetes.io/enforce=privileged") {
				t.Errorf("psa.enabled reported %s: %s", e.Action, e.Why)
			}
			return
		}
	}
	t.Error("psa.enabled is not in the report")
}

// TestMirroredSiteGetsTheStackImageFromItsMirror: a site whose operand images come from its own registry, with pull
// secrets, is told where this project's own image must come from, and gets it from there with the same secrets; a
// site on the public registries keeps the default.
func TestMirroredSiteGetsTheStackImageFromItsMirror(t *testing.T) {
	r := Convert(map[string]any{
		"driver":       map[string]any{"repository": "mirror.example.com/nvidia", "imagePullSecrets": []any{"mirror-pull"}},
		"toolkit":      map[string]any{"repository": "mirror.example.com/nvidia/k8s"},
		"devicePlugin": map[string]any{"repository": "nvcr.io/nvidia"},
	}, nil)
	if reg, _ := getPath(r.Values, "global.stackImage.registry"); reg != "mirror.example.com" {
		t.Errorf("global.stackImage.registry = %v, want the mirror", reg)
	}
	if ps, _ := getPath(r.Values, "global.imagePullSecrets"); fmt.Sprint(ps) != "[mirror-pull]" {
		t.Errorf("global.imagePullSecrets = %v, want the operands' secret", ps)
	}
	if !slices.ContainsFunc(r.Report, func(e Entry) bool {
		return strings.Contains(e.Why, "mirror.example.com/kube-gpu-stack/kube-gpu-stack") && strings.Contains(e.Why, "image push")
	}) {
		t.Errorf("the report does not say where the project's image must be mirrored: %+v", r.Report)
	}
	public := Convert(map[string]any{"driver": map[string]any{"repository": "nvcr.io/nvidia", "version": "595.91.07"}}, nil)
	if _, set := getPath(public.Values, "global"); set {
		t.Errorf("a site on the public registries got global values %v", public.Values["global"])
	}
}
