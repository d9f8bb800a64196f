package drivermanager

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func TestUncordonWaitsForAValidatorReadyAfterTheChange(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	// A validator Ready since before the change vouches for the old driver only.
	validatorReady(t, e, time.Date(2026, 9, 1, 11, 0, 0, 0, time.UTC))
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 300 * time.Millisecond}
	o.Complete()
	err := o.Run(context.Background(), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "stays cordoned") {
		t.Fatalf("err = %v", err)
	}
	n := e.node()
	if state(n) != nodestate.UpgradeFailed || !n.Spec.Unschedulable {
		t.Fatalf("state=%q unschedulable=%v; want upgrade-failed and still cordoned", state(n), n.Spec.Unschedulable)
	}
	// Nothing to do once the node is done (an admin finished it by hand here); the pod is then ready. (On an
	// upgrade-failed node the gate holds the pod un-Ready: TestRestartedGateOnAFailedNodeStaysUnready.)
	if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.SetUpgradeState(n, nodestate.UpgradeDone, "", "2026-09-01T13:00:00Z")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o.ReadyFile = filepath.Join(t.TempDir(), "driver-validated")
	if err := o.Run(context.Background(), &out); err != nil || !strings.Contains(out.String(), "nothing to do") {
		t.Fatalf("%v %q", err, out.String())
	}
	if _, err := os.Stat(o.ReadyFile); err != nil {
		t.Errorf("the ready file was not written: %v", err)
	}
}

func TestUncordonWritesTheReadyFileOnlyOnceValidated(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(t.TempDir(), "driver-validated")
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 200 * time.Millisecond, ReadyFile: ready}
	o.Complete()
	if err := o.Run(context.Background(), &bytes.Buffer{}); err == nil {
		t.Fatal("no validator yet, yet the wait succeeded")
	}
	if _, err := os.Stat(ready); err == nil {
		t.Fatal("the ready file was written before the node validated")
	}
}

func validatorReady(t *testing.T, e *env, at time.Time) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-operator-validator-" + at.Format("150405"), Namespace: namespace,
			Labels: map[string]string{ComponentLabel: DefaultValidatorComponent}},
		Spec: corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(at)}}},
	}
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func uncordon(e *env) error {
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 5 * time.Second, Now: e.clock}
	o.Complete()
	return o.Run(context.Background(), &bytes.Buffer{})
}

// TestUncordonRefusesAnUnreadableSince: without a readable time of the driver change the gate cannot tell a
// validator of the new driver from one of the old, so it says which annotation is wrong instead of passing.
func TestUncordonRefusesAnUnreadableSince(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 11, 0, 0, 0, time.UTC)) // Ready before the change: the old driver's
	for _, key := range []string{nodestate.DriverSinceAnnotation, nodestate.UpgradeSinceAnnotation} {
		n := e.node()
		n.Annotations[key] = "garbage"
		if key == nodestate.UpgradeSinceAnnotation { // read only on a node without the driver's time
			delete(n.Annotations, nodestate.DriverSinceAnnotation)
		}
		if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := uncordon(e)
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("err = %v, want %s named", err, key)
		}
		if n := e.node(); state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable {
			t.Fatalf("state %q unschedulable %v; want both kept", state(n), n.Spec.Unschedulable)
		}
	}
}

// failValidation plays a driver change whose new driver never validated: the manager unloads the old driver (at
// 12:00), the new one loads, and the gate gives up at 12:10: the node is upgrade-failed and stays cordoned.
func failValidation(t *testing.T) *env {
	t.Helper()
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	e.host.LoadDriver()
	e.host.DriverState(newDigest)
	e.host.PidFile()
	e.host.MountDriverRoot()
	e.now = time.Date(2026, 9, 1, 12, 10, 0, 0, time.UTC)
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 100 * time.Millisecond, Now: e.clock}
	o.Complete()
	if err := o.Run(context.Background(), &bytes.Buffer{}); err == nil {
		t.Fatal("setup: the gate passed without a validator")
	}
	if n := e.node(); state(n) != nodestate.UpgradeFailed || !nodestate.CordonedByUs(n) {
		t.Fatalf("setup: state=%q ours=%v", state(n), nodestate.CordonedByUs(n))
	}
	return e
}

