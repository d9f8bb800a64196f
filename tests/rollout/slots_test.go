package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestOldDriverPodGoingUnReadyTakesNoExtraSlot: mid-rollout, with maxUnavailable nodes in flight, the old driver pod
// of a node not yet changed turns un-Ready (its driver container crashed, say). The DaemonSet replaces an un-Ready
// old pod at once, outside its maxUnavailable; the new pod's driver manager finds its pool's slots all held and
// waits, untouched, until a node gives one back. Never more than maxUnavailable nodes are in flight or cordoned,
// and the rollout still ends with every node upgrade-done.
func TestOldDriverPodGoingUnReadyTakesNoExtraSlot(t *testing.T) {
	const tag = "600.40.01"
	ctx := t.Context()
	// installs long enough that the first batch is still in flight when the old pod turns un-Ready
	freshNodes(t, 4*time.Second)
	// a PodDisruptionBudget left by an earlier test would make the plan refuse
	if err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(ctx, "train-"+pdbNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := target().Install(ctx, profile(), settings()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target().Uninstall(); err != nil {
			t.Error(err)
		}
	})

	rec := recordNodes(t)
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			logRuns(t, start)
		}
	})
	// the upgrade returns once its post-upgrade gate saw the rollout through: the test acts meanwhile
	upgraded := make(chan error, 1)
	go func() {
		_, err := target().Upgrade(ctx, profile(), settings("driver.image.tag="+tag)...)
		upgraded <- err
	}()
	var victim, victimPod string
	rollouttest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d nodes in flight and an old driver pod Ready on another", maxUnavailable), func() (bool, string) {
		out := nodesInFlight(t)
		if len(out) < maxUnavailable {
			return false, fmt.Sprintf("in flight: %v", out)
		}
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if slices.Contains(out, n) || rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
				continue
			}
			if p := driverPodReady(t, n); p != nil && !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag+"-ubuntu22.04") {
				victim, victimPod = n, p.Name
				return true, ""
			}
		}
		return false, "no node with its old driver pod Ready"
	})
	if err := stand.MarkUnready(ctx, namespace, victimPod); err != nil {
		t.Fatal(err)
	}
	t.Logf("old driver pod %s on %s marked un-Ready with %v in flight", victimPod, victim, nodesInFlight(t))
	// the DaemonSet replaces the un-Ready old pod at once: the new pod's manager waits for a slot (or, were there no
	// slots, starts a third change: the recorder's bound below says so)
	waited := false
	for deadline := time.Now().Add(time.Minute); !waited && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n := rollouttest.Node(t, kube.Client, victim)
		waited = strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], "waiting for a slot of pool")
		if n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
			break
		}
	}
	rollouttest.WaitFor(t, 3*time.Minute, "every node upgrade-done with the new driver pod Ready", func() (bool, string) {
		return rolledOut(t, rollouttest.GPUNodeNames(nodes))
	})
	rec.stop()
	if err := <-upgraded; err != nil {
		t.Errorf("helm upgrade: %v", err)
	}
	t.Logf("rollout in %s; at most %d in flight, %d cordoned by the upgrade at once", time.Since(start).Round(100*time.Millisecond),
		rec.maxInFlight, rec.maxCordoned)
	if rec.maxInFlight > maxUnavailable || rec.maxCordoned > maxUnavailable {
		t.Errorf("at one moment %d nodes were in flight and %d cordoned by the upgrade, want at most %d:\n%s",
			rec.maxInFlight, rec.maxCordoned, maxUnavailable, rec.worst)
	}
	if !waited {
		t.Errorf("%s's new driver manager never waited for a slot of its pool", victim)
	}
	if got := rec.states(victim); !slices.Contains(got, nodestate.CordonRequired) {
		t.Errorf("%s went through %v: its change never ran", victim, got)
	}
}

// nodesInFlight are the GPU nodes between cordon-required and uncordon-required, sorted.
func nodesInFlight(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		switch nodestate.UpgradeState(rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]) {
		case nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired,
			nodestate.ValidationRequired, nodestate.UncordonRequired:
			out = append(out, n)
		}
	}
	return out
}

// driverPodReady is node's live driver pod when it is Ready (nil otherwise).
func driverPodReady(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: driverPods,
		FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return p
			}
		}
	}
	return nil
}
