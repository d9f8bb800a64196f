package drivermanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

const (
	driverDS  = "nvidia-driver-daemonset-ubuntu2204"
	driverPod = "nvidia-driver-daemonset-ubuntu2204-abcde"
)

// driverSpec is a driver pod spec that installs digest.
func driverSpec(digest string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName: nodeName,
		InitContainers: []corev1.Container{{Name: "k8s-driver-manager", Command: []string{"driver-manager", "uninstall-driver"},
			Env: []corev1.EnvVar{{Name: "GPU_ALLOCATION", Value: "device-plugin"}}}},
		Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Env: []corev1.EnvVar{{Name: upgradeplan.DigestEnv, Value: digest}}}},
	}
}

// withDriverPod adds the node's driver pod running the old config and its DaemonSet, whose template installs
// template.
func (e *env) withDriverPod(template string) {
	e.t.Helper()
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: driverDS, Namespace: namespace, UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ComponentLabel: "driver"}},
			Spec: driverSpec(template)}}}
	pod := driverPodObject()
	for _, obj := range []interface{ GetName() string }{ds, pod} {
		var err error
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			_, err = e.client.AppsV1().DaemonSets(namespace).Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = e.client.CoreV1().Pods(namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// driverPodObject is the node's driver pod, of withDriverPod's DaemonSet, running the old config.
func driverPodObject() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: driverPod, Namespace: namespace, UID: "driver-uid",
		Labels:          map[string]string{ComponentLabel: "driver"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: driverDS, UID: "ds-uid", Controller: ptrTo(true)}}},
		Spec: driverSpec(oldDigest)}
}

// withSiblingDriverPod adds a pod of the driver DaemonSet (withDriverPod's) on node other.
func (e *env) withSiblingDriverPod(other string) {
	e.t.Helper()
	sibling, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), driverPod, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	sibling = sibling.DeepCopy()
	sibling.Name, sibling.UID, sibling.Spec.NodeName, sibling.ResourceVersion = driverPod+"-"+other, types.UID("driver-uid-"+other), other, ""
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), sibling, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// setTemplate makes the DaemonSet's template install digest.
func (e *env) setTemplate(digest string) {
	e.t.Helper()
	ds, err := e.client.AppsV1().DaemonSets(namespace).Get(context.Background(), driverDS, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	ds.Spec.Template.Spec = driverSpec(digest)
	if _, err := e.client.AppsV1().DaemonSets(namespace).Update(context.Background(), ds, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// gate runs the old driver pod's upgrade gate with Replace in the background until ctx ends.
func (e *env) gate(ctx context.Context, onRequest bool, evictionTimeout time.Duration) (<-chan error, *syncbuffer.Buffer) {
	return e.gateWith(ctx, onRequest, evictionTimeout, nil)
}

// gateWith is gate with the emptying's AfterStep.
func (e *env) gateWith(ctx context.Context, onRequest bool, evictionTimeout time.Duration, afterStep func(string) error) (<-chan error, *syncbuffer.Buffer) {
	return e.runGate(ctx, e.gateOptions(onRequest, evictionTimeout, afterStep))
}

// gateOptions are the old driver pod's upgrade gate's options with Replace, as gateWith runs it.
func (e *env) gateOptions(onRequest bool, evictionTimeout time.Duration, afterStep func(string) error) UncordonOptions {
	return UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, PodName: driverPod, Replace: true, OnRequest: onRequest,
		Now: e.clock, Timeout: time.Second,
		ManagerOptions: func(getenv func(string) string) (Options, error) {
			return Options{NodeName: getenv("NODE_NAME"), Namespace: namespace, Eviction: Eviction{Enabled: true, Timeout: evictionTimeout},
				OperandTimeout: 2 * time.Second, Now: e.clock, AfterStep: afterStep}, nil
		}}
}

// runGate runs an upgrade gate in the background until ctx ends.
func (e *env) runGate(ctx context.Context, o UncordonOptions) (<-chan error, *syncbuffer.Buffer) {
	o.Complete()
	if err := o.Validate(); err != nil {
		e.t.Fatal(err)
	}
	out := &syncbuffer.Buffer{}
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, out) }()
	return done, out
}

