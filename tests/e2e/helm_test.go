package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/placement"
)

// The release every test installs: one at a time, since the chart's cluster-scoped objects (RuntimeClasses, CRDs,
// ClusterRoles) belong to one release per cluster.
const (
	releaseName = "gpu"
	namespace   = "gpu-operator"
)

func helmConfig(t *testing.T) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kube.Kubeconfig
	ns := namespace
	flags.Namespace = &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, namespace, "secret", func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// install installs the chart with a values profile through the helm SDK, waiting (as `helm install --wait`)
// until every DaemonSet and Deployment is ready.
func install(t *testing.T, profile string, set ...string) *release.Release {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartrender.Values([]string{profile}, set)
	if err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(helmConfig(t))
	inst.ReleaseName, inst.Namespace, inst.CreateNamespace = releaseName, namespace, true
	inst.Wait, inst.Timeout = true, 2*time.Minute
	rel, err := inst.RunWithContext(t.Context(), chrt, vals)
	if err != nil {
		uninstall(t) // a failed release would block the next test's install
		t.Fatalf("helm install %s: %v", profile, err)
	}
	return rel
}

func uninstall(t *testing.T) {
	t.Helper()
	un := action.NewUninstall(helmConfig(t))
	un.Wait, un.Timeout = true, 2*time.Minute
	if _, err := un.Run(releaseName); err != nil {
		t.Errorf("helm uninstall: %v", err)
	}
}

// expectedPlacement is where the installed manifest's DaemonSets must run, decided by the scheduler's own
// affinity and taint code over the registered nodes.
func expectedPlacement(t *testing.T, rel *release.Release) placement.Placement {
	t.Helper()
	dss, err := placement.DaemonSets(rel.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := kube.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ptrs []*corev1.Node
	for i := range nodes.Items {
		ptrs = append(ptrs, &nodes.Items[i])
	}
	p, err := placement.Place(dss, ptrs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// actualPlacement is where the operand pods are running now: node -> operand -> DaemonSet.
func actualPlacement(ctx context.Context) (placement.Placement, error) {
	pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	p := placement.Placement{}
	for _, n := range fixtureNodes {
		p[n.Name] = map[string]string{}
	}
	for _, pod := range pods.Items {
		operand := pod.Labels["app.kubernetes.io/component"]
		if operand == "" || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		ds := pod.Labels["app.kubernetes.io/name"]
		if strings.Contains(ds, "mps-control-daemon") {
			operand = "mps-control-daemon"
		}
		if p[pod.Spec.NodeName] == nil {
			p[pod.Spec.NodeName] = map[string]string{}
		}
		p[pod.Spec.NodeName][operand] = ds
	}
	return p, nil
}

// waitForPlacement waits until the running operand pods are exactly `want` on every fixture node.
func waitForPlacement(t *testing.T, want placement.Placement) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := actualPlacement(ctx)
		if err != nil {
			return false, err
		}
		last = diffPlacement(got, want)
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("operand pods never matched the expected placement:\n%s", last)
	}
}

func diffPlacement(got, want placement.Placement) string {
	var b strings.Builder
	for _, n := range fixtureNodes {
		g, w := got.Operands(n.Name), want.Operands(n.Name)
		if !slices.Equal(g, w) {
			fmt.Fprintf(&b, "node %s:\n  running  %v\n  expected %v\n", n.Name, g, w)
		}
	}
	return b.String()
}