// assertValidationPending: the node waits for validation of its driver, still cordoned by us, and a gate without a
// validator Ready since the driver installed does not finish it.
func assertValidationPending(t *testing.T, e *env, when string) {
	t.Helper()
	n := e.node()
	if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) {
		t.Fatalf("%s: state=%q unschedulable=%v ours=%v; want validation-required with our cordon kept", when, state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
	}
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 100 * time.Millisecond, Now: e.clock}
	o.Complete()
	if err := o.Run(context.Background(), &bytes.Buffer{}); err == nil {
		t.Fatalf("%s: the gate passed without a validator of the current driver", when)
	}
	if n := e.node(); state(n) == nodestate.UpgradeDone || !n.Spec.Unschedulable {
		t.Fatalf("%s: state=%q unschedulable=%v after a gate without validator", when, state(n), n.Spec.Unschedulable)
	}
}

// validateAndFinish: the validator turns Ready at ready; the next driver pod's manager and gate finish the node.
func validateAndFinish(t *testing.T, e *env, ready time.Time) {
	t.Helper()
	validatorReady(t, e, ready)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	n := e.node()
	if state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Fatalf("end: state=%q unschedulable=%v ours=%v", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
	}
}

// TestFailedValidationThenPodDeletedValidatesFirst: deleting the driver pod of a node whose new driver never
// validated starts a pod whose manager finds the new driver loaded (fast path); the node must validate before it
// is uncordoned. A validator that turned Ready late (after the gate gave up) vouches for the driver.
func TestFailedValidationThenPodDeletedValidatesFirst(t *testing.T) {
	e := failValidation(t)
	e.now = time.Date(2026, 9, 1, 12, 20, 0, 0, time.UTC)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	assertValidationPending(t, e, "new driver pod")
	validateAndFinish(t, e, time.Date(2026, 9, 1, 12, 25, 0, 0, time.UTC))

	// the validator turned Ready at 12:15, after the gate gave up and before the pod was deleted at 12:20
	e = failValidation(t)
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 15, 0, 0, time.UTC))
	e.now = time.Date(2026, 9, 1, 12, 20, 0, 0, time.UTC)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if err := uncordon(e); err != nil {
		t.Fatalf("a validator Ready with the new driver since 12:15 was not accepted: %v", err)
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
		t.Fatalf("state=%q unschedulable=%v", state(n), n.Spec.Unschedulable)
	}
}

