package drivermanager

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// What the GPU Operator leaves on a node when it is removed while GPU pods run (gpu-driver-container
// ubuntu24.04/nvidia-driver, commit 06a208c; gpu-operator v26.7.0): on SIGTERM its driver container's _shutdown
// stops nvidia-persistenced, finds the modules in use ("Could not unload NVIDIA driver kernel modules, driver is in
// use") and returns before _unmount_rootfs and `rm -f` of its pid file, so the modules stay loaded, its root stays
// mounted on /run/nvidia/driver, and /run/nvidia/nvidia-driver.state keeps the operator's DRIVER_CONFIG_DIGEST, a
// decimal FNV-32a hash (internal/utils.GetObjectHashIgnoreEmptyKeys).
const (
	operatorDigest  = "3274061929"
	operatorVersion = "580.95.05"
)

// operatorNode is a node as the GPU Operator and its labeller leave it: its switches on, its upgrade controller's
// state (no annotation of ours).
func operatorNode(labels map[string]string) *corev1.Node {
	l := map[string]string{
		"nvidia.com/gpu.deploy.driver":        "true",
		"nvidia.com/gpu.deploy.device-plugin": "true",
		nodestate.UpgradeStateLabel:           string(nodestate.UpgradeDone),
	}
	for k, v := range labels {
		l[k] = v
	}
	n := gpuNode(l)
	n.Annotations = map[string]string{"nvidia.com/gpu-driver-upgrade-enabled": "true"}
	return n
}

// operatorEnv is a node running the GPU Operator's driver (version, open flavour) with a GPU pod holding it.
func operatorEnv(t *testing.T, node *corev1.Node, version string, open bool) *env {
	t.Helper()
	f := kmodtest.New(t)
	f.LoadDriver()
	f.DriverVersion(version, open)
	f.DriverState(operatorDigest)
	f.PidFile()
	f.MountDriverRoot()
	f.Use("nvidia", 2) // the GPU pod holds the GPUs
	e := &env{t: t, host: f, client: fake.NewClientset(node)}
	e.withGPUPod(nil)
	e.client.ClearActions()
	return e
}

// adoptOptions: this pod installs version with module type typ.
func (e *env) adoptOptions(version, typ string) *Options {
	o := e.options(newDigest)
	o.DriverVersion, o.KernelModuleType = version, typ
	o.Eviction.Timeout = 2 * time.Second
	return o
}

func (e *env) recordedOnHost() string {
	e.t.Helper()
	b, err := os.ReadFile(e.host.Host().StateFile())
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func (e *env) evictions() int {
	n := 0
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "create" && a.GetSubresource() == "eviction" || a.GetVerb() == "delete" && a.GetResource().Resource == "pods" && a.GetNamespace() == "ml" {
			n++
		}
	}
	return n
}

// assertAdopted: the driver stays loaded and held, nothing was evicted or cordoned, our digest is recorded on the
// host (where the driver container reads it) and on the node, and the node waits for its validator.
func assertAdopted(t *testing.T, e *env) {
	t.Helper()
	if calls := e.moduleCalls(); len(calls) != 0 {
		t.Errorf("adoption unloaded modules: %v", calls)
	}
	if n := e.evictions(); n != 0 {
		t.Errorf("adoption evicted or deleted %d pods", n)
	}
	for _, a := range e.mutatingActions() {
		if a != "patch nodes" {
			t.Errorf("adoption wrote %s; want node patches only", a)
		}
	}
	n := e.node()
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Errorf("adoption cordoned the node")
	}
	if state(n) != nodestate.ValidationRequired {
		t.Errorf("state %q, want validation-required (the validator vouches for the adopted driver)", state(n))
	}
	if got := n.Annotations[nodestate.DriverDigestAnnotation]; got != newDigest {
		t.Errorf("node's recorded digest %q, want %q", got, newDigest)
	}
	if got := e.recordedOnHost(); got != newDigest {
		t.Errorf("host's state file %q, want our digest %q (else the driver container reinstalls over a busy driver)", got, newDigest)
	}
	if !slices.Equal(e.host.LoadedModules(), []string{"nvidia", "nvidia_modeset", "nvidia_uvm", "nvidia_drm"}) {
		t.Errorf("modules now %v", e.host.LoadedModules())
	}
}

// assertChangePath: the driver change path ran: cordon, the GPU pod evicted (through the Eviction API), unload.
func assertChangePath(t *testing.T, e *env, out string, err error) {
	t.Helper()
	if strings.Contains(out, "adopted") {
		t.Fatalf("adopted: %q", out)
	}
	if n := e.evictions(); n == 0 {
		t.Errorf("the change path evicted nothing (err %v)", err)
	}
	if e.recordedOnHost() == newDigest && len(e.moduleCalls()) == 0 {
		t.Errorf("our digest was recorded over a driver that was not unloaded")
	}
}

