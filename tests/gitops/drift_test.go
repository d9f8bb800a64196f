package gitops

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// fieldManager is the manager Argo CD's server-side apply writes as.
const fieldManager = "argocd-controller"

var crdKind = schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}

// TestServerSideApplyShowsNoDrift renders every values profile for the newest supported Kubernetes and
// server-side applies every object (hooks and test pods included) as a dry run, as Argo CD's server-side diff
// does; every field the chart sets must come back with the same type and value, or a live read would show it
// differently and the application would never be in sync. The chart's own CRDs are applied for real first, so
// the objects of those kinds can be checked too.
func TestServerSideApplyShowsNoDrift(t *testing.T) {
	a := newApplier(t)
	// With nfd.mode=external another chart installs the NFD CRDs; the chart's bundled ones stand in for it.
	crds, _ := splitCRDs(renderObjects(t, nil))
	a.installCRDs(t, crds)
	// The monitoring profile's ServiceMonitors and PrometheusRule need the Prometheus Operator's CRDs.
	a.installCRDs(t, prometheusOperatorCRDs(t))

	var objects, fields int
	for _, files := range profileFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(files[0]), ".yaml"), func(t *testing.T) {
			objs := renderObjects(t, files)
			// CRDs go in for real (a dry run cannot serve their kinds), the rest as a dry run.
			crds, rest := splitCRDs(objs)
			var checked int
			for _, o := range append(a.installCRDs(t, crds), a.applyAll(t, rest, true)...) {
				checked += o.fields
				for _, d := range o.drift {
					t.Errorf("%s: %s", o.id, d)
				}
			}
			t.Logf("%d objects, %d fields checked", len(objs), checked)
			objects += len(objs)
			fields += checked
		})
	}
	t.Logf("%d objects, %d fields checked in all", objects, fields)
}

// TestServerSideApplyNamesDrift is the check's control: resources written in a form the API server canonicalizes
// ("1000m" CPUs, "1024Mi" of memory) must be named, with the server's form, and nothing else.
func TestServerSideApplyNamesDrift(t *testing.T) {
	a := newApplier(t)
	objs := renderObjects(t, []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")},
		"devicePlugin.resources.limits.cpu=1000m", "devicePlugin.resources.limits.memory=1024Mi")
	crds, rest := splitCRDs(objs)
	a.installCRDs(t, crds)
	var got []string
	for _, o := range a.applyAll(t, rest, true) {
		for _, d := range o.drift {
			got = append(got, o.id+": "+d)
		}
	}
	want := []string{
		`DaemonSet gpu-operator/nvidia-device-plugin-daemonset: .spec.template.spec.containers[0].resources.limits.cpu: rendered "1000m", server "1"`,
		`DaemonSet gpu-operator/nvidia-device-plugin-daemonset: .spec.template.spec.containers[0].resources.limits.memory: rendered "1024Mi", server "1Gi"`,
		// the MPS control daemon takes the device plugin's resources too
		`DaemonSet gpu-operator/nvidia-device-plugin-mps-control-daemon: .spec.template.spec.containers[0].resources.limits.cpu: rendered "1000m", server "1"`,
		`DaemonSet gpu-operator/nvidia-device-plugin-mps-control-daemon: .spec.template.spec.containers[0].resources.limits.memory: rendered "1024Mi", server "1Gi"`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("drift:\n got  %q\n want %q", got, want)
	}
}

// TestTestPodTolerationsShowNoDrift: the API server adds its default NoExecute tolerations (not-ready and
// unreachable, 300 s) to a bare Pod unless the Pod already tolerates those taints; the chart renders them for the
// helm test Pod the same way, whatever tolerations the values give it, and only where admission would add them.
func TestTestPodTolerationsShowNoDrift(t *testing.T) {
	a := newApplier(t)
	profile := filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")
	for _, tc := range []struct {
		name     string
		set      []string
		defaults int // default tolerations the chart must add
	}{
		{"none given", nil, 2},
		{"every taint tolerated", []string{"hooks.tolerations[0].operator=Exists"}, 0},
		{"every NoExecute tolerated", []string{"hooks.tolerations[0].operator=Exists", "hooks.tolerations[0].effect=NoExecute"}, 0},
		{"not-ready for 60s", []string{"hooks.tolerations[0].key=node.kubernetes.io/not-ready", "hooks.tolerations[0].operator=Exists",
			"hooks.tolerations[0].effect=NoExecute", "hooks.tolerations[0].tolerationSeconds=60"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []renderedObject
			for _, o := range renderObjects(t, []string{profile}, tc.set...) {
				if o.gvk.Kind == "Pod" {
					pods = append(pods, o)
				}
			}
			if len(pods) != 1 {
				t.Fatalf("want the one helm test Pod, got %d pods", len(pods))
			}
			tolerations, _, _ := unstructured.NestedSlice(pods[0].fields, "spec", "tolerations")
			defaults := 0
			for _, tol := range tolerations {
				if tol, _ := tol.(map[string]any); fmt.Sprint(tol["tolerationSeconds"]) == "300" {
					defaults++
				}
			}
			if defaults != tc.defaults {
				t.Errorf("rendered %d default tolerations, want %d: %v", defaults, tc.defaults, tolerations)
			}
			for _, o := range a.applyAll(t, pods, true) {
				for _, d := range o.drift {
					t.Errorf("%s: %s", o.id, d)
				}
			}
		})
	}
}