// TestRetriedNodeValidatesFirst: `upgrade retry` of a node whose new driver never validated starts it over; the
// manager finds that driver loaded, and the node validates before it is uncordoned.
func TestRetriedNodeValidatesFirst(t *testing.T) {
	e := failValidation(t)
	e.now = time.Date(2026, 9, 1, 12, 20, 0, 0, time.UTC)
	if err := upgradeplan.Retry(context.Background(), e.client, namespace, "", nodeName, e.now, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	assertValidationPending(t, e, "after retry")
	validateAndFinish(t, e, time.Date(2026, 9, 1, 12, 25, 0, 0, time.UTC))
}

// reboot empties what a reboot empties: the loaded modules, /run (a tmpfs) and the mount table below /.
func reboot(t *testing.T, f *kmodtest.Fixture) {
	t.Helper()
	for _, p := range []string{"run", "sys/module"} {
		if err := os.RemoveAll(filepath.Join(f.Root, p)); err != nil {
			t.Fatal(err)
		}
	}
	for p, content := range map[string]string{"run/nvidia/.keep": "", "proc/modules": "",
		"proc/self/mountinfo": "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(f.Root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.Root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(f.Root, "sys/module"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestRebootedFailedNodeValidatesFirst: a node whose new driver never validated reboots (modules gone, /run
// emptied); its driver pod's manager finds no driver loaded, and the node keeps our cordon until the driver that
// installs next validates. A validator Ready before the reboot does not count.
func TestRebootedFailedNodeValidatesFirst(t *testing.T) {
	e := failValidation(t)
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 15, 0, 0, time.UTC)) // saw the driver before the reboot
	reboot(t, e.host)
	e.now = time.Date(2026, 9, 1, 12, 20, 0, 0, time.UTC)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if mods := e.host.LoadedModules(); len(mods) != 0 {
		t.Fatalf("modules %v after the reboot", mods)
	}
	e.host.LoadDriver() // the driver container installs
	e.host.DriverState(newDigest)
	assertValidationPending(t, e, "after the reboot")
	validateAndFinish(t, e, time.Date(2026, 9, 1, 12, 25, 0, 0, time.UTC))
}

// A gate that timed out marks the node upgrade-failed and exits; the kubelet restarts only that container. The
// restarted gate must not turn the driver pod Ready: a Ready pod would count the node as done, and the DaemonSet's
// rolling update would carry a driver that never validates across the whole pool. It holds the pod un-Ready (the
// node keeps its maxUnavailable slot) until the node leaves upgrade-failed, and then finishes the change as usual.
func TestRestartedGateOnAFailedNodeStaysUnready(t *testing.T) {
	e := failValidation(t)
	if state(e.node()) != nodestate.UpgradeFailed {
		t.Fatalf("state = %q, want upgrade-failed", state(e.node()))
	}
	ready := filepath.Join(t.TempDir(), "driver-validated")
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 5 * time.Second, ReadyFile: ready, Now: e.clock}
	o.Complete()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, &bytes.Buffer{}) }()
	select {
	case err := <-done:
		t.Fatalf("the restarted gate returned (%v) on an upgrade-failed node", err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := os.Stat(ready); err == nil {
		t.Fatal("the restarted gate wrote its ready file on an upgrade-failed node: the rollout would move on")
	}
	if n := e.node(); !nodestate.CordonedByUs(n) {
		t.Fatal("the failed node was uncordoned")
	}
	// the admin fixes the driver and retries: the node is validation-required again and its validator turns Ready
	n := e.node()
	if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.SetUpgradeState(n, nodestate.ValidationRequired, "", e.clock().UTC().Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	validatorReady(t, e, e.clock().Add(time.Minute))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not finish after the node left upgrade-failed")
	}
	if state(e.node()) != nodestate.UpgradeDone || nodestate.CordonedByUs(e.node()) {
		t.Fatalf("state = %q, cordoned by us = %v; want upgrade-done, uncordoned", state(e.node()), nodestate.CordonedByUs(e.node()))
	}
	if _, err := os.Stat(ready); err != nil {
		t.Fatal("the ready file was not written once the node validated")
	}
}

// TestRestartedGateOnARetriedNodeStaysUnready: `upgrade retry` moves a failed node to upgrade-required and then
// deletes its driver pod. The gate held there must not turn the pod Ready in between: that would free the node's
// rollout slot before the next driver pod even started.
func TestRestartedGateOnARetriedNodeStaysUnready(t *testing.T) {
	e := failValidation(t)
	holdsUnready(t, e, func() {
		time.Sleep(200 * time.Millisecond)
		if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.SetUpgradeState(e.node(), nodestate.UpgradeRequired, "retry requested", e.clock().UTC().Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	})
}

// remark is what a pre-upgrade plan for a newer driver does to a node in flight: it marks it upgrade-required,
// leaving the cordon of the change under way.
func remark(t *testing.T, e *env) {
	t.Helper()
	if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.SetUpgradeState(e.node(), nodestate.UpgradeRequired, "", e.clock().UTC().Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
}

// holdsUnready runs the gate (the driver pod's uncordon sidecar) until its pod stops, after during() ran, and checks
// it neither turned the pod Ready nor moved the node: a Ready pod on a node still cordoned for the change would
// let the rolling update take one more node out than maxUnavailable.
func holdsUnready(t *testing.T, e *env, during func()) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "driver-validated")
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 5 * time.Second, ReadyFile: ready, Now: e.clock}
	o.Complete()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, &bytes.Buffer{}) }()
	during()
	select {
	case err := <-done:
		t.Fatalf("the gate returned (%v) on a node with a change still to carry, before its pod was replaced", err)
	case <-time.After(time.Second):
	}
	if _, err := os.Stat(ready); err == nil {
		t.Fatal("the gate wrote its ready file on a node still cordoned for a change: the rollout would take one more node out")
	}
	cancel(errors.New("pod replaced"))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "next driver pod") {
			t.Fatalf("stopped gate: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not stop with its pod")
	}
	n := e.node()
	if state(n) != nodestate.UpgradeRequired || !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) {
		t.Fatalf("state=%q unschedulable=%v ours=%v; want upgrade-required and still cordoned by the upgrade for the next driver pod",
			state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
	}
}

// A second `helm upgrade` plans a newer driver while a node waits for validation of the last one, before its gate
// container starts: the gate holds the pod un-Ready.
func TestGateOnANodeRemarkedBeforeItStartsStaysUnready(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	remark(t, e)
	holdsUnready(t, e, func() {})
}

// The same plan lands while the gate waits for the validator, which then turns Ready: the gate neither writes
// uncordon-required over the plan's mark nor turns the pod Ready.
func TestGateOnANodeRemarkedWhileItWaitsStaysUnready(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	holdsUnready(t, e, func() {
		time.Sleep(200 * time.Millisecond)
		remark(t, e)
		validatorReady(t, e, e.clock().Add(time.Minute))
	})
}
