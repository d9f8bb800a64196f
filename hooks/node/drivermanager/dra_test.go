package drivermanager

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const draSwitch = nodestate.DeployLabelPrefix + "dra-driver"

// draNode is a DRA node as the chart leaves it: the DRA kubelet plugin's pod runs in the operand namespace, a
// workload pod holds a claim allocated by gpu.nvidia.com, and the API server plays the Eviction API (refusing every
// eviction when pdbBlocks, as a budget that allows no disruption does) and the DaemonSet controller (the plugin's
// pod goes once its switch is paused). events records, in order, what happened to the node's pods and switches.
type draNode struct {
	*env
	mu        sync.Mutex
	events    []string
	pdbBlocks bool
}

func newDRANode(t *testing.T, labels map[string]string) *draNode {
	t.Helper()
	d := &draNode{env: newEnv(t, gpuNode(labels))}
	plugin := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-dra-driver-kubelet-plugin-x", Namespace: namespace,
		Labels: map[string]string{ComponentLabel: "dra-driver", "app": "nvidia-dra-driver-kubelet-plugin"}},
		Spec: corev1.PodSpec{NodeName: nodeName}}
	claim := "train-gpu"
	holder := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "u", Controller: ptrTo(true)}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}},
	}
	rc := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "ml"},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.nvidia.com", Pool: nodeName, Device: "gpu-0"}}}}}}
	for _, err := range []error{
		createPod(d.client.Tracker(), plugin), createPod(d.client.Tracker(), holder),
		d.client.Tracker().Create(resourcev1.SchemeGroupVersion.WithResource("resourceclaims"), rc, "ml"),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	d.client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}, {Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}},
		{GroupVersion: "policy/v1", APIResources: []metav1.APIResource{{Name: "poddisruptionbudgets", Kind: "PodDisruptionBudget"}}},
	}
	pods := corev1.SchemeGroupVersion.WithResource("pods")
	d.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		name := a.(k8stesting.CreateAction).GetObject().(metav1.Object).GetName()
		if d.pdbBlocks {
			d.record("refused eviction " + a.GetNamespace() + "/" + name)
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		d.record("evicted " + a.GetNamespace() + "/" + name)
		return true, nil, d.client.Tracker().Delete(pods, a.GetNamespace(), name)
	})
	d.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patch := string(a.(k8stesting.PatchAction).GetPatch())
		for _, sw := range []string{"operator-validator", "dra-driver"} {
			if strings.Contains(patch, `"`+nodestate.DeployLabelPrefix+sw+`":"`+nodestate.Paused+`"`) {
				d.record("paused " + sw)
				if sw == "dra-driver" { // the DaemonSet controller removes the plugin's pod
					_ = d.client.Tracker().Delete(pods, namespace, plugin.Name)
				}
			}
		}
		return false, nil, nil
	})
	return d
}

func createPod(tr k8stesting.ObjectTracker, p *corev1.Pod) error {
	return tr.Create(corev1.SchemeGroupVersion.WithResource("pods"), p, p.Namespace)
}

func (d *draNode) record(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, s)
}

func (d *draNode) recorded() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.events)
}

func (d *draNode) options() *Options {
	o := d.env.options(newDigest)
	o.DRAPlugin = "dra-driver"
	return o
}

func (d *draNode) pluginRuns() bool {
	_, err := d.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), namespace, "nvidia-dra-driver-kubelet-plugin-x")
	return err == nil
}

