// Package e2e installs the chart into a real local control plane (kube-apiserver, etcd, controller-manager,
// scheduler, kwok-simulated GPU nodes) and checks what the API server and controllers actually do with it.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/draplugin"
)

// env is one control plane with its stand-in and its simulated nodes. A test owns the one it uses for its whole
// run (the chart's cluster-scoped objects belong to one release per cluster, and tests compare node snapshots).
type env struct {
	kube *cluster.Cluster
	// stand plays the kubelet for the stack's own pods (validators, hook Jobs).
	stand *kubelet.Kubelet
	// nodes are the simulated nodes registered on it: fixtureNodes or gateNodes.
	nodes []*corev1.Node
}

// envs are the package's control planes with the whole role matrix (primary is the first, for benchmarks); small
// are those with gateNodes only.
var (
	envs    *kubelet.Pool
	small   *kubelet.Pool
	primary *env
)

// fixtureNodes are the simulated nodes of the role matrix, as registered on every control plane of envs.
var fixtureNodes []*corev1.Node

// gateNodes are the simulated nodes of the control planes of the tests whose subject is what the gate, the hooks
// and uninstall do rather than where operands land (use them through useSmall): a GPU node of each OS the mixed
// profile's driver serves, one of each VM role, a MIG-capable one and a node without a GPU. Placement on every
// role of the matrix is TestProfilesInstallAndPlaceOperands' and TestMixedProfileLifecycle's, on fixtureNodes; the
// gate's tests ran there too, each install creating some 180 pods where 40 show the same.
var gateNodes = []string{"container-ubuntu2204", "container-ubuntu2404", "container-rhel9", "mig-capable",
	"vm-passthrough", "vm-vgpu", "cpu-only"}

// clusters is how many control planes the tests share, each test on its own (about 1 GiB each; the tests mostly
// wait on controllers, so a few run well side by side on two cores): E2E_CLUSTERS, else 3.
func clusters() int {
	if n, err := strconv.Atoi(os.Getenv("E2E_CLUSTERS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// use gives t a control plane of its own, with the whole role matrix, and lets it run beside the package's other
// tests.
func use(t *testing.T) *env {
	t.Helper()
	e := envs.Use(t)
	return &env{kube: e.Cluster, stand: e.Kubelet, nodes: fixtureNodes}
}

// useSmall is use with a control plane of gateNodes only.
func useSmall(t *testing.T) *env {
	t.Helper()
	e := small.Use(t)
	return &env{kube: e.Cluster, stand: e.Kubelet, nodes: small.Nodes()}
}

func TestMain(m *testing.M) {
	flag.Parse()
	// as many tests at once as there are control planes, unless -parallel says otherwise
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(clusters()+1))
	}
	var gate []*corev1.Node
	for _, n := range nodefixtures.RoleMatrix() {
		fixtureNodes = append(fixtureNodes, n.Object())
		if slices.Contains(gateNodes, n.Name) {
			gate = append(gate, n.Object())
		}
	}
	code := kubelet.RunPackage(m, "e2e", fixtureNodes, func(c *cluster.Cluster, k *kubelet.Kubelet) {
		primary = &env{kube: c, stand: k, nodes: fixtureNodes}
		envs = kubelet.NewPool(&kubelet.Env{Cluster: c, Kubelet: k}, clusters(), fixtureNodes, extraLog, playDRA)
		small = kubelet.NewPool(nil, 1, gate, func(int) io.Writer { return extraLog(0) }, playDRA)
	})
	if envs != nil {
		envs.Stop()
		small.Stop()
	}
	os.Exit(code)
}

// playDRA plays the DRA kubelet plugin on a control plane for the package's whole run: the DRA profiles' plugin
// publishes each DRA node's ResourceSlice, which their gate waits for, and the slices go with the plugin's pods.
func playDRA(ctx context.Context, e *kubelet.Env) {
	go draplugin.Play(ctx, e.Cluster.Client, releaseNamespace, make(chan error, 1))
}

// extraLog is where the n-th control plane's processes write: E2E_LOG with -n appended, else nowhere.
func extraLog(n int) io.Writer {
	if p := os.Getenv("E2E_LOG"); p != "" {
		if f, err := os.Create(fmt.Sprintf("%s-%d", p, n)); err == nil {
			return f
		}
	}
	return nil
}
