// Package scale holds the 1,000-GPU-node benchmarks (`make bench-scale`): the chart installed with its gate on a
// mixed simulated cluster, the gate and the admin CLI run as their real binaries against it, and the API requests
// of the stack's components counted server-side from the API server's audit log. Benchmarks only: `go test` without
// -bench starts nothing (the cluster comes up on the first benchmark that needs it).
package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
)

// Nodes is the simulated cluster's size: 1,000, or SCALE_NODES (a smaller run of the same mix on a machine that
// cannot keep 1,000 simulated nodes' leases alive).
var Nodes = func() int {
	if n, err := strconv.Atoi(os.Getenv("SCALE_NODES")); err == nil && n > 0 {
		return n
	}
	return 1000
}()

// inProcessUser is the service account the stand-in's runs of the project's code (hook commands) use, so the audit
// log tells them from the stand-in's own writes (pod status, the validators' outcomes) and the control plane's,
// which all share the admin user.
const inProcessUser = "kube-gpu-stack-in-process"

// env is the benchmarks' shared cluster.
type env struct {
	c     *cluster.Cluster
	stand *kubelet.Kubelet
	// dir holds the audit policy and log and the binaries: gate/kube-gpu-stack (hooks/cmd/in-cluster, the
	// image's) and admin/kube-gpu-stack (hooks/cmd/kube-gpu-stack, the admin's).
	dir, audit string
	nodes      []string
	stop       context.CancelFunc
}

var (
	once    sync.Once
	shared  *env
	openErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop()
		shared.c.Stop()
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// cluster1000 starts (once) the control plane with the audit log on, the kubelet stand-in and Nodes simulated
// GPU nodes, and builds the binaries. Without a control plane it skips (fails under CI=true).
func cluster1000(b *testing.B) *env {
	b.Helper()
	once.Do(func() { shared, openErr = open() })
	if openErr != nil {
		if _, err := cluster.BinDir(); err != nil && os.Getenv("CI") != "true" {
			b.Skip(err)
		}
		b.Fatal(openErr)
	}
	return shared
}

func open() (*env, error) {
	if _, err := cluster.BinDir(); err != nil {
		return nil, err
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "kube-gpu-stack-scale-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, audit: apiload.AuditLog(dir)}
	for _, bin := range []struct{ out, pkg string }{{"gate", "./hooks/cmd/in-cluster"}, {"admin", "./hooks/cmd/kube-gpu-stack"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, bin.out, "kube-gpu-stack"), bin.pkg)
		cmd.Dir = chartrender.RepoRoot()
		// static, as the image's binary is built (with cgo it would need the host's NVML)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", bin.pkg, err, out)
		}
	}
	args, err := apiload.Args(dir)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	e.stop = stop
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if e.c, err = cluster.Start(startCtx, cluster.Options{Log: cluster.LogSink(), HarnessComponents: kubelet.Components(), HarnessTerminates: kubelet.Terminates(), APIServerArgs: args,
		ControllerManagerArgs: cluster.TolerateLateHeartbeats}); err != nil {
		return nil, err
	}
	e.c.StopOnSignal()
	if e.stand, err = kubelet.Start(ctx, e.c.Client, e.c.Kubeconfig); err != nil {
		return e, err
	}
	cfg, err := e.inProcessConfig(ctx)
	if err != nil {
		return e, err
	}
	if err := e.stand.UseAPI(cfg, dir); err != nil {
		return e, err
	}
	var nodes []*corev1.Node
	for _, n := range nodefixtures.Scale(Nodes) {
		nodes = append(nodes, n.Object())
		e.nodes = append(e.nodes, n.Name)
	}
	if err := addNodes(ctx, e.c, nodes); err != nil {
		return e, err
	}
	fmt.Printf("scale: %d simulated GPU nodes ready in %s\n", len(nodes), time.Since(start).Round(time.Second))
	return e, nil
}

// inProcessConfig is a client config for inProcessUser (cluster-admin, as the hooks' own accounts are not what
// this measures: the gate's binary run below uses the chart's account and RBAC).
func (e *env) inProcessConfig(ctx context.Context) (*rest.Config, error) {
	cs := e.c.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: inProcessUser, Namespace: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: inProcessUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: inProcessUser, Namespace: "default"}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	tok, err := token(ctx, e.c, "default", inProcessUser)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: e.c.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: e.c.Config.CAData},
		BearerToken: tok, QPS: 200, Burst: 400}, nil
}
