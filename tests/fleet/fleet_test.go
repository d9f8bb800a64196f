// Package fleet proves the admin's view of several clusters (`kube-gpu-stack status --context a --context b`) on
// two real local control planes, each with the chart installed through Helm and its nodes played by the kubelet
// stand-in, against a golden report: one cluster as its values file says, the other with a value changed at
// install, a node whose GPU health condition is False and a node whose driver change failed.
//
//	KUBEBUILDER_ASSETS=$(./ci/build-controlplane.sh) go test ./tests/fleet/
package fleet

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/admincli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/fleetview"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

var alpha *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(kubelet.RunPackage(m, "fleet", nodes(), func(c *cluster.Cluster, _ *kubelet.Kubelet) { alpha = c }))
}

func nodes() []*corev1.Node {
	var out []*corev1.Node
	for _, n := range nodefixtures.Rollout(3) {
		out = append(out, n.Object())
	}
	return out
}

const release, namespace = "gpu", "gpu-operator"

// valuesFile is what both clusters should run.
var valuesFile = filepath.Join("testdata", "fleet-values.yaml")

func TestStatusOfTwoClusters(t *testing.T) {
	ctx := t.Context()
	beta, err := kubelet.StartEnv(ctx, nodes(), cluster.LogSink())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(beta.Stop)
	installed := make(chan error, 2)
	for _, i := range []struct {
		c   *cluster.Cluster
		set []string
	}{
		{alpha, nil},
		{beta.Cluster, []string{"driver.upgradePolicy.maxUnavailable=1"}},
	} {
		go func() {
			_, err := install.Target{Kubeconfig: i.c.Kubeconfig, Release: release, Namespace: namespace, Timeout: 5 * time.Minute, NoWait: true}.
				Install(ctx, []string{valuesFile}, i.set...)
			installed <- err
		}()
	}
	for range 2 {
		if err := <-installed; err != nil {
			t.Fatal(err)
		}
	}
	// beta: a GPU whose health condition is False, and a node whose driver change failed
	b := beta.Cluster.Client
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: fleetview.DefaultHealthCondition, Status: corev1.ConditionFalse, Reason: "FatalXid",
		Message: "GPU 3 (GPU-3): Xid 79", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}}})
	if _, err := b.CoreV1().Nodes().PatchStatus(ctx, "gpu-02", patch); err != nil {
		t.Fatal(err)
	}
	failed, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels":      map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)},
		"annotations": map[string]string{nodestate.UpgradeReasonAnnotation: "unload: module nvidia is in use by pid 4242 (nv-hostengine)"}}})
	if _, err := b.CoreV1().Nodes().Patch(ctx, "gpu-03", types.StrategicMergePatchType, failed, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// the view reads with an account that may only get, list and watch: a write it tried would be refused, and the
	// report would not be the golden one
	kubeconfig := twoContexts(t, map[string]*cluster.Cluster{"alpha": alpha, "beta": beta.Cluster})

	out, err := status(ctx, "--kubeconfig", kubeconfig, "--context", "alpha", "--context", "beta", "--values", valuesFile)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	golden(t, "fleet.golden", out)
	md, err := status(ctx, "--kubeconfig", kubeconfig, "--all-contexts", "--values", valuesFile, "-o", "markdown")
	if err != nil {
		t.Fatalf("status -o markdown: %v\n%s", err, md)
	}
	golden(t, "fleet.md.golden", md)

	// JSON carries every node by name
	js, err := status(ctx, "--kubeconfig", kubeconfig, "--all-contexts", "-o", "json")
	if err != nil {
		t.Fatalf("status -o json: %v\n%s", err, js)
	}
	var view struct{ Clusters []fleetview.Cluster }
	if err := json.Unmarshal([]byte(js), &view); err != nil || len(view.Clusters) != 2 {
		t.Fatalf("json: %v\n%s", err, js)
	}
	if got := view.Clusters[1]; got.Context != "beta" || len(got.Health) != 1 || got.Health[0].Node != "gpu-02" || len(got.Upgrading) != 1 || got.Upgrading[0].Node != "gpu-03" {
		t.Errorf("beta: %+v", got)
	}
	if view.Clusters[0].DriftChecked || view.Clusters[0].Drift != nil {
		t.Errorf("without --values nothing is compared: %+v", view.Clusters[0])
	}

	// one context whose API server does not answer: its row says so, the other's is there, and the exit is an error
	dead := deadContext(t, kubeconfig)
	out, err = status(ctx, "--kubeconfig", dead, "--context", "alpha", "--context", "gone", "--cluster-timeout", "3s")
	if err == nil || !regexp.MustCompile(`(?m)^gone .* unreadable: .*connection refused`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^alpha +`+namespace+"/"+release+` .* ok$`).MatchString(out) {
		t.Errorf("a dead context: err %v\n%s", err, out)
	}
	// the node table's live modes are one cluster's
	if out, err := status(ctx, "--kubeconfig", kubeconfig, "--all-contexts", "--watch"); err == nil || !strings.Contains(err.Error(), "--watch shows one cluster's node table") {
		t.Errorf("--all-contexts --watch: %v\n%s", err, out)
	}
	// a single --context is the command as it was, on that context
	one, err := status(ctx, "--kubeconfig", kubeconfig, "--context", "beta", "--live")
	// (the node table of beta, whose failed node fails the check)
	if err == nil || !strings.Contains(one, "gpu-03") || !strings.Contains(one, "module nvidia is in use") || strings.Contains(one, "CONTEXT") {
		t.Errorf("status --context beta --live: %v\n%s", err, one)
	}
}

// status runs the admin CLI in process.
func status(ctx context.Context, args ...string) (string, error) {
	var out strings.Builder
	cmd := admincli.NewCommand(&out)
	cmd.SetArgs(append([]string{"status"}, args...))
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

// twoContexts writes a kubeconfig with one context per cluster, named as given.
func twoContexts(t *testing.T, clusters map[string]*cluster.Cluster) string {
	t.Helper()
	merged := clientcmdapi.NewConfig()
	for name, c := range clusters {
		kc, err := clientcmd.LoadFromFile(c.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cur := kc.Contexts[kc.CurrentContext]
		merged.Clusters[name] = kc.Clusters[cur.Cluster]
		merged.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: readOnlyToken(t, c)}
		merged.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: namespace}
	}
	merged.CurrentContext = "alpha"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// readOnlyToken is a token of a service account bound to a ClusterRole that may get, list and watch every
// resource and nothing else.
func readOnlyToken(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	ctx := t.Context()
	const name = "fleet-reader"
	if _, err := c.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

// deadContext adds a context "gone" whose API server address answers nothing.
func deadContext(t *testing.T, kubeconfig string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	gone := kc.Clusters["alpha"].DeepCopy()
	gone.Server = "https://127.0.0.1:1"
	kc.Clusters["gone"], kc.AuthInfos["gone"] = gone, kc.AuthInfos["alpha"]
	kc.Contexts["gone"] = &clientcmdapi.Context{Cluster: "gone", AuthInfo: "gone", Namespace: namespace}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// golden compares out with testdata/name; UPDATE_GOLDEN=1 rewrites it. (The tests' chart carries the pinned version
// chartrender.ChartVersion, so the report does not change with each release.)
func golden(t *testing.T, name, out string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != out {
		t.Errorf("%s differs (UPDATE_GOLDEN=1 rewrites it; read the diff first):\n--- got\n%s\n--- want\n%s", name, out, want)
	}
}