// TestDriftNamesEveryDifferingField feeds the comparison a rendered object and a server's answer with known
// differences: each must be named by path, and fields the server adds must not be.
func TestDriftNamesEveryDifferingField(t *testing.T) {
	rendered := decode(t, `
spec:
  replicas: 1
  strategy: {rollingUpdate: {maxUnavailable: "25%"}}
  containers:
  - name: a
    resources: {limits: {cpu: 1000m, memory: 1Gi}}
    privileged: true
    env: []
  nodeSelector: {}
  priorityClassName: null
  tolerations: [{operator: Exists}, {key: b}]
  weird.key/x: "on"
`)
	server := map[string]any{"spec": map[string]any{
		"replicas":    int64(1),
		"strategy":    map[string]any{"rollingUpdate": map[string]any{"maxUnavailable": int64(25)}},
		"containers":  []any{map[string]any{"name": "a", "resources": map[string]any{"limits": map[string]any{"cpu": "1", "memory": "1Gi"}}, "privileged": "true", "terminationMessagePath": "/dev/termination-log"}},
		"tolerations": []any{map[string]any{"operator": "Exists"}},
		"weird.key/x": "on",
		"dnsPolicy":   "ClusterFirst",
	}}
	var got []string
	leaves := diffFields(".", rendered, server, &got)
	want := []string{
		`.spec.containers[0].env: rendered [], server absent`,
		`.spec.containers[0].privileged: rendered true, server "true"`,
		`.spec.containers[0].resources.limits.cpu: rendered "1000m", server "1"`,
		`.spec.nodeSelector: rendered {}, server absent`,
		`.spec.priorityClassName: rendered null, server absent`,
		`.spec.strategy.rollingUpdate.maxUnavailable: rendered "25%", server 25`,
		`.spec.tolerations: rendered 2 items, server 1`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("drift:\n got  %q\n want %q", got, want)
	}
	if leaves != 11 {
		t.Errorf("compared %d fields, want 11", leaves)
	}
}

// renderedObject is one object of a render: the JSON sent to the server, and the same decoded with its numbers
// as written.
type renderedObject struct {
	source   string
	body     []byte
	fields   map[string]any
	gvk      schema.GroupVersionKind
	name, ns string
}

// applied is the outcome of applying one object.
type applied struct {
	id     string
	fields int
	drift  []string
}

// prometheusOperatorCRDs are the ServiceMonitor and PrometheusRule CRDs kube-prometheus-stack installs
// (testdata/prometheus-operator).
func prometheusOperatorCRDs(t *testing.T) []renderedObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "prometheus-operator", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Prometheus Operator CRDs in testdata/prometheus-operator: %v", err)
	}
	var out []renderedObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parseObjects(t, string(b))...)
	}
	return out
}

// profileFiles lists every values profile, each as the values files a render of it takes (its site example too,
// if it needs one).
func profileFiles(t *testing.T) [][]string {
	t.Helper()
	profiles, err := chartrender.Profiles(chartrender.RepoRoot())
	if err != nil {
		t.Fatalf("no values profiles found: %v", err)
	}
	var out [][]string
	for _, p := range profiles {
		out = append(out, p.Files())
	}
	return out
}

// renderObjects renders the chart with the values files (none: the chart's defaults) and --set overrides for the
// newest Kubernetes the golden tests use, and decodes every object of the stream, hooks included.
func renderObjects(t *testing.T, files []string, set ...string) []renderedObject {
	t.Helper()
	stream, err := chartrender.RenderRepo(t.Context(), files, set)
	if err != nil {
		t.Fatalf("render %v: %v", files, err)
	}
	out := parseObjects(t, stream)
	if len(out) == 0 {
		t.Fatalf("render %v has no objects", files)
	}
	return out
}

func decode(t *testing.T, y string) map[string]any {
	t.Helper()
	body, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return decodeJSON(t, body)
}

// decodeJSON keeps numbers as written (json.Number), so a rendered 1 and a rendered 1.5 stay what they are.
func decodeJSON(t *testing.T, body []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// applier server-side applies rendered objects through a dynamic client, mapping kinds through discovery.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// newApplier also creates the release namespace, where the chart's namespaced objects go.
func newApplier(t *testing.T) *applier {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chartrender.Namespace}}
	if _, err := kube.Client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dyn, mapper := dynamicClients(t)
	return &applier{dyn: dyn, mapper: mapper}
}

