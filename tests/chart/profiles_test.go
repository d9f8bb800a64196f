package chart

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// updateGolden rewrites the golden files instead of comparing: make golden (UPDATE_GOLDEN=1 go test ./tests/chart).
var updateGolden = os.Getenv("UPDATE_GOLDEN") == "1"

// profile is one values file under values/ (chartrender.Profile); files are what a render of it takes (the profile,
// then the site example it needs, if any).
type profile struct {
	name, file, minKube string
	files               []string
}

// kubeVersions are the supported Kubernetes versions the profile renders for (chartrender.Profile.KubeVersions).
func (p profile) kubeVersions() []string {
	return chartrender.Profile{Name: p.name, File: p.file, MinKube: p.minKube}.KubeVersions()
}

func profiles(t *testing.T) []profile {
	t.Helper()
	all, err := chartrender.Profiles(chartrender.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	var out []profile
	for _, p := range all {
		out = append(out, profile{name: p.Name, file: p.File, minKube: p.MinKube, files: p.Files()})
	}
	return out
}

// profileFiles are the values files a render of the named profile takes (its site example too, if it needs one).
func profileFiles(t *testing.T, name string) []string {
	t.Helper()
	for _, p := range profiles(t) {
		if p.name == name {
			return p.files
		}
	}
	t.Fatalf("no profile %s", name)
	return nil
}

// umbrella loads the umbrella chart afresh: a render drops disabled subcharts from the chart it is given, so a
// loaded chart serves one render only.
func umbrella(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the umbrella chart with values files and --set overrides for a Kubernetes version.
func render(t *testing.T, kubeVersion string, files []string, set ...string) string {
	t.Helper()
	out, err := renderErr(t, kubeVersion, files, set...)
	if err != nil {
		t.Fatalf("render %v %v: %v", files, set, err)
	}
	return out
}

// renderErr is render that returns the error. Renders are memoized (see renders): many tests render the same
// profile with the same overrides, and the package is bound by rendering.
func renderErr(t *testing.T, kubeVersion string, files []string, set ...string) (string, error) {
	t.Helper()
	key, err := renderKey(kubeVersion, files, set)
	if err != nil {
		return "", err
	}
	renders.Lock()
	r := renders.m[key]
	if r == nil {
		r = &memoRender{}
		renders.m[key] = r
	}
	renders.Unlock()
	r.once.Do(func() { r.out, r.err = renderFresh(t, kubeVersion, files, set...) })
	return r.out, r.err
}

// renderFresh renders without the memo: the determinism test compares a render with a new one.
func renderFresh(t *testing.T, kubeVersion string, files []string, set ...string) (string, error) {
	t.Helper()
	vals, err := chartrender.Values(files, set)
	if err != nil {
		return "", err
	}
	return chartrender.Render(t.Context(), umbrella(t), vals, kubeVersion)
}

// renders are the package's renders so far, by what they were rendered from: the Kubernetes version, the APIs a
// render assumes (chartrender.APIVersions, which a test narrows), the values files' contents (tests write their
// own files, sometimes twice at one path) and the overrides. The chart itself does not change while the tests run.
var renders = struct {
	sync.Mutex
	m map[string]*memoRender
}{m: map[string]*memoRender{}}

type memoRender struct {
	once sync.Once
	out  string
	err  error
}

func renderKey(kubeVersion string, files, set []string) (string, error) {
	var b strings.Builder
	b.WriteString(kubeVersion)
	for _, v := range chartrender.APIVersions {
		fmt.Fprintf(&b, "\x00api %d\x00%s", len(v), v)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\x00file %d\x00%s", len(data), data)
	}
	for _, s := range set {
		fmt.Fprintf(&b, "\x00set %d\x00%s", len(s), s)
	}
	return b.String(), nil
}

// newestKube is the Kubernetes version most tests render for.
var newestKube = chartrender.Newest

// object is one rendered manifest, decoded generically, with the template it came from.
type object struct {
	Source string
	Raw    map[string]any
}

func (o object) kind() string { s, _ := o.Raw["kind"].(string); return s }
func (o object) name() string {
	m, _ := o.Raw["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}

// objects splits a rendered stream into its objects.
func objects(t *testing.T, stream string) []object {
	t.Helper()
	var out []object
	for _, doc := range strings.Split(stream, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		source := ""
		for _, line := range strings.Split(doc, "\n") {
			if s, ok := strings.CutPrefix(line, "# Source: "); ok {
				source = s
				break
			}
		}
		var raw map[string]any
		if err := yaml.Unmarshal([]byte(doc), &raw); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(raw) == 0 {
			continue
		}
		out = append(out, object{Source: source, Raw: raw})
	}
	return out
}

// operandDaemonSets decodes the rendered DaemonSets of one operand (app.kubernetes.io/component), by name.
func operandDaemonSets(t *testing.T, stream, component string) map[string]*appsv1.DaemonSet {
	t.Helper()
	out := map[string]*appsv1.DaemonSet{}
	for _, o := range objects(t, stream) {
		if o.kind() != "DaemonSet" {
			continue
		}
		ds := decode[appsv1.DaemonSet](t, o)
		if ds.Labels["app.kubernetes.io/component"] == component {
			out[ds.Name] = ds
		}
	}
	return out
}

func selects(t *testing.T, terms []corev1.NodeSelectorTerm, node *corev1.Node, what string) bool {
	t.Helper()
	ok, err := schedule.Selects(&corev1.NodeSelector{NodeSelectorTerms: terms}, node)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return ok
}

// rulesFor returns the ClusterRole rules bound to a ServiceAccount of the release namespace.
func rulesFor(t *testing.T, stream, sa string) []rbacv1.PolicyRule {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{}
	var bound []string
	for _, o := range objects(t, stream) {
		switch o.kind() {
		case "ClusterRole":
			roles[o.name()] = decode[rbacv1.ClusterRole](t, o).Rules
		case "ClusterRoleBinding":
			b := decode[rbacv1.ClusterRoleBinding](t, o)
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == chartrender.Namespace {
					bound = append(bound, b.RoleRef.Name)
				}
			}
		}
	}
	var out []rbacv1.PolicyRule
	for _, r := range bound {
		out = append(out, roles[r]...)
	}
	return out
}

// allows reports whether rules grant verb on a core-group resource.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0
	})
}

// TestProfileKubeFloor: a profile that needs a newer Kubernetes than the oldest supported one fails to render on
// the older ones, saying which version it needs.
func TestProfileKubeFloor(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, p := range profiles(t) {
		for _, kv := range chartrender.KubeVersions {
			if slices.Contains(p.kubeVersions(), kv) {
				continue
			}
			checked++
			_, err := renderErr(t, kv, p.files)
			if err == nil || !strings.Contains(err.Error(), "Kubernetes >= "+p.minKube) {
				t.Errorf("%s on %s: got %v, want an error naming Kubernetes >= %s", p.name, kv, err, p.minKube)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no profile needs a newer Kubernetes than the oldest supported: the DRA profiles lost their floor")
	}
}
