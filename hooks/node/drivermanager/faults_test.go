package drivermanager

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// A driver in use fails the run before any module is removed: the modules above nvidia would otherwise be gone
// while the node goes back to work. The error names the module, the process and its pod.
func TestBusyDriverFailsRestoresAndNamesTheProcess(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	e.host.Use("nvidia", 1)
	e.host.OpenDevice(31337, "stray-cuda-app", "/dev/nvidia0")
	const uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	e.host.Cgroup(31337, "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+strings.ReplaceAll(uid, "-", "_")+".slice/cri-containerd-1.scope\n")
	stray := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: "ml", UID: uid}, Spec: corev1.PodSpec{NodeName: nodeName}}
	if _, err := e.client.CoreV1().Pods("ml").Create(context.Background(), stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.run(e.options(newDigest))
	if err == nil {
		t.Fatal("a busy driver did not fail the run")
	}
	for _, want := range []string{"kernel module nvidia is in use", "pid 31337 (stray-cuda-app) of pod ml/stray", "upgrade-failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if calls := e.moduleCalls(); len(calls) != 0 {
		t.Errorf("modules removed before the busy one was found: %v", calls)
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Errorf("loaded modules %v, want the whole driver", mods)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Fatal("our cordon was not lifted after the failure")
	}
	if state(n) != nodestate.UpgradeFailed || !strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], "stray-cuda-app") {
		t.Fatalf("state %q reason %q", state(n), n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
}

// An unload that fails midway (a user came after the check) loads back what it removed: the node returns to work
// with the whole driver it had, and is upgrade-failed.
func TestUnloadFailingMidwayLoadsBackAndRestores(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	e.host.Kernel.Fail = func(call string) error {
		if call == "delete_module nvidia_uvm" {
			return unix.EBUSY
		}
		return nil
	}
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "nvidia_uvm is in use") || !strings.Contains(err.Error(), "our cordon lifted") {
		t.Fatalf("err = %v, want nvidia_uvm busy and the node restored", err)
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Fatalf("loaded modules %v, want the whole driver back", mods)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if n.Spec.Unschedulable || state(n) != nodestate.UpgradeFailed {
		t.Fatalf("unschedulable=%v state=%q; want uncordoned and upgrade-failed", n.Spec.Unschedulable, state(n))
	}
}

// An unload that fails midway and cannot load back what it removed leaves the node cordoned and upgrade-failed,
// the reason naming the modules it lacks: a node with half a driver never goes back to work.
func TestUnloadFailingMidwayWithoutReloadKeepsTheCordon(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	e.host.Kernel.Fail = func(call string) error {
		switch {
		case call == "delete_module nvidia":
			return unix.EBUSY
		case strings.HasPrefix(call, "modprobe "):
			return errors.New("modprobe: FATAL: Module not found")
		}
		return nil
	}
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "our cordon kept") {
		t.Fatalf("err = %v, want the cordon kept", err)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeFailed {
		t.Fatalf("unschedulable=%v ours=%v state=%q; want our cordon kept and upgrade-failed", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
	reason := n.Annotations[nodestate.UpgradeReasonAnnotation]
	for _, want := range []string{"kernel module nvidia is in use", "nvidia_uvm, nvidia_modeset, nvidia_drm were removed and not loaded back"} {
		if !strings.Contains(reason, want) {
			t.Errorf("reason %q lacks %q", reason, want)
		}
	}
}

// A failure after the driver was unloaded (here the stale driver root cannot be unmounted) keeps our cordon: the
// node has no driver.
func TestFailureAfterTheUnloadKeepsTheCordon(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	e.host.Kernel.Fail = func(call string) error {
		if strings.HasPrefix(call, "umount ") {
			return unix.EPERM
		}
		return nil
	}
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "no NVIDIA driver is loaded") {
		t.Fatalf("err = %v, want a failure keeping the cordon of a node without a driver", err)
	}
	if mods := e.host.LoadedModules(); len(mods) != 0 {
		t.Fatalf("modules %v: the unload did not happen", mods)
	}
	if n := e.node(); !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeFailed {
		t.Fatalf("unschedulable=%v ours=%v state=%q; want our cordon kept and upgrade-failed", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
}

// A run killed after any step, then started again (the kubelet restarts the init container), converges: the
// driver is unloaded, nothing is paused, our cordon is kept only while validation is pending, and the
// uncordon step finishes the node. An admin's cordon survives all of it.
func TestCrashAfterEachStepConverges(t *testing.T) {
	for _, adminCordon := range []bool{false, true} {
		for _, step := range Steps {
			name := step
			if adminCordon {
				name += "/admin-cordoned"
			}
			t.Run(name, func(t *testing.T) {
				node := gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm": "false"})
				node.Spec.Unschedulable = adminCordon
				e := newEnv(t, node)
				o := e.options(newDigest)
				o.AfterStep = killAfter(step)
				if _, err := e.run(o); !errors.Is(err, errCrashed) {
					t.Fatalf("first run: %v, want the injected crash", err)
				}
				if _, err := e.run(e.options(newDigest)); err != nil {
					t.Fatalf("restarted run: %v", err)
				}
				if mods := e.host.LoadedModules(); len(mods) != 0 {
					t.Fatalf("modules still loaded: %v", mods)
				}
				n := e.node()
				assertNothingPaused(t, n)
				if n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" || n.Labels["nvidia.com/gpu.deploy.dcgm"] != "false" {
					t.Fatalf("switches not as before: %v", n.Labels)
				}
				if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || nodestate.CordonedByUs(n) == adminCordon {
					t.Fatalf("state=%q unschedulable=%v ours=%v", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
				}
				// The new driver loads; its pod's manager restarts once more (fast path), then validation passes.
				e.host.LoadDriver()
				e.host.DriverState(newDigest)
				if _, err := e.run(e.options(newDigest)); err != nil {
					t.Fatal(err)
				}
				if n := e.node(); state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable {
					t.Fatalf("fast path during validation: state=%q unschedulable=%v; want both kept", state(n), n.Spec.Unschedulable)
				}
				validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC))
				if err := uncordon(e); err != nil {
					t.Fatal(err)
				}
				n = e.node()
				if state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable != adminCordon || nodestate.CordonedByUs(n) {
					t.Fatalf("end: state=%q unschedulable=%v ours=%v", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
				}
			})
		}
	}
}

func killAfter(step string) func(string) error {
	return func(s string) error {
		if s == step {
			return errCrashed
		}
		return nil
	}
}

// With auto-drain, a driver still busy after the GPU pods left (a pod the GPU filter cannot see) makes the run
// drain the node once and unload again.
func TestBusyDriverWithAutoDrainDrainsAndRetries(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	busyOnce := true
	e.host.Kernel.Fail = func(call string) error {
		if call == "delete_module nvidia" && busyOnce {
			busyOnce = false
			return unix.EBUSY
		}
		return nil
	}
	o := e.options(newDigest)
	o.Drain.Enabled = true
	if _, err := e.run(o); err != nil {
		t.Fatal(err)
	}
	// the busy nvidia made the run load back what it had removed, drain, and unload the whole driver again
	want := []string{"delete_module nvidia_drm", "delete_module nvidia_modeset", "delete_module nvidia_uvm", "delete_module nvidia",
		"modprobe nvidia_uvm", "modprobe nvidia_modeset", "modprobe nvidia_drm",
		"delete_module nvidia_drm", "delete_module nvidia_modeset", "delete_module nvidia_uvm", "delete_module nvidia"}
	if got := e.host.Kernel.CallList(); !slices.Equal(got[:min(len(got), len(want))], want) {
		t.Fatalf("kernel calls %v; want %v: nvidia tried again after the drain", got, want)
	}
	drained := false
	for _, a := range e.client.Actions() {
		if p, ok := a.(interface{ GetPatch() []byte }); ok && strings.Contains(string(p.GetPatch()), string(nodestate.DrainRequired)) {
			drained = true
		}
	}
	if n := e.node(); !drained || state(n) != nodestate.ValidationRequired {
		t.Fatalf("drain-required written: %v; end state %q", drained, state(n))
	}
}

// TestMalformedPauseRecordRefusesBeforeTouchingTheNode: a pause record nobody can read stops the run before the
// cordon and the eviction, naming the node and the annotation; a null record is no record.
func TestMalformedPauseRecordRefusesBeforeTouchingTheNode(t *testing.T) {
	node := gpuNode(nil)
	node.Annotations = map[string]string{nodestate.PausedLabelsAnnotation: `{"nvidia.com/gpu.deploy.dcgm": 1}`}
	e := newEnv(t, node)
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "node "+nodeName) || !strings.Contains(err.Error(), nodestate.PausedLabelsAnnotation) {
		t.Fatalf("err = %v, want one naming the node and the annotation", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("the run wrote %v before refusing", acts)
	}
	if calls := e.host.Kernel.CallList(); len(calls) != 0 {
		t.Errorf("the run touched the kernel: %v", calls)
	}

	node = gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"})
	node.Annotations = map[string]string{nodestate.PausedLabelsAnnotation: "null"}
	e = newEnv(t, node)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatalf("null pause record: %v", err)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if state(n) != nodestate.ValidationRequired || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" {
		t.Fatalf("state %q, labels %v", state(n), n.Labels)
	}
}

// stopAfter returns the pod's stop context and an AfterStep that cancels it, as SIGTERM does, right after step.
func stopAfter(step string) (context.Context, func(string) error) {
	ctx, cancel := context.WithCancelCause(context.Background())
	return ctx, func(s string) error {
		if s == step {
			cancel(errSIGTERM)
		}
		return nil
	}
}

// finish plays the rest of a driver change on a node left validation-required: the new driver loads, its pod's
// manager runs again (fast path), the validator turns Ready, and the gate finishes the node.
func finish(t *testing.T, e *env) {
	t.Helper()
	e.host.LoadDriver()
	e.host.DriverState(newDigest)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Fatalf("end: state=%q unschedulable=%v ours=%v; want upgrade-done and uncordoned", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n))
	}
}

