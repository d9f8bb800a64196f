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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const (
	nodeName  = "gpu-1"
	namespace = "gpu-system"
	oldDigest = "1111111111111111111111111111111111111111111111111111111111111111"
	newDigest = "2222222222222222222222222222222222222222222222222222222222222222"
)

// env is one node: its fixture host tree with a containerized driver loaded (old digest, root mounted, pid
// file), and the API objects of a fake cluster.
type env struct {
	t      *testing.T
	host   *kmodtest.Fixture
	client *fake.Clientset
	// now is the clock of the manager and the gate (zero: 2026-09-01 12:00 UTC).
	now time.Time
}

func (e *env) clock() time.Time {
	if e.now.IsZero() {
		return time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	}
	return e.now
}

func newEnv(t *testing.T, node *corev1.Node) *env {
	t.Helper()
	f := kmodtest.New(t)
	f.LoadDriver()
	f.DriverState(oldDigest)
	f.PidFile()
	f.MountDriverRoot()
	return &env{t: t, host: f, client: withDaemonSetController(fake.NewClientset(node))}
}

func gpuNode(labels map[string]string) *corev1.Node {
	l := map[string]string{"nvidia.com/gpu.present": "true"}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: l}}
}

func (e *env) options(digest string) *Options {
	o := &Options{
		Client: e.client, NodeName: nodeName, Namespace: namespace, Host: e.host.Host(), Digest: digest,
		Eviction: Eviction{Enabled: true}, Now: e.clock,
		OperandTimeout: 5 * time.Second, HostDriverHold: 10 * time.Millisecond,
		MOFEDTimeout: 300 * time.Millisecond, MOFEDInterval: 10 * time.Millisecond,
	}
	o.Complete()
	if err := o.Validate(); err != nil {
		e.t.Fatal(err)
	}
	return o
}

func (e *env) run(o *Options) (string, error) {
	var out bytes.Buffer
	err := o.Run(context.Background(), &out)
	return out.String(), err
}