// TestDRAClaimHoldersLeaveBeforeThePluginIsPaused: on a DRA node the other operands are paused with the cordon, the
// claim holder is evicted, then, last, the DRA kubelet plugin is paused (the reference driver manager's order); its
// pod gone, the driver unloads, and every switch, the plugin's included, is restored.
func TestDRAClaimHoldersLeaveBeforeThePluginIsPaused(t *testing.T) {
	d := newDRANode(t, map[string]string{draSwitch: "true"})
	if _, err := d.run(d.options()); err != nil {
		t.Fatal(err)
	}
	if got, want := d.recorded(), []string{"paused operator-validator", "evicted ml/train", "paused dra-driver"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if d.pluginRuns() || len(d.host.LoadedModules()) != 0 {
		t.Fatalf("plugin running %v, modules %v; want the plugin stopped and the driver unloaded", d.pluginRuns(), d.host.LoadedModules())
	}
	n := d.node()
	assertNothingPaused(t, n)
	if n.Labels[draSwitch] != "true" || state(n) != nodestate.ValidationRequired {
		t.Fatalf("switch %q state %q; want the plugin's switch restored, validation-required", n.Labels[draSwitch], state(n))
	}
	finish(t, d.env)
}

// TestDRAClaimHolderLeftFailsWithThePluginRunning: a claim holder that cannot be evicted (its PDB refuses, or
// eviction is off) fails the run before the plugin is paused: the plugin keeps running, the driver stays loaded,
// the other operands are resumed and the node is upgrade-failed naming the holder.
func TestDRAClaimHolderLeftFailsWithThePluginRunning(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pdbBlocks  bool
		noEviction bool
	}{{name: "pdb", pdbBlocks: true}, {name: "eviction-off", noEviction: true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDRANode(t, map[string]string{draSwitch: "true"})
			d.pdbBlocks = tc.pdbBlocks
			o := d.options()
			o.Eviction.Enabled = !tc.noEviction
			o.Eviction.Timeout = 300 * time.Millisecond // the budget never allows it
			_, err := d.run(o)
			if err == nil {
				t.Fatal("run succeeded with a claim holder left")
			}
			if tc.noEviction && !strings.Contains(err.Error(), "ml/train") {
				t.Fatalf("err %v; want the claim holder named", err)
			}
			if slices.Contains(d.recorded(), "paused dra-driver") || !d.pluginRuns() {
				t.Fatalf("events %v, plugin running %v; want the plugin never paused", d.recorded(), d.pluginRuns())
			}
			if len(d.host.LoadedModules()) == 0 {
				t.Fatal("the driver was unloaded under a claim holder")
			}
			n := d.node()
			assertNothingPaused(t, n)
			if n.Labels[draSwitch] != "true" || state(n) != nodestate.UpgradeFailed {
				t.Fatalf("switch %q state %q; want the plugin's switch untouched, upgrade-failed", n.Labels[draSwitch], state(n))
			}
		})
	}
}

// TestDRAStopBetweenTheStepsResumes: SIGTERM after the eviction, after the other operands are paused (plugin still
// running) or after their pods and then the plugin's are gone (its switch paused) leaves the node as it is; the next driver pod goes on from there, pauses the
// plugin if it still runs, unloads, and restores every switch.
func TestDRAStopBetweenTheStepsResumes(t *testing.T) {
	for _, step := range []string{"evict", "pause", "operands"} {
		t.Run(step, func(t *testing.T) {
			d := newDRANode(t, map[string]string{draSwitch: "true", "nvidia.com/gpu.deploy.dcgm": "false"})
			o := d.options()
			ctx, afterStep := stopAfter(step)
			o.AfterStep = afterStep
			if err := o.Run(ctx, &bytes.Buffer{}); !errors.Is(err, errSIGTERM) {
				t.Fatalf("stopped run: %v", err)
			}
			pausedAtStop := d.node().Labels[draSwitch] == nodestate.Paused
			if pausedAtStop != (step == "operands") || d.pluginRuns() == pausedAtStop {
				t.Fatalf("after a stop at %s: plugin switch %q, plugin running %v", step, d.node().Labels[draSwitch], d.pluginRuns())
			}
			if _, err := d.run(d.options()); err != nil {
				t.Fatalf("next pod: %v", err)
			}
			if got := d.recorded(); slices.Index(got, "paused dra-driver") < slices.Index(got, "evicted ml/train") || !slices.Contains(got, "paused dra-driver") {
				t.Fatalf("events %v; want the plugin paused once, after the eviction", got)
			}
			n := d.node()
			assertNothingPaused(t, n)
			if n.Labels[draSwitch] != "true" || n.Labels["nvidia.com/gpu.deploy.dcgm"] != "false" || len(d.host.LoadedModules()) != 0 {
				t.Fatalf("labels %v modules %v", n.Labels, d.host.LoadedModules())
			}
			finish(t, d.env)
		})
	}
}

// TestDevicePluginNodeNeverTouchesTheDRASwitch: with the DRA plugin configured but not running on the node (a
// device-plugin node, or a DRA node whose plugin is off), its switch is never written and no claim is checked.
func TestDevicePluginNodeNeverTouchesTheDRASwitch(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	o := e.options(newDigest)
	o.DRAPlugin = "dra-driver"
	if _, err := e.run(o); err != nil {
		t.Fatal(err)
	}
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), draSwitch) {
			t.Fatalf("patch %s touches %s", p.GetPatch(), draSwitch)
		}
		if a.GetResource().Resource == "resourceclaims" {
			t.Fatalf("claims read on a node without the DRA plugin: %v", a)
		}
	}
}