// TestStopAfterEachStepIsNoFailure: a driver pod stopped (SIGTERM: a pod deletion, a second rollout) right after
// any step leaves the node as that step left it — no upgrade-failed, no cordon lifted, no pause undone — and the
// next driver pod resumes from there to upgrade-done.
func TestStopAfterEachStepIsNoFailure(t *testing.T) {
	reached := map[string]nodestate.UpgradeState{
		"detect": "", "claim": "", "cordon": nodestate.PodDeletionRequired, "evict": nodestate.PodDeletionRequired,
		"pause": nodestate.PodRestartRequired, "operands": nodestate.PodRestartRequired,
		"unload": nodestate.PodRestartRequired, "unmount": nodestate.PodRestartRequired,
	}
	for _, step := range Steps {
		t.Run(step, func(t *testing.T) {
			e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm": "false"}))
			o := e.options(newDigest)
			ctx, afterStep := stopAfter(step)
			o.AfterStep = afterStep
			err := o.Run(ctx, &bytes.Buffer{})
			if !errors.Is(err, errSIGTERM) {
				t.Fatalf("stopped run: err = %v, want the stop's cause", err)
			}
			n := e.node()
			if state(n) != reached[step] {
				t.Fatalf("state %q after a stop at %s, want %q (what the step reached)", state(n), step, reached[step])
			}
			if _, ok := n.Annotations[nodestate.UpgradeReasonAnnotation]; ok {
				t.Errorf("a reason was written: %q", n.Annotations[nodestate.UpgradeReasonAnnotation])
			}
			if reached[step] != "" && (!n.Spec.Unschedulable || !nodestate.CordonedByUs(n)) {
				t.Errorf("our cordon was lifted by the stop")
			}
			if p := slices.Index(Steps, "pause"); slices.Index(Steps, step) >= p && n.Labels["nvidia.com/gpu.deploy.device-plugin"] != nodestate.Paused {
				t.Errorf("the pause was undone by the stop: %v", n.Labels)
			}
			if _, err := e.run(e.options(newDigest)); err != nil {
				t.Fatalf("next pod: %v", err)
			}
			if n := e.node(); state(n) != nodestate.ValidationRequired || !nodestate.CordonedByUs(n) || len(e.host.LoadedModules()) != 0 {
				t.Fatalf("next pod: state=%q ours=%v modules=%v", state(n), nodestate.CordonedByUs(n), e.host.LoadedModules())
			}
			finish(t, e)
			if n := e.node(); n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" || n.Labels["nvidia.com/gpu.deploy.dcgm"] != "false" {
				t.Fatalf("switches not as before: %v", n.Labels)
			}
		})
	}
}