func (e *env) node() *corev1.Node {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// mutatingActions lists the API writes the run made, as "verb resource[/subresource]", leaving out those of the
// node's Lease (lease_test.go checks them).
func (e *env) mutatingActions() []string {
	var out []string
	for _, a := range e.client.Actions() {
		switch a.GetVerb() {
		case "get", "list", "watch":
			continue
		}
		r := a.GetResource().Resource
		if r == "leases" {
			continue
		}
		if s := a.GetSubresource(); s != "" {
			r += "/" + s
		}
		out = append(out, a.GetVerb()+" "+r)
	}
	return out
}

func (e *env) moduleCalls() []string {
	var out []string
	for _, c := range e.host.Kernel.CallList() {
		if strings.HasPrefix(c, "delete_module ") {
			out = append(out, strings.TrimPrefix(c, "delete_module "))
		}
	}
	return out
}

func state(n *corev1.Node) nodestate.UpgradeState {
	return nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
}

// assertNothingPaused: every switch is back and the pause record is gone.
func assertNothingPaused(t *testing.T, n *corev1.Node) {
	t.Helper()
	for k, v := range n.Labels {
		if v == nodestate.Paused {
			t.Errorf("%s is still %s", k, v)
		}
	}
	if _, ok := n.Annotations[nodestate.PausedLabelsAnnotation]; ok {
		t.Errorf("pause record %s left on the node", nodestate.PausedLabelsAnnotation)
	}
}

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

func TestUpgradeUnloadsClearsAndWaitsForValidation(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	e.host.LoadModule("nvidia_peermem", "nvidia")
	out, err := e.run(e.options(newDigest))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia"}
	if got := e.moduleCalls(); !slices.Equal(got, want) {
		t.Fatalf("delete_module calls %v, want %v", got, want)
	}
	if m := e.host.Mounts(); len(m) != 0 || e.host.PidFileExists() {
		t.Fatalf("driver root %v / pid file left", m)
	}
	n := e.node()
	assertNothingPaused(t, n)
	if n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" {
		t.Fatalf("device-plugin switch %q, want true restored", n.Labels["nvidia.com/gpu.deploy.device-plugin"])
	}
	if !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) || state(n) != nodestate.ValidationRequired {
		t.Fatalf("unschedulable=%v ours=%v state=%q; want our cordon kept in validation-required", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
	if !strings.Contains(out, "cordoned until the node's validation passes") {
		t.Fatalf("summary: %q", out)
	}
	if got := n.Annotations[nodestate.DriverDigestAnnotation]; got != newDigest {
		t.Fatalf("recorded driver digest %q, want %q (the driver about to install)", got, newDigest)
	}
	// The states it passed through, in order.
	var states []string
	for _, a := range e.client.Actions() {
		if p, ok := a.(interface{ GetPatch() []byte }); ok {
			for _, s := range []nodestate.UpgradeState{nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.PodRestartRequired, nodestate.ValidationRequired} {
				if strings.Contains(string(p.GetPatch()), `"`+nodestate.UpgradeStateLabel+`":"`+string(s)+`"`) {
					states = append(states, string(s))
				}
			}
		}
	}
	if !slices.Equal(states, []string{"cordon-required", "pod-deletion-required", "pod-restart-required", "validation-required"}) {
		t.Fatalf("states written: %v", states)
	}
}

func TestAdminCordonIsNeverLifted(t *testing.T) {
	node := gpuNode(nil)
	node.Spec.Unschedulable = true // the admin's
	e := newEnv(t, node)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	n := e.node()
	if !n.Spec.Unschedulable || nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeDone {
		t.Fatalf("unschedulable=%v ours=%v state=%q; want the admin's cordon kept", n.Spec.Unschedulable, nodestate.CordonedByUs(n), state(n))
	}
}

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

func TestNoDriverLoadedClearsStaleFilesWithoutEvicting(t *testing.T) {
	f := kmodtest.New(t)
	f.DriverState(oldDigest)
	f.PidFile()
	f.MountDriverRoot()
	e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if m := f.Mounts(); len(m) != 0 || f.PidFileExists() {
		t.Fatalf("stale root %v / pid file left", m)
	}
	if got := e.mutatingActions(); !slices.Equal(got, []string{"patch nodes"}) {
		t.Fatalf("API writes %v, want only the state patch", got)
	}
	if n := e.node(); n.Spec.Unschedulable || state(n) != nodestate.ValidationRequired {
		t.Fatalf("unschedulable=%v state=%q", n.Spec.Unschedulable, state(n))
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

var errCrashed = errors.New("killed (test)")

func killAfter(step string) func(string) error {
	return func(s string) error {
		if s == step {
			return errCrashed
		}
		return nil
	}
}

func resourceQty(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }

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

// TestUpgradeFailedNodeIsRefusedUntilRetry: a restarted driver pod on a node whose driver change failed does not
// try again on its own (cordoning and evicting every back-off period); it keeps the loaded driver and names the
// way out.
func TestUpgradeFailedNodeIsRefusedUntilRetry(t *testing.T) {
	node := gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	node.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "evict GPU pods: PDB training-pdb"}
	e := newEnv(t, node)
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "upgrade retry "+nodeName) || !strings.Contains(err.Error(), "PDB training-pdb") {
		t.Fatalf("err = %v, want a refusal naming the reason and `upgrade retry`", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a refused run wrote to the API: %v", acts)
	}
	if calls := e.host.Kernel.CallList(); len(calls) != 0 {
		t.Errorf("a refused run touched the kernel: %v", calls)
	}
	// once retried (state upgrade-required) the change goes ahead
	n := e.node()
	n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeRequired)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := e.run(e.options(newDigest)); err != nil {
		t.Fatalf("after retry: %v\n%s", err, out)
	}
	if got := e.node().Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.ValidationRequired) {
		t.Errorf("after retry: state %q, want validation-required", got)
	}
}

// TestSkipLabelKeepsTheDriverUntilRemoved: on a node labelled to skip driver upgrades the manager changes
// nothing and waits; removing the label lets the change go ahead in the same run.
func TestSkipLabelKeepsTheDriverUntilRemoved(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeSkipLabel: "true"}))
	o := e.options(newDigest)
	o.SkipWait = 300 * time.Millisecond
	if _, err := e.run(o); err == nil || !strings.Contains(err.Error(), nodestate.UpgradeSkipLabel+"=true") {
		t.Fatalf("err = %v, want the skip label named", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a skipped node was written to: %v", acts)
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Errorf("loaded modules %v, want the driver kept", mods)
	}

	o.SkipWait = 0
	done := make(chan error, 1)
	go func() { _, err := e.run(o); done <- err }()
	time.Sleep(200 * time.Millisecond)
	n := e.node()
	delete(n.Labels, nodestate.UpgradeSkipLabel)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the label went: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager kept waiting after the skip label was removed")
	}
	if mods := e.host.LoadedModules(); len(mods) != 0 {
		t.Errorf("loaded modules %v after the change, want none", mods)
	}
}

