package drivermanager

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

// failingNewDriver is a node whose change to newDigest waits for validation (cordoned, validation-required), after
// oldDigest validated there; its driver pod, of a DaemonSet that installs newDigest, runs newDigest. With keep, the
// plan kept the revert DaemonSet of oldDigest.
func failingNewDriver(t *testing.T, validated string, keep bool) *env {
	t.Helper()
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := e.node()
	if validated != "" {
		n.Annotations[nodestate.ValidatedDigestAnnotation] = validated
		if _, err := e.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable {
		t.Fatalf("setup: state %q unschedulable %v, want validation-required and cordoned", state(n), n.Spec.Unschedulable)
	}
	e.withNewDriverPod(keep)
	return e
}

// withNewDriverPod adds the driver DaemonSet that installs newDigest and its pod on the node; with keep, the revert
// DaemonSet of oldDigest the plan kept.
func (e *env) withNewDriverPod(keep bool) {
	t := e.t
	t.Helper()
	ctx := context.Background()
	// the chart's driver DaemonSets leave a node labelled for a revert DaemonSet to it
	spec := driverSpec(newDigest)
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: nodestate.RevertLabel, Operator: corev1.NodeSelectorOpDoesNotExist}}}}}}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: driverDS, Namespace: namespace, UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": driverDS}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ComponentLabel: "driver", "app": driverDS}},
				Spec: spec}}}
	if _, err := e.client.AppsV1().DaemonSets(namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := driverPodObject()
	pod.Spec = driverSpec(newDigest)
	if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if keep {
		old := ds.DeepCopy()
		old.Spec.Template.Spec.InitContainers, old.Spec.Template.Spec.Containers = driverSpec(oldDigest).InitContainers, driverSpec(oldDigest).Containers
		if _, err := e.client.AppsV1().DaemonSets(namespace).Create(ctx, revertset.Build(old, oldDigest), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// A node registered again (its Node object deleted, the kubelet registered it bare) whose new driver then fails
// validation goes back to the driver that validated on it before, as any node does: its Lease kept that record when
// the Node object lost it. It ended upgrade-failed, with nothing to revert to (the soak, a Node re-registered).
func TestNodeRegisteredAgainRevertsToTheDriverThatValidatedBefore(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(oldDigest)); err != nil { // the loaded oldDigest is in service: it validated here
		t.Fatal(err)
	}
	l, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName(nodeName), metav1.GetOptions{})
	if err != nil || l.Annotations[nodestate.ValidatedDigestAnnotation] != oldDigest {
		t.Fatalf("the node's Lease %v (%v): want it to record %s as validated", l, err, oldDigest)
	}
	e.registerAgain()
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired || n.Annotations[nodestate.ValidatedDigestAnnotation] != oldDigest {
		t.Fatalf("setup: state %q, validated %q; want validation-required, with the record of %s back on the Node",
			state(n), n.Annotations[nodestate.ValidatedDigestAnnotation], oldDigest)
	}
	e.withNewDriverPod(true)
	if err := e.gateUntil(t, func(n *corev1.Node) bool { return n.Labels[nodestate.RevertLabel] != "" }); err == nil ||
		!strings.Contains(err.Error(), "going back to the driver that last validated") {
		t.Errorf("gate ended with %v, want the revert named", err)
	}
	if n := e.node(); n.Labels[nodestate.RevertLabel] != nodestate.ShortDigest(oldDigest) || state(n) == nodestate.UpgradeFailed {
		t.Errorf("node: %s=%q, state %q; want it going back to %s", nodestate.RevertLabel, n.Labels[nodestate.RevertLabel], state(n), nodestate.ShortDigest(oldDigest))
	}
}

// gateUntil runs the failing driver pod's gate (a 200 ms validation timeout, no validator) until until holds on the
// node or the gate ends, then stops it as a pod deletion would, and returns what it ended with.
func (e *env) gateUntil(t *testing.T, until func(*corev1.Node) bool) error {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	o := e.gateOptions(false, time.Second, nil)
	o.Timeout = 200 * time.Millisecond
	done, out := e.runGate(ctx, o)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-done:
			return err
		case <-deadline:
			t.Fatalf("the gate neither ended nor reached the state:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if until(e.node()) {
			stop()
			return <-done
		}
	}
}

