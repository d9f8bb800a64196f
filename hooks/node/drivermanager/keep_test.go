package drivermanager

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func TestHostDriverMarksPreInstalledAndTouchesNothingElse(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver() // loaded by the host's own driver
	f.Use("nvidia", 2)
	f.HostNvidiaSMI("usr/bin")
	e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))}
	// the run fails after the mark, so the driver container of this pod never starts next to the host's driver
	start := time.Now()
	_, err := e.run(e.options(newDigest))
	if err == nil {
		t.Fatal("the driver manager succeeded on a host-driver node: the driver container would start")
	}
	if time.Since(start) < 10*time.Millisecond {
		t.Fatal("failed without holding the pod: it would restart in a tight loop")
	}
	out := err.Error()
	n := e.node()
	if n.Labels[nodestate.DriverDeployLabel] != nodestate.PreInstalled {
		t.Fatalf("driver switch = %q, want pre-installed", n.Labels[nodestate.DriverDeployLabel])
	}
	if got := e.mutatingActions(); !slices.Equal(got, []string{"patch nodes"}) {
		t.Fatalf("API writes %v, want the one node patch", got)
	}
	if n.Spec.Unschedulable || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" || state(n) != "" {
		t.Fatalf("node changed beyond the mark: unschedulable=%v labels=%v", n.Spec.Unschedulable, n.Labels)
	}
	if calls := e.host.Kernel.CallList(); len(calls) != 0 {
		t.Fatalf("kernel calls on a host-driver node: %v", calls)
	}
	if !strings.Contains(out, "usr/bin/nvidia-smi") || !strings.Contains(out, "standing down") {
		t.Fatalf("summary: %q", out)
	}
}

// Flatcar installs a host driver's nvidia-smi in /opt/bin: the manager finds it there too, and its modules stay.
func TestFlatcarHostDriverIsFound(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.HostNvidiaSMI("opt/bin")
	e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
	if _, err := e.run(e.options(newDigest)); err == nil || !strings.Contains(err.Error(), "opt/bin/nvidia-smi") {
		t.Fatalf("err = %v, want the host driver in opt/bin found", err)
	}
	if n := e.node(); n.Labels[nodestate.DriverDeployLabel] != nodestate.PreInstalled {
		t.Fatalf("driver switch %q, want pre-installed", n.Labels[nodestate.DriverDeployLabel])
	}
	if calls := e.host.Kernel.CallList(); len(calls) != 0 {
		t.Fatalf("the host driver's modules were touched: %v", calls)
	}
}

// An nvidia-smi left on the host by an uninstalled driver fails without its modules: the node is no host-driver
// node, and gets the driver pod's driver.
func TestLeftoverNvidiaSMIIsNoHostDriver(t *testing.T) {
	f := kmodtest.New(t)
	f.LeftoverNvidiaSMI("usr/bin")
	e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
	out, err := e.run(e.options(newDigest))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	n := e.node()
	if n.Labels[nodestate.DriverDeployLabel] == nodestate.PreInstalled || state(n) != nodestate.ValidationRequired {
		t.Fatalf("driver switch %q state %q; want the node to get the new driver", n.Labels[nodestate.DriverDeployLabel], state(n))
	}
	if !strings.Contains(out, "exit 9: NVIDIA-SMI has failed") || !strings.Contains(out, "the new driver installs next") {
		t.Fatalf("output does not say why the host's nvidia-smi is no driver:\n%s", out)
	}
}

func TestFastPathKeepsTheDriverAndTheWorkloads(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	e.host.Use("nvidia", 3) // workloads hold the GPUs
	gpuPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": *resourceQty(1)}}}}},
	}
	if _, err := e.client.CoreV1().Pods("ml").Create(context.Background(), gpuPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.client.ClearActions()
	e.host.DriverState(newDigest) // the running driver has the new pod's config
	out, err := e.run(e.options(newDigest))
	if err != nil {
		t.Fatal(err)
	}
	if calls := e.moduleCalls(); len(calls) != 0 {
		t.Fatalf("fast path unloaded modules: %v", calls)
	}
	if got := e.mutatingActions(); !slices.Equal(got, []string{"patch nodes"}) {
		t.Fatalf("API writes %v, want only the state patch (no eviction, no cordon)", got)
	}
	n := e.node()
	if n.Spec.Unschedulable || state(n) != nodestate.UpgradeDone {
		t.Fatalf("node unschedulable=%v state=%q, want schedulable and upgrade-done", n.Spec.Unschedulable, state(n))
	}
	if !slices.Equal(e.host.LoadedModules(), []string{"nvidia", "nvidia_modeset", "nvidia_uvm", "nvidia_drm"}) {
		t.Fatalf("modules now %v", e.host.LoadedModules())
	}
	// The previous driver container's root is stale (its container is gone); it is cleared for the new one.
	if m := e.host.Mounts(); len(m) != 0 || e.host.PidFileExists() {
		t.Fatalf("stale driver root %v / pid file left", m)
	}
	if !strings.Contains(out, "kept the loaded driver, evicted nothing") {
		t.Fatalf("summary: %q", out)
	}
	if got := n.Annotations[nodestate.DriverDigestAnnotation]; got != newDigest {
		t.Fatalf("recorded driver digest %q, want %q (the kept driver's)", got, newDigest)
	}
}

func TestFastPathUndoesLeftoversOfAnInterruptedRun(t *testing.T) {
	node := gpuNode(map[string]string{"nvidia.com/gpu.deploy.dcgm": "false"})
	e := newEnv(t, node)
	// An earlier run cordoned and paused, then died; the old driver was never unloaded.
	o := e.options(newDigest)
	o.AfterStep = killAfter("pause")
	if _, err := e.run(o); !errors.Is(err, errCrashed) {
		t.Fatalf("err = %v", err)
	}
	if n := e.node(); !n.Spec.Unschedulable || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != nodestate.Paused {
		t.Fatal("setup: the interrupted run did not cordon and pause")
	}
	e.host.DriverState(newDigest)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	n := e.node()
	assertNothingPaused(t, n)
	// The interrupted change left the node cordoned: it returns to workloads once the loaded driver validated.
	if !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) || state(n) != nodestate.ValidationRequired {
		t.Fatalf("unschedulable=%v ours=%v state=%q; want validation-required with our cordon", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	n = e.node()
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeDone {
		t.Fatalf("unschedulable=%v ours=%v state=%q", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
	if n.Labels["nvidia.com/gpu.deploy.dcgm"] != "false" {
		t.Fatalf("admin's dcgm=false became %q", n.Labels["nvidia.com/gpu.deploy.dcgm"])
	}
	if _, ok := n.Labels["nvidia.com/gpu.deploy.device-plugin"]; ok {
		t.Fatal("device-plugin switch was absent before the pause and must be absent again")
	}
	if calls := e.moduleCalls(); len(calls) != 0 {
		t.Fatalf("modules unloaded: %v", calls)
	}
}