func TestNouveauIsUnloadedBeforeTheDriverInstalls(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadModule("drm")
	f.LoadModule("nouveau", "drm")
	e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
	out, err := e.run(e.options(newDigest))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(f.LoadedModules(), "nouveau") || !strings.Contains(out, "unloaded nouveau") {
		t.Fatalf("modules %v; summary %q", f.LoadedModules(), out)
	}

	// a nouveau in use (a console on it) fails the run with what to do
	f = kmodtest.New(t)
	f.LoadModule("nouveau")
	f.Use("nouveau", 1)
	e = &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
	if _, err := e.run(e.options(newDigest)); err == nil || !strings.Contains(err.Error(), "nouveau is in use") || !strings.Contains(err.Error(), "blacklist") {
		t.Fatalf("err %v", err)
	}
}

func TestGPUsLeftOnVFIOAreReleased(t *testing.T) {
	for _, loaded := range []bool{false, true} {
		var e *env
		if loaded { // a driver change: the release follows the unload
			e = newEnv(t, gpuNode(nil))
		} else { // a node leaving vm-passthrough: no NVIDIA driver loaded
			e = &env{t: t, host: kmodtest.New(t), client: fake.NewClientset(gpuNode(nil))}
		}
		f := e.host
		f.AddPCIFunction("0000:01:00.0", kmod.VendorNVIDIA, "vfio-pci", "vfio-pci")
		f.AddPCIFunction("0000:02:00.0", kmod.VendorNVIDIA, "nvgrace_gpu_vfio_pci", "")
		f.AddPCIFunction("0000:03:00.0", kmod.VendorNVIDIA, "nvidia", "")
		f.AddPCIFunction("0000:04:00.0", "0x8086", "vfio-pci", "vfio-pci")
		out, err := e.run(e.options(newDigest))
		if err != nil {
			t.Fatal(err)
		}
		for addr, want := range map[string][2]string{
			"0000:01:00.0": {"", ""}, "0000:02:00.0": {"", ""},
			"0000:03:00.0": {"nvidia", ""}, "0000:04:00.0": {"vfio-pci", "vfio-pci"},
		} {
			if drv, override := f.PCIDriver(addr); drv != want[0] || override != want[1] {
				t.Errorf("loaded %v: %s bound to %q, override %q; want %q, %q", loaded, addr, drv, override, want[0], want[1])
			}
		}
		b, _ := os.ReadFile(filepath.Join(f.Root, "sys/bus/pci/drivers/vfio-pci/unbind"))
		if string(b) != "0000:01:00.0" {
			t.Errorf("vfio-pci's unbind got %q", b)
		}
		if !strings.Contains(out, "released 0000:01:00.0, 0000:02:00.0 from vfio-pci") {
			t.Errorf("summary %q", out)
		}
	}
}

func TestGPUDirectRDMAWaitsForMOFED(t *testing.T) {
	run := func(setup func(f *kmodtest.Fixture), hostMOFED bool) (string, error) {
		f := kmodtest.New(t)
		setup(f)
		e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
		o := e.options(newDigest)
		o.GPUDirectRDMA, o.HostMOFED = true, hostMOFED
		return e.run(o)
	}
	mellanox := func(f *kmodtest.Fixture) { f.AddPCIFunction("0000:81:00.0", kmod.VendorMellanox, "mlx5_core", "") }

	if _, err := run(mellanox, false); err == nil || !strings.Contains(err.Error(), "MOFED is not ready after 300ms: no ") ||
		!strings.Contains(err.Error(), "/run/mellanox/drivers/.driver-ready (the MOFED driver container)") {
		t.Fatalf("containerized MOFED not ready: err %v", err)
	}
	if out, err := run(func(f *kmodtest.Fixture) { mellanox(f); f.MOFEDContainerReady() }, false); err != nil || !strings.Contains(out, "MOFED ready") {
		t.Fatalf("containerized MOFED ready: %q, %v", out, err)
	}
	if _, err := run(mellanox, true); err == nil || !strings.Contains(err.Error(), "kernel module mlx5_core in ") {
		t.Fatalf("host MOFED not loaded: err %v", err)
	}
	if out, err := run(func(f *kmodtest.Fixture) { mellanox(f); f.LoadModule("mlx5_core") }, true); err != nil || !strings.Contains(out, "MOFED ready") {
		t.Fatalf("host MOFED loaded: %q, %v", out, err)
	}
	if out, err := run(func(*kmodtest.Fixture) {}, false); err != nil || strings.Contains(out, "MOFED ready") {
		t.Fatalf("no Mellanox device: %q, %v", out, err)
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

// errSIGTERM is the cause signal.NotifyContext gives the pod's stop context.
var errSIGTERM = errors.New("terminated signal received (test)")

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

func ptrTo[T any](v T) *T { return &v }

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