// evictionsOf lists the names of the pods the run asked to evict, in order.
func (e *env) evictionsOf() []string {
	var out []string
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "create" && a.GetSubresource() == "eviction" {
			if m, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok {
				out = append(out, m.GetName())
			}
		}
	}
	return out
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The old driver pod's gate, once its DaemonSet installs another driver, cordons the node, evicts its GPU pods and
// pauses the GPU operands, and evicts its own pod only after that: the old driver's stop finds no GPU pod.
func TestOldDriverPodEmptiesItsNodeBeforeItEvictsItself(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withGPUPod(nil)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, out := e.gate(ctx, false, 3*time.Second)
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train", driverPod}) {
		t.Fatalf("evictions %v, want the GPU pod first, then the driver pod", got)
	}
	n := e.node()
	if state(n) != nodestate.PodRestartRequired || !nodestate.CordonedByUs(n) {
		t.Fatalf("node after emptying: state %q, cordoned by us %v; want pod-restart-required and cordoned", state(n), nodestate.CordonedByUs(n))
	}
	if n.Labels[nodestate.DeployLabelPrefix+"device-plugin"] != nodestate.Paused {
		t.Fatalf("device plugin switch %q, want paused before the driver stops", n.Labels[nodestate.DeployLabelPrefix+"device-plugin"])
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Fatalf("modules %v: the gate must leave the unload to the new pod", mods)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "emptied for the new driver (driver config 111111111111 -> 222222222222)") {
		t.Errorf("summary:\n%s", out)
	}
}

// A GPU pod that lands on the node during the eviction (it tolerates the cordon, or names the node) still gets a GPU
// from the device plugin until the pause: it is evicted too, after the pause, before the old driver pod goes.
func TestGPUPodArrivingDuringTheEvictionGoesBeforeTheOldDriver(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withGPUPod(nil)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arrived := false
	done, out := e.gateWith(ctx, false, 3*time.Second, func(step string) error {
		if step == "evict" && !arrived {
			arrived = true
			late := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-late", Namespace: "ml", UID: "train-late-1",
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "u", Controller: ptrTo(true)}}},
				Spec: corev1.PodSpec{NodeName: nodeName, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{"nvidia.com/gpu": *resourceQty(1)}}}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			return e.client.Tracker().Add(late)
		}
		return nil
	})
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train", "train-late", driverPod}) {
		t.Fatalf("evictions %v, want the GPU pod, the late one, then the driver pod", got)
	}
	cancel()
	<-done
}