// A new driver that does not validate: the gate labels its node for the revert DaemonSet of the driver that last
// validated there, records why, and hands the node on emptied (pod-restart-required), its cordon kept: never
// upgrade-failed, never uncordoned with a driver that did not validate.
func TestFailedValidationRevertsToTheLastValidatedDriver(t *testing.T) {
	e := failingNewDriver(t, oldDigest, true)
	err := e.gateUntil(t, func(n *corev1.Node) bool { return n.Labels[nodestate.RevertLabel] != "" })
	if err == nil || !strings.Contains(err.Error(), "going back to the driver that last validated") {
		t.Errorf("gate ended with %v, want the revert named", err)
	}
	n := e.node()
	if got, want := n.Labels[nodestate.RevertLabel], nodestate.ShortDigest(oldDigest); got != want {
		t.Errorf("%s=%q, want %q", nodestate.RevertLabel, got, want)
	}
	r, rerr := nodestate.ReadRevert(n)
	if rerr != nil || r == nil || r.From != newDigest || r.To != oldDigest || r.DaemonSet != revertset.Name(driverDS, oldDigest) ||
		!strings.Contains(r.Reason, "became Ready within") {
		t.Errorf("revert record %+v (%v), want from the new driver to the old, by %s, with the validation timeout", r, rerr, revertset.Name(driverDS, oldDigest))
	}
	if !nodestate.Reverted(n) || state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) {
		t.Errorf("node: reverted %v state %q unschedulable %v, want reverted, still validation-required and cordoned by us",
			nodestate.Reverted(n), state(n), n.Spec.Unschedulable)
	}
	if reason := n.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(reason, "reverting to driver config "+nodestate.ShortDigest(oldDigest)) {
		t.Errorf("reason %q, want the revert named", reason)
	}

	// a gate restarted after the revert (SIGKILL, a container restart) leaves the node as it is for its next pod
	err = e.gateUntil(t, func(*corev1.Node) bool { time.Sleep(500 * time.Millisecond); return true })
	if after := e.node(); state(after) != nodestate.ValidationRequired || !nodestate.Reverted(after) || !after.Spec.Unschedulable {
		t.Errorf("after a restarted gate (%v): state %q reverted %v unschedulable %v, want the revert left as it was",
			err, state(after), nodestate.Reverted(after), after.Spec.Unschedulable)
	}
}

// The failed pod's deletion (its DaemonSet no longer selects the reverted node) empties the node for the revert
// DaemonSet before the failed driver may stop: a GPU pod that came while the node waited for validation (it tolerates
// the cordon, and the device plugin was back) is evicted first, then the operands paused.
func TestRevertedNodeIsEmptiedBeforeTheFailedDriverStops(t *testing.T) {
	e := failingNewDriver(t, oldDigest, true)
	e.withGPUPod(nil)
	if err := e.gateUntil(t, func(n *corev1.Node) bool { return nodestate.Reverted(n) }); err == nil {
		t.Fatal("the gate ended without an error after reverting")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, stopFile, stopFileAt, out := e.stopGate(ctx)
	time.Sleep(200 * time.Millisecond) // the restarted gate finds the node going back and waits for its pod's stop
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "going back") {
		t.Errorf("gate: %v", err)
	}
	raw, err := os.ReadFile(stopFile)
	if err != nil || !strings.Contains(string(raw), "emptied for "+revertset.Name(driverDS, oldDigest)) {
		t.Fatalf("stop file %q (%v), want the node emptied for the revert DaemonSet:\n%s", raw, err, out.String())
	}
	for _, step := range []string{"evict", "pause"} {
		if at, ok := stopFileAt[step]; !ok || at {
			t.Errorf("step %s: ran %v, stop file already written %v; want it run before the failed driver may stop", step, ok, at)
		}
	}
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train"}) {
		t.Errorf("evictions %v, want the GPU pod that came meanwhile", got)
	}
	if n := e.node(); state(n) != nodestate.PodRestartRequired || !nodestate.Reverted(n) || !n.Spec.Unschedulable {
		t.Errorf("node: state %q reverted %v unschedulable %v, want emptied for the revert DaemonSet's pod", state(n), nodestate.Reverted(n), n.Spec.Unschedulable)
	}
}

