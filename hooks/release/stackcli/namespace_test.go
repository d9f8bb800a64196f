package stackcli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecheck"
)

// fakeAPI answers the list requests of the admin's views with the release DaemonSets it holds (no pods, no nodes)
// and records the namespaces it was asked about.
type fakeAPI struct {
	mu         sync.Mutex
	namespaces []string
	releases   map[string][]string // namespace -> the releases whose DaemonSets live there
	reports    map[string]string   // namespace -> the release whose post-install report is saved there
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	ns := ""
	if i := slices.Index(path, "namespaces"); i >= 0 && i+1 < len(path) {
		ns = path[i+1]
		f.namespaces = append(f.namespaces, ns)
	}
	var list runtime.Object
	switch path[len(path)-1] {
	case "daemonsets":
		l := &appsv1.DaemonSetList{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSetList"}}
		for _, rel := range f.releases[ns] {
			l.Items = append(l.Items, appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-daemonset", Namespace: ns,
				Labels: map[string]string{"app.kubernetes.io/part-of": "kube-gpu-stack", "app.kubernetes.io/instance": rel}}})
		}
		list = l
	case "pods":
		list = &corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}}
	case "nodes":
		list = &corev1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}}
	case DefaultReportConfigMap:
		if rel, ok := f.reports[ns]; ok {
			list = &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
				ObjectMeta: metav1.ObjectMeta{Name: DefaultReportConfigMap, Namespace: ns},
				Data:       map[string]string{releasecheck.ReportJSONKey: `{"release":"` + rel + `","namespace":"` + ns + `","nodes":[]}`}}
			break
		}
		fallthrough
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: r.URL.Path + " not found"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

func (f *fakeAPI) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Compact(slices.Clone(f.namespaces))
}

// kubeconfigWithout writes a kubeconfig for server whose context names no namespace, as most users' do.
func kubeconfigWithout(t *testing.T, server string) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// run runs the in-cluster binary's command line, as main does: an error is a non-zero exit.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// `upgrade status` used to print a table of `-` and exit 0 where no release was: with no -n (the context's
// "default" namespace) or a misspelt --release. It fails naming where it looked and what it found there.
func TestUpgradeStatusFailsWhereNoReleaseIs(t *testing.T) {
	api := &fakeAPI{releases: map[string][]string{"gpu-operator": {"gpu"}, "elsewhere": {"other"}}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := kubeconfigWithout(t, srv.URL)

	for _, tc := range []struct {
		name string
		args []string
		want []string // in the error
	}{
		{"a misspelt release", []string{"-n", "gpu-operator", "--release", "gpuu"},
			[]string{`release "gpuu"`, `namespace "gpu-operator" (--namespace)`, "app.kubernetes.io/instance=gpuu", `releases there: gpu`}},
		{"no release in the namespace", []string{"-n", "default"},
			[]string{`namespace "default" (--namespace)`, "app.kubernetes.io/part-of=kube-gpu-stack", "-n"}},
		{"another release's namespace", []string{"-n", "elsewhere", "--release", "gpu"},
			[]string{`release "gpu"`, `namespace "elsewhere"`, "releases there: other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"upgrade", "status", "--kubeconfig", kubeconfig}, tc.args...)...)
			if err == nil {
				t.Fatalf("exit 0, want a failure; printed:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q: %v", w, err)
				}
			}
		})
	}

	// status --live evaluates the namespace as it is: one with no release would pass, nothing being there to wait for
	if out, err := run(t, "status", "--live", "--kubeconfig", kubeconfig, "-n", "default", "--release", "gpu"); err == nil || !strings.Contains(err.Error(), `no kube-gpu-stack release "gpu" in namespace "default" (--namespace)`) {
		t.Errorf("status --live where no release is: %v\n%s", err, out)
	}

	// the release is there: its table, exit 0
	out, err := run(t, "upgrade", "status", "--kubeconfig", kubeconfig, "--release", "gpu")
	if err != nil || !strings.HasPrefix(out, "NODE") {
		t.Errorf("upgrade status of an existing release: %v\n%s", err, out)
	}
}

// The namespace holds one saved report; `status --release` of another release used to print that one's table.
func TestStatusRefusesAnotherReleasesReport(t *testing.T) {
	srv := httptest.NewServer(&fakeAPI{reports: map[string]string{"gpu-operator": "gpu"}})
	defer srv.Close()
	kubeconfig := kubeconfigWithout(t, srv.URL)
	if out, err := run(t, "status", "--kubeconfig", kubeconfig, "--release", "gpu"); err != nil || !strings.Contains(out, "kube-gpu-stack release gpu in gpu-operator") {
		t.Errorf("status of the saved report's release: %v\n%s", err, out)
	}
	out, err := run(t, "status", "--kubeconfig", kubeconfig, "--release", "gpu2")
	if err == nil || !strings.Contains(err.Error(), `is release "gpu"'s, not "gpu2"'s`) {
		t.Errorf("status of another release: %v\n%s", err, out)
	}
}

// With no -n and a kubeconfig context that names no namespace, status and upgrade status look in the chart's
// default namespace, as plan does, not in "default"; and the error says the namespace came from there.
func TestAdminViewsDefaultToTheChartsNamespace(t *testing.T) {
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	kubeconfig := kubeconfigWithout(t, srv.URL)

	_, err := run(t, "upgrade", "status", "--kubeconfig", kubeconfig, "--release", "gpu")
	if err == nil || !strings.Contains(err.Error(), `namespace "gpu-operator" (the chart's default`) {
		t.Errorf("upgrade status with no -n: %v", err)
	}
	_, err = run(t, "status", "--kubeconfig", kubeconfig)
	if err == nil || !strings.Contains(err.Error(), "gpu-operator/"+DefaultReportConfigMap) {
		t.Errorf("status with no -n: %v", err)
	}
	if got := api.asked(); !slices.Equal(got, []string{"gpu-operator"}) {
		t.Errorf("asked about namespaces %v, want only gpu-operator", got)
	}
}

// Each view's help says which namespace it reads when -n is not given.
func TestAdminViewsHelpNamesTheirNamespace(t *testing.T) {
	for _, args := range [][]string{{"status", "--help"}, {"upgrade", "status", "--help"}, {"upgrade", "retry", "--help"}} {
		out, err := run(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "kubeconfig context") || !strings.Contains(out, "gpu-operator") {
			t.Errorf("%s does not say which namespace it reads:\n%s", strings.Join(args, " "), out)
		}
	}
}

// The namespace: --namespace, else the kubeconfig context's, else the chart's default.
func TestAdminNamespace(t *testing.T) {
	withNS := flagsFor(t, "https://127.0.0.1:6443") // its context names gpu
	without := flagsFor(t, "https://127.0.0.1:6443")
	*without.KubeConfig = kubeconfigWithout(t, "https://127.0.0.1:6443")
	flag := flagsFor(t, "https://127.0.0.1:6443")
	set := "team-gpu"
	flag.Namespace = &set
	for _, tc := range []struct {
		name     string
		scope    Scope
		ns, from string
	}{
		{"--namespace", Scope{Flags: flag}, "team-gpu", "--namespace"},
		{"the context's", Scope{Flags: withNS}, "gpu", "the kubeconfig context c"},
		{"none", Scope{Flags: without}, "gpu-operator", "the chart's default"},
	} {
		ns, from, err := tc.scope.Namespace()
		if err != nil || ns != tc.ns || !strings.HasPrefix(from, tc.from) {
			t.Errorf("%s: %q from %q (%v), want %q from %q", tc.name, ns, from, err, tc.ns, tc.from)
		}
	}
}