// splitCRDs separates a render's CRDs from its other objects.
func splitCRDs(objs []renderedObject) (crds, rest []renderedObject) {
	for _, o := range objs {
		if o.gvk.GroupKind() == crdKind {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	return crds, rest
}

// installCRDs applies CRDs for real, compares what the server stored, and waits until the API server serves
// their kinds.
func (a *applier) installCRDs(t *testing.T, crds []renderedObject) []applied {
	t.Helper()
	out := a.applyAll(t, crds, false)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, o := range crds {
		res, err := a.resource(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			got, err := res.Get(ctx, o.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s never became established: %v", o.name, err)
		}
	}
	if len(crds) > 0 {
		a.mapper.Reset() // the new kinds are in discovery now
	}
	return out
}

// applyAll applies each object (as a dry run if dryRun) and compares the answer with what was rendered.
func (a *applier) applyAll(t *testing.T, objs []renderedObject, dryRun bool) []applied {
	t.Helper()
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var out []applied
	for _, o := range objs {
		res, err := a.resource(t.Context(), o)
		if err != nil {
			t.Fatalf("%s: %v", o.source, err)
		}
		got, err := res.Patch(t.Context(), o.name, types.ApplyPatchType, o.body, opts)
		if err != nil {
			t.Fatalf("%s %s (%s): server-side apply: %v", o.gvk.Kind, o.name, o.source, err)
		}
		r := applied{id: o.gvk.Kind + " " + got.GetName()}
		if got.GetNamespace() != "" {
			r.id = o.gvk.Kind + " " + got.GetNamespace() + "/" + got.GetName()
		}
		r.fields = diffFields(".", o.fields, got.Object, &r.drift)
		out = append(out, r)
	}
	return out
}

// resource is the dynamic client for o's kind, in the release namespace when the kind is namespaced and the
// chart named none (as helm and Argo CD apply it). A kind the API server does not serve yet is looked up again
// for a few seconds: discovery can trail a CRD's establishment.
func (a *applier) resource(ctx context.Context, o renderedObject) (dynamic.ResourceInterface, error) {
	var m *meta.RESTMapping
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var err error
		m, err = a.mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
		if meta.IsNoMatchError(err) {
			a.mapper.Reset()
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("no API serves %s: %w", o.gvk, err)
	}
	res := a.dyn.Resource(m.Resource)
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return res, nil
	}
	ns := o.ns
	if ns == "" {
		ns = chartrender.Namespace
	}
	return res.Namespace(ns), nil
}

// diffFields walks every field the chart rendered and appends, for each one the server's object does not hold
// with the same JSON type and value, "path: rendered X, server Y". Fields only the server has (defaults, status)
// are not the chart's and are not compared. Lists are compared by index. It returns how many leaf fields it
// compared.
func diffFields(path string, rendered, server any, drift *[]string) int {
	switch r := rendered.(type) {
	case map[string]any:
		s, ok := server.(map[string]any)
		if !ok {
			*drift = append(*drift, fmt.Sprintf("%s: rendered %s, server %s", path, show(rendered), show(server)))
			return 1
		}
		n := 0
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if len(keys) == 0 {
			return 1 // an empty map the server kept
		}
		for _, k := range keys {
			p := join(path, k)
			sv, ok := s[k]
			if !ok {
				*drift = append(*drift, fmt.Sprintf("%s: rendered %s, server absent", p, show(r[k])))
				n++
				continue
			}
			n += diffFields(p, r[k], sv, drift)
		}
		return n
	case []any:
		s, ok := server.([]any)
		if !ok {
			*drift = append(*drift, fmt.Sprintf("%s: rendered %s, server %s", path, show(rendered), show(server)))
			return 1
		}
		if len(r) != len(s) {
			*drift = append(*drift, fmt.Sprintf("%s: rendered %d items, server %d", path, len(r), len(s)))
			return 1
		}
		if len(r) == 0 {
			return 1
		}
		n := 0
		for i := range r {
			n += diffFields(fmt.Sprintf("%s[%d]", path, i), r[i], s[i], drift)
		}
		return n
	default:
		if show(rendered) != show(server) {
			*drift = append(*drift, fmt.Sprintf("%s: rendered %s, server %s", path, show(rendered), show(server)))
		}
		return 1
	}
}

// join appends a key to a field path, bracketing keys that are not plain identifiers (label and annotation keys).
func join(path, key string) string {
	if path == "." {
		path = ""
	}
	if plainKey.MatchString(key) {
		return path + "." + key
	}
	return fmt.Sprintf("%s[%q]", path, key)
}

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// show is a value as JSON, which is what Argo CD compares; long values are cut.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	if s := string(b); len(s) <= 80 {
		return s
	}
	return string(b[:77]) + "..."
}
