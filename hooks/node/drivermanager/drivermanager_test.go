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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
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

var errCrashed = errors.New("killed (test)")

func resourceQty(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }

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

// errSIGTERM is the cause signal.NotifyContext gives the pod's stop context.
var errSIGTERM = errors.New("terminated signal received (test)")

func ptrTo[T any](v T) *T { return &v }
