// Package rollouttest holds what the cluster suites that roll drivers over simulated GPU nodes (tests/faults,
// tests/rollout, tests/takeover) share: waiting on a condition, reading a node, the GPU nodes among the fixture
// nodes, and the driver DaemonSet's config digest.
package rollouttest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
)

// WaitFor polls cond until it holds, failing the test after timeout with what and cond's last word.
func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, why := cond()
		last = why
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last: %s", what, err, last)
	}
}

// Node reads the node as the API server has it.
func Node(t *testing.T, client kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	// not the test's context: cleanups read nodes too, after it ends
	n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// GPUNodeNames are the names of the nodes with a GPU capacity, in order.
func GPUNodeNames(nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		if _, ok := n.Status.Capacity["nvidia.com/gpu"]; ok {
			out = append(out, n.Name)
		}
	}
	return out
}

// DriverDigest is the driver config digest the driver DaemonSet's pod template carries now.
func DriverDigest(t *testing.T, client kubernetes.Interface, namespace, daemonSet string) string {
	t.Helper()
	ds, err := client.AppsV1().DaemonSets(namespace).Get(t.Context(), daemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		for _, e := range c.Env {
			if e.Name == upgradeplan.DigestEnv {
				return e.Value
			}
		}
	}
	t.Fatalf("the driver DaemonSet %s's pod template has no %s", daemonSet, upgradeplan.DigestEnv)
	return ""
}