func TestAdoptsTheOperatorsDriverWithoutEvicting(t *testing.T) {
	for _, typ := range []string{"auto", "open"} {
		t.Run(typ, func(t *testing.T) {
			e := operatorEnv(t, operatorNode(nil), operatorVersion, true)
			out, err := e.run(e.adoptOptions(operatorVersion, typ))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "adopted the loaded driver "+operatorVersion+" (open kernel modules") {
				t.Errorf("summary %q", out)
			}
			assertAdopted(t, e)
			if m := e.host.Mounts(); len(m) != 0 || e.host.PidFileExists() {
				t.Errorf("the operator's driver root %v / pid file left for our driver container", m)
			}
			// our driver container starts (the host now records our digest), restarts: the fast path, still waiting
			e.client.ClearActions()
			if out, err := e.run(e.adoptOptions(operatorVersion, typ)); err != nil || !strings.Contains(out, "kept the loaded driver") {
				t.Fatalf("next pod: %v %q", err, out)
			}
			assertAdopted(t, e)
			// the gate: the validator turns Ready with the adopted driver
			validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
			if err := uncordon(e); err != nil {
				t.Fatal(err)
			}
			if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
				t.Errorf("after validation: state %q unschedulable %v", state(n), n.Spec.Unschedulable)
			}
		})
	}
}

func TestAdoptionWithoutAnOperatorDigest(t *testing.T) {
	// an installer that records no digest at all (older operators, a hand-run driver container)
	e := operatorEnv(t, operatorNode(nil), operatorVersion, false)
	if err := os.Remove(e.host.Host().StateFile()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(e.adoptOptions(operatorVersion, "proprietary")); err != nil {
		t.Fatal(err)
	}
	assertAdopted(t, e)
}

func TestAdoptionRefusesAnotherDriver(t *testing.T) {
	cases := []struct {
		name, version string
		open          bool
		typ           string
		host          func(*kmodtest.Fixture)
	}{
		{name: "version", version: "570.172.08", open: true, typ: "auto"},
		{name: "flavour", version: operatorVersion, open: false, typ: "open"},
		{name: "flavour proprietary", version: operatorVersion, open: true, typ: "proprietary"},
		// never adopt on a guess
		{name: "unreadable version", version: operatorVersion, open: true, typ: "auto", host: func(f *kmodtest.Fixture) {
			os.Remove(f.Root + "/sys/module/nvidia/version")
		}},
		{name: "no banner", version: operatorVersion, open: true, typ: "auto", host: func(f *kmodtest.Fixture) {
			os.Remove(f.Root + "/proc/driver/nvidia/version")
		}},
		{name: "banner of another version", version: operatorVersion, open: true, typ: "auto", host: func(f *kmodtest.Fixture) {
			os.WriteFile(f.Root+"/proc/driver/nvidia/version", []byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build\n"), 0o644)
		}},
		{name: "branch only", version: "580", open: true, typ: "auto"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := operatorEnv(t, operatorNode(nil), c.version, c.open)
			if c.host != nil {
				c.host(e.host)
			}
			e.host.Use("nvidia", -2) // the eviction frees the GPUs
			out, err := e.run(e.adoptOptions(operatorVersion, c.typ))
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			assertChangePath(t, e, out, err)
			if calls := e.moduleCalls(); len(calls) == 0 {
				t.Errorf("the other driver was not unloaded")
			}
			if n := e.node(); state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable {
				t.Errorf("state %q unschedulable %v; want the change path's validation-required, cordoned", state(n), n.Spec.Unschedulable)
			}
		})
	}
	t.Run("pod without version", func(t *testing.T) {
		e := operatorEnv(t, operatorNode(nil), operatorVersion, true)
		e.host.Use("nvidia", -2)
		out, err := e.run(e.options(newDigest))
		if err != nil {
			t.Fatal(err)
		}
		assertChangePath(t, e, out, err)
	})
}

// Our own driver with another config (a sha256 recorded, our annotation on the node) is a driver change even when the
// version and flavour are the same: the digest covers more than those.
func TestOwnDriverIsNeverAdopted(t *testing.T) {
	e := operatorEnv(t, operatorNode(nil), operatorVersion, true)
	e.host.DriverState(oldDigest)
	e.host.Use("nvidia", -2)
	out, err := e.run(e.adoptOptions(operatorVersion, "auto"))
	if err != nil {
		t.Fatal(err)
	}
	assertChangePath(t, e, out, err)
}

func TestStopMidAdoptionConverges(t *testing.T) {
	for _, how := range []string{"SIGTERM", "kill"} {
		t.Run(how, func(t *testing.T) {
			e := operatorEnv(t, operatorNode(nil), operatorVersion, true)
			o := e.adoptOptions(operatorVersion, "auto")
			ctx := context.Background()
			if how == "SIGTERM" {
				ctx, o.AfterStep = stopAfter(AdoptStep)
			} else {
				o.AfterStep = killAfter(AdoptStep)
			}
			err := o.Run(ctx, &bytes.Buffer{})
			if err == nil || (how == "SIGTERM" && !errors.Is(err, errSIGTERM)) || (how == "kill" && !errors.Is(err, errCrashed)) {
				t.Fatalf("err = %v", err)
			}
			if n := e.node(); state(n) != nodestate.ValidationRequired || n.Spec.Unschedulable {
				t.Fatalf("stopped: state %q unschedulable %v; want validation-required, never cordoned", state(n), n.Spec.Unschedulable)
			}
			if got := e.recordedOnHost(); got != operatorDigest {
				t.Fatalf("stopped before the host record, yet it holds %q", got)
			}
			// the next driver pod adopts again
			if out, err := e.run(e.adoptOptions(operatorVersion, "auto")); err != nil || !strings.Contains(out, "adopted") {
				t.Fatalf("next pod: %v %q", err, out)
			}
			assertAdopted(t, e)
		})
	}
}

// The GPU Operator's upgrade controller writes the same label key and values as ours; its upgrade-failed carries no
// annotation of ours, and is not a failure of ours to refuse on until `upgrade retry`.
func TestOperatorsUpgradeFailedIsNotOurs(t *testing.T) {
	failed := map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)}
	t.Run("same driver: adopted", func(t *testing.T) {
		e := operatorEnv(t, operatorNode(failed), operatorVersion, true)
		if _, err := e.run(e.adoptOptions(operatorVersion, "auto")); err != nil {
			t.Fatal(err)
		}
		assertAdopted(t, e)
	})
	t.Run("other driver: the change path, not a refusal", func(t *testing.T) {
		e := operatorEnv(t, operatorNode(failed), "570.172.08", true)
		e.host.Use("nvidia", -2)
		out, err := e.run(e.adoptOptions(operatorVersion, "auto"))
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		assertChangePath(t, e, out, err)
	})
	t.Run("ours is still refused", func(t *testing.T) {
		n := operatorNode(failed)
		n.Annotations[nodestate.UpgradeSinceAnnotation] = "2026-09-01T11:00:00Z"
		e := operatorEnv(t, n, "570.172.08", true)
		_, err := e.run(e.adoptOptions(operatorVersion, "auto"))
		if err == nil || !strings.Contains(err.Error(), "upgrade retry") {
			t.Fatalf("err = %v, want our refusal", err)
		}
		if e.evictions() != 0 || len(e.moduleCalls()) != 0 {
			t.Errorf("a refused node was touched")
		}
	})
}

