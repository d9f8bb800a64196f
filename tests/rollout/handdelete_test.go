package rollout

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

// TestDriverPodDeletedByHandStopsOnAnEmptiedNode: `kubectl delete pod` of a driver pod, outside any driver change,
// on a node running a GPU pod. Its driver container's preStop holds the driver's stop until the pod's upgrade gate
// emptied the node (cordon, the GPU pod evicted, the operands paused), so the stop finds no GPU pod; the
// DaemonSet's next pod waits for the old one to go, takes the node over, validates and uncordons it, and the GPU
// workload runs there again.
func TestDriverPodDeletedByHandStopsOnAnEmptiedNode(t *testing.T) {
	const ns = "hand-delete"
	ctx := t.Context()
	freshNodes(t, 0)
	if _, err := target().Install(ctx, profile(), settings()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target().Uninstall(); err != nil {
			t.Error(err)
		}
		_ = kube.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
	node := rollouttest.GPUNodeNames(nodes)[1]
	if err := workloads.Deploy(ctx, kube.Client, ns, []string{node}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, time.Minute, "the GPU workload running on "+node, func() (bool, string) {
		running, err := workloads.RunningGPU(ctx, kube.Client, ns)
		return err == nil && running[node], fmt.Sprintf("running: %v (%v)", running, err)
	})
	old := driverPodReady(t, node)
	if old == nil {
		t.Fatalf("no Ready driver pod on %s after the install", node)
	}
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			logRuns(t, start)
		}
	})
	if err := kube.Client.CoreV1().Pods(namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, 2*time.Minute, node+" taken over by a new driver pod, validated and uncordoned", func() (bool, string) {
		p := driverPodReady(t, node)
		if p == nil || p.UID == old.UID {
			return false, "the old pod, or none, is Ready"
		}
		return rolledOut(t, []string{node})
	})

	assertDriversStoppedOnEmptiedNodes(t, start)
	stops := 0
	for _, st := range stand.DriverStops() {
		if !st.At.Before(start) {
			stops++
		}
	}
	if stops != 1 {
		t.Errorf("%d driver stops since the deletion, want the deleted pod's one", stops)
	}
	n := rollouttest.Node(t, kube.Client, node)
	if n.Spec.Unschedulable || n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeDone) {
		t.Errorf("%s: unschedulable %v, state %q; want it back in service", node, n.Spec.Unschedulable, n.Labels[nodestate.UpgradeStateLabel])
	}
	assertNothingPaused(t, n)
	rollouttest.WaitFor(t, time.Minute, "the GPU workload running on "+node+" again", func() (bool, string) {
		running, err := workloads.RunningGPU(ctx, kube.Client, ns)
		return err == nil && running[node], fmt.Sprintf("running: %v (%v)", running, err)
	})
	for _, other := range rollouttest.GPUNodeNames(nodes) {
		if other != node && rollouttest.Node(t, kube.Client, other).Spec.Unschedulable {
			t.Errorf("%s cordoned: a hand deletion on %s touched another node", other, node)
		}
	}
}