// Without a driver to go back to, a failed validation is upgrade-failed as before, saying why nothing was reverted:
// no revert DaemonSet (upgradePolicy.revert off), no driver validated before on the node (a first install), or the
// record names the very driver that failed.
func TestFailedValidationWithNothingToRevertToFails(t *testing.T) {
	for _, c := range []struct {
		name, validated string
		keep            bool
		why             string
	}{
		{"no revert DaemonSet", oldDigest, false, "no revert DaemonSet of " + driverDS},
		{"nothing validated before", "", true, "no other driver validated on the node before"},
		{"only the failing driver validated", newDigest, true, "no other driver validated on the node before"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := failingNewDriver(t, c.validated, c.keep)
			err := e.gateUntil(t, func(*corev1.Node) bool { return false })
			n := e.node()
			if err == nil || state(n) != nodestate.UpgradeFailed || !n.Spec.Unschedulable || n.Labels[nodestate.RevertLabel] != "" {
				t.Fatalf("err %v, state %q unschedulable %v revert label %q: want upgrade-failed, cordoned, not reverted",
					err, state(n), n.Spec.Unschedulable, n.Labels[nodestate.RevertLabel])
			}
			if reason := n.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(reason, "not reverted: "+c.why) {
				t.Errorf("reason %q, want it to say %q", reason, c.why)
			}
		})
	}
}

// A revert DaemonSet being deleted, or one of another driver DaemonSet, is no way back.
func TestRevertNeedsTheCopyOfItsOwnDaemonSet(t *testing.T) {
	e := failingNewDriver(t, oldDigest, false)
	other := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-daemonset-rhel9", Namespace: namespace, UID: types.UID("other")},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}}, Spec: driverSpec(oldDigest)}}}
	if _, err := e.client.AppsV1().DaemonSets(namespace).Create(context.Background(), revertset.Build(other, oldDigest), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = e.gateUntil(t, func(*corev1.Node) bool { return false })
	if n := e.node(); state(n) != nodestate.UpgradeFailed || n.Labels[nodestate.RevertLabel] != "" {
		t.Fatalf("state %q revert label %q: reverted by another DaemonSet's copy", state(n), n.Labels[nodestate.RevertLabel])
	}
}

// A reverted node whose revert DaemonSet let go of it (deleted with its pool's renamed DaemonSet, or the node moved
// to another pool): the copy's pod's stop takes the node back to its driver DaemonSet (label and record go) and
// empties it for that DaemonSet's pod, rather than stopping the driver with nothing to take the node over.
func TestRevertedNodeLeftByItsCopyGoesBackToItsDaemonSet(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone), nodestate.RevertLabel: nodestate.ShortDigest(oldDigest)}))
	n := e.node()
	n.Annotations = map[string]string{nodestate.RevertedAnnotation: `{"from":"` + newDigest + `","to":"` + oldDigest + `","daemonSet":"gone","reason":"r","at":"t"}`}
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.withGPUPod(nil)
	spec := driverSpec(newDigest)
	spec.NodeName = ""
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: nodestate.RevertLabel, Operator: corev1.NodeSelectorOpDoesNotExist}}}}}}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: driverDS, Namespace: namespace, UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ComponentLabel: "driver"}}, Spec: spec}}}
	if _, err := e.client.AppsV1().DaemonSets(namespace).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := driverPodObject() // the copy's pod; the copy itself is gone
	pod.OwnerReferences[0].Name, pod.OwnerReferences[0].UID = revertset.Name(driverDS, oldDigest), "copy-uid"
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, stopFile, _, out := e.stopGate(ctx)
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	<-done
	raw, err := os.ReadFile(stopFile)
	if err != nil || !strings.Contains(string(raw), "emptied for "+driverDS) {
		t.Fatalf("stop file %q (%v), want the node emptied for %s:\n%s", raw, err, driverDS, out.String())
	}
	after := e.node()
	if _, labelled := after.Labels[nodestate.RevertLabel]; labelled || nodestate.Reverted(after) {
		t.Errorf("node still under the gone copy: labels %v annotations %v", after.Labels, after.Annotations)
	}
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train"}) {
		t.Errorf("evictions %v, want the GPU pod before the driver stops", got)
	}
}