// An admin's skip label: the same driver is adopted (nothing changes on the node, the label stays); another driver
// waits for the label to go, nothing evicted or unloaded.
func TestAdoptionHonoursTheSkipLabel(t *testing.T) {
	skip := map[string]string{nodestate.UpgradeSkipLabel: "true"}
	t.Run("same driver", func(t *testing.T) {
		e := operatorEnv(t, operatorNode(skip), operatorVersion, true)
		o := e.adoptOptions(operatorVersion, "auto")
		o.SkipWait = 300 * time.Millisecond // bounded: a wait here would be the failure
		if _, err := e.run(o); err != nil {
			t.Fatal(err)
		}
		assertAdopted(t, e)
		if e.node().Labels[nodestate.UpgradeSkipLabel] != "true" {
			t.Errorf("the skip label was removed")
		}
	})
	t.Run("other driver", func(t *testing.T) {
		e := operatorEnv(t, operatorNode(skip), "570.172.08", true)
		o := e.adoptOptions(operatorVersion, "auto")
		o.SkipWait = 300 * time.Millisecond
		_, err := e.run(o)
		if err == nil || !strings.Contains(err.Error(), nodestate.UpgradeSkipLabel+"=true") {
			t.Fatalf("err = %v, want the skip label named", err)
		}
		if acts := e.mutatingActions(); len(acts) != 0 || len(e.moduleCalls()) != 0 {
			t.Errorf("a skipped node was touched: %v %v", acts, e.moduleCalls())
		}
		if e.recordedOnHost() != operatorDigest {
			t.Errorf("our digest was recorded on a skipped node")
		}
	})
}