// A DaemonSet whose template installs what the pod runs (a chart-only release, a toleration added) replaces
// nothing; once it installs another driver, the watch sees it and the change goes.
func TestOldDriverPodWaitsForItsDaemonSetsChange(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
	e.withDriverPod(oldDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, out := e.gate(ctx, false, time.Second)
	time.Sleep(300 * time.Millisecond)
	if got := e.evictionsOf(); len(got) > 0 {
		t.Fatalf("evictions %v with an unchanged driver", got)
	}
	if n := e.node(); n.Spec.Unschedulable || state(n) != nodestate.UpgradeDone {
		t.Fatalf("node touched with an unchanged driver: state %q", state(n))
	}
	e.setTemplate(newDigest)
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	// no plan marked the node: it is marked here, one node of its DaemonSet at a time
	mark, err := canary.Read(e.node())
	if err != nil || mark == nil || mark.Pool != driverDS || mark.MaxUnavailable != 1 {
		t.Fatalf("mark %+v (%v), want one slot of pool %s", mark, err, driverDS)
	}
	cancel()
	<-done
	_ = out
}

// With autoUpgrade=false the gate waits for the admin's request, and removes it when it acts on it.
func TestOldDriverPodOfAnOnRequestPoolWaitsForTheAdmin(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, _ := e.gate(ctx, true, time.Second)
	time.Sleep(300 * time.Millisecond)
	if got := e.evictionsOf(); len(got) > 0 || e.node().Spec.Unschedulable {
		t.Fatalf("evictions %v, cordoned %v before the admin asked", got, e.node().Spec.Unschedulable)
	}
	n := e.node()
	n.Annotations[UpgradeRequestedAnnotation] = "true"
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	if _, ok := e.node().Annotations[UpgradeRequestedAnnotation]; ok {
		t.Error("the request is still there after the gate acted on it")
	}
	cancel()
	<-done
}

// An emptying that fails (a PDB refuses the eviction until the timeout) restores the node, marks it upgrade-failed
// with the reason, and never evicts the driver pod: the old driver keeps serving the GPU pod.
func TestFailedEmptyingKeepsTheOldDriverServing(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withGPUPod(func() error {
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	})
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, out := e.gate(ctx, false, 500*time.Millisecond)
	waitUntil(t, "upgrade-failed", func() bool { return state(e.node()) == nodestate.UpgradeFailed })
	time.Sleep(200 * time.Millisecond)
	n := e.node()
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Error("the failed node is still cordoned")
	}
	assertNothingPaused(t, n)
	if !strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], "evict GPU pods") {
		t.Errorf("reason %q", n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if slices.Contains(e.evictionsOf(), driverPod) {
		t.Fatal("the old driver pod was evicted although its node still has its GPU pod")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
}

// Stopped (SIGTERM) while its node waits for the pool's canary, the gate leaves the node untouched and its pod in
// place.
func TestOldDriverPodStoppedWhileWaitingChangesNothing(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	done, _ := e.gate(ctx, false, time.Second)
	assertHeld(t, e, "waiting for the canary")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a stop is no failure: %v", err)
	}
	assertHeld(t, e, "waiting for the canary")
	if got := e.evictionsOf(); len(got) > 0 {
		t.Fatalf("evictions %v after a stop", got)
	}
}

// A gate restarted while the node was half emptied (its container crashed after the cordon) carries the change on
// instead of holding the pod un-Ready for a next pod that an OnDelete DaemonSet never makes.
func TestRestartedGateCarriesAHalfEmptiedNodeOn(t *testing.T) {
	n := planned(nodeName, nodestate.PodDeletionRequired, slotMark)
	n.Spec.Unschedulable = true
	n.Annotations[nodestate.CordonedAnnotation] = cordonReason
	e := newEnv(t, n)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, _ := e.gate(ctx, false, time.Second)
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	cancel()
	<-done
}

// The old pod's gate waits for a slot of its pool; meanwhile the release rolls back, so its DaemonSet's template
// installs the pod's own driver again, and the rollback's plan calls the node off. When the slot frees, the gate
// looks again: nothing to empty. The node stays in service with its driver, no slot held, its pod in place.
func TestGateWaitingForATurnStandsDownWhenTheTemplateChangesBack(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, out := e.gate(ctx, false, time.Second)
	assertHeld(t, e, "waiting for a slot of pool default")
	e.setTemplate(oldDigest) // the rollback
	e.setState(nodeName, nodestate.UpgradeDone)
	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gate standing down", func() bool { return strings.Contains(out.String(), "changed back") })
	time.Sleep(200 * time.Millisecond)
	n := e.node()
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeDone {
		t.Fatalf("state=%q unschedulable=%v; want the node left in service, upgrade-done", state(n), n.Spec.Unschedulable)
	}
	if got := e.evictionsOf(); len(got) > 0 {
		t.Fatalf("evictions %v for a driver that no longer changes", got)
	}
	if got := e.holders(); len(got) > 0 {
		t.Fatalf("slot holders %v, want none", got)
	}
	cancel()
	<-done
}

// The rollback's plan runs before Helm changes the template back (pre-rollback): it calls off the node (upgrade-done)
// just as its old driver pod's gate looks at its turn, the template still another driver's. The gate stands down on
// the call-off alone: it neither cordons a node the plan left in service nor keeps a slot for it.
func TestGateStandsDownWhenThePlanCallsItOffAtItsTurn(t *testing.T) {
	e := slotEnv(t)
	e.withDriverPod(newDigest)
	called := false
	e.client.PrependWatchReactor("nodes", func(a k8stesting.Action) (bool, watch.Interface, error) {
		// the turn's watch of the failed nodes: the plan's call-off lands between the gate's read and its watch
		if w, ok := a.(k8stesting.WatchAction); ok && !called && strings.Contains(w.GetWatchRestrictions().Labels.String(), string(nodestate.UpgradeFailed)) {
			called = true
			n, err := e.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", nodeName)
			if err != nil {
				return true, nil, err
			}
			n = n.DeepCopyObject()
			n.(*corev1.Node).Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone)
			if err := e.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, out := e.gate(ctx, false, time.Second)
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	waitUntil(t, "the gate standing down", func() bool { return strings.Contains(out.String(), "called the node off") })
	e.setTemplate(oldDigest) // the rollback's apply
	time.Sleep(300 * time.Millisecond)
	n := e.node()
	if n.Spec.Unschedulable || nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeDone {
		t.Fatalf("state=%q unschedulable=%v; want the node left in service, upgrade-done", state(n), n.Spec.Unschedulable)
	}
	if got := e.evictionsOf(); len(got) > 0 {
		t.Fatalf("evictions %v on a node the plan called off", got)
	}
	if got := e.holders(); len(got) > 0 {
		t.Fatalf("slot holders %v, want none", got)
	}
	cancel()
	<-done
}

// An old driver pod's gate on a node no plan marked (its Node registered again) whose DaemonSet's other nodes carry
// their pool's plan follows that plan, its slots and bound, not a pool of its own DaemonSet.
func TestUnmarkedNodesGateFollowsItsPoolsPlan(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
	e.withDriverPod(newDigest)
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), planned("gpu-7", nodestate.PodRestartRequired, slotMark), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.withSiblingDriverPod("gpu-7")
	if c, err := pool(e).Take(context.Background(), "gpu-7", e.clock()); err != nil || !c.Taken {
		t.Fatalf("gpu-7: %+v %v", c, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, _ := e.gate(ctx, false, time.Second)
	assertHeld(t, e, "waiting for a slot of pool default")
	if mark, err := canary.Read(e.node()); err != nil || mark == nil || mark.Pool != "default" {
		t.Fatalf("mark %+v (%v), want pool default's", mark, err)
	}
	cancel()
	<-done
}