// TestStopWhileWaitingForOperandsIsNoFailure: SIGTERM in the middle of a wait (paused operands' pods still on the
// node; they leave while the GPU pods are evicted, pod-deletion-required) stops the run there, the node paused and
// cordoned, not failed.
func TestStopWhileWaitingForOperandsIsNoFailure(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	plugin := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-device-plugin-x", Namespace: namespace,
		Labels: map[string]string{ComponentLabel: "device-plugin"}}, Spec: corev1.PodSpec{NodeName: nodeName}}
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), plugin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(300*time.Millisecond, func() { cancel(errSIGTERM) })
	if err := e.options(newDigest).Run(ctx, &bytes.Buffer{}); !errors.Is(err, errSIGTERM) {
		t.Fatalf("err = %v, want the stop", err)
	}
	n := e.node()
	if state(n) != nodestate.PodDeletionRequired || !nodestate.CordonedByUs(n) || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != nodestate.Paused {
		t.Fatalf("state=%q ours=%v labels=%v; want the wait's state kept", state(n), nodestate.CordonedByUs(n), n.Labels)
	}
	if err := e.client.CoreV1().Pods(namespace).Delete(context.Background(), plugin.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	finish(t, e)
}

// TestGateStoppedWhileWaitingIsNoFailure: the upgrade gate stopped while it waits for the validator leaves the
// node validation-required and cordoned, so the next driver pod's gate goes on waiting; only its own timeout
// fails the node.
func TestGateStoppedWhileWaitingIsNoFailure(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(t.TempDir(), "driver-validated")
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 5 * time.Second, ReadyFile: ready}
	o.Complete()
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(300*time.Millisecond, func() { cancel(errSIGTERM) })
	if err := o.Run(ctx, &bytes.Buffer{}); !errors.Is(err, errSIGTERM) {
		t.Fatalf("err = %v, want the stop", err)
	}
	n := e.node()
	if state(n) != nodestate.ValidationRequired || !nodestate.CordonedByUs(n) || n.Annotations[nodestate.UpgradeReasonAnnotation] != "" {
		t.Fatalf("state=%q ours=%v reason=%q; want validation-required, still cordoned", state(n), nodestate.CordonedByUs(n), n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if _, err := os.Stat(ready); err == nil {
		t.Fatal("the stopped gate wrote its ready file")
	}
	finish(t, e)
}

// TestStopDuringABlockedEvictionDoesNotDrain: SIGTERM while an eviction waits on a disruption budget is a stop,
// not an eviction failure: with auto-drain on, the node is not drained because of it, nor failed.
func TestStopDuringABlockedEvictionDoesNotDrain(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	gpuPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "u", Controller: ptrTo(true)}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": *resourceQty(1)}}}}},
	}
	if _, err := e.client.CoreV1().Pods("ml").Create(context.Background(), gpuPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}, {Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}},
		{GroupVersion: "policy/v1", APIResources: []metav1.APIResource{{Name: "poddisruptionbudgets", Kind: "PodDisruptionBudget"}}},
	}
	// every eviction is refused, as a budget that allows no disruption refuses it
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	})
	o := e.options(newDigest)
	o.Drain.Enabled = true
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(500*time.Millisecond, func() { cancel(errSIGTERM) })
	if err := o.Run(ctx, &bytes.Buffer{}); !errors.Is(err, errSIGTERM) {
		t.Fatalf("err = %v, want the stop", err)
	}
	n := e.node()
	if state(n) != nodestate.PodDeletionRequired || !nodestate.CordonedByUs(n) {
		t.Fatalf("state=%q ours=%v; want pod-deletion-required and still cordoned", state(n), nodestate.CordonedByUs(n))
	}
	for _, a := range e.client.Actions() {
		if p, ok := a.(interface{ GetPatch() []byte }); ok && strings.Contains(string(p.GetPatch()), string(nodestate.DrainRequired)) {
			t.Fatal("the stop was taken for an eviction failure: drain-required written")
		}
	}
}
