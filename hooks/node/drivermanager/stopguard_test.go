package drivermanager

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// deletePodGracefully marks a pod deleted with a grace period, as the API server does before its kubelet stops it.
func (e *env) deletePodGracefully(name string, grace time.Duration) {
	e.t.Helper()
	pod, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	at := metav1.NewTime(time.Now().Add(grace))
	seconds := int64(grace.Seconds())
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &at, &seconds
	if err := e.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, namespace); err != nil {
		e.t.Fatal(err)
	}
}

// setNodeSelector gives the driver DaemonSet's template a node selector.
func (e *env) setNodeSelector(sel map[string]string) {
	e.t.Helper()
	ds, err := e.client.AppsV1().DaemonSets(namespace).Get(context.Background(), driverDS, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	ds.Spec.Template.Spec.NodeSelector = sel
	if _, err := e.client.AppsV1().DaemonSets(namespace).Update(context.Background(), ds, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// withDriverDaemonSet adds another driver DaemonSet (a pool's) whose template selects nodes by sel.
func (e *env) withDriverDaemonSet(name string, sel map[string]string) {
	e.t.Helper()
	spec := driverSpec(oldDigest)
	spec.NodeName, spec.NodeSelector = "", sel
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(name + "-uid")},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ComponentLabel: "driver"}}, Spec: spec}}}
	if _, err := e.client.AppsV1().DaemonSets(namespace).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// stopGate runs the driver pod's gate with a stop file; stopFileAt says, for each of the emptying's steps, whether
// the stop file was already there (the driver container's preStop would have ended).
func (e *env) stopGate(ctx context.Context) (done <-chan error, stopFile string, stopFileAt map[string]bool, out interface{ String() string }) {
	stopFile = filepath.Join(e.t.TempDir(), "driver-may-stop")
	stopFileAt = map[string]bool{}
	o := e.gateOptions(false, 3*time.Second, func(step string) error {
		_, err := os.Stat(stopFile)
		stopFileAt[step] = err == nil
		return nil
	})
	o.StopFile = stopFile
	done, buf := e.runGate(ctx, o)
	return done, stopFile, stopFileAt, buf
}

// A driver pod deleted outside a driver change, by hand (its DaemonSet still runs a pod on the node) or because its
// node moved to another pool (another driver DaemonSet of the release selects it now): its gate empties the node as
// for a driver change (cordon, GPU pods evicted, operands paused) before it lets the driver container's preStop end,
// so the upstream driver's stop (daemons first) finds no GPU pod. The next pod's manager carries the change on.
func TestDriverPodDeletedOutsideAChangeEmptiesItsNodeBeforeTheDriverStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		// moved: the pod's own DaemonSet no longer selects the node; another driver DaemonSet does
		moved bool
	}{{"kubectl delete pod", false}, {"node moved to another pool", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone), "pool": "b"}))
			e.withGPUPod(nil)
			e.withDriverPod(oldDigest)
			next := driverDS
			if tc.moved {
				e.setNodeSelector(map[string]string{"pool": "a"})
				next = "nvidia-driver-b-ubuntu2204"
				e.withDriverDaemonSet(next, map[string]string{"pool": "b"})
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done, stopFile, stopFileAt, out := e.stopGate(ctx)
			defer func() {
				if t.Failed() {
					t.Log(out.String())
				}
			}()
			e.deletePodGracefully(driverPod, time.Minute)
			cancel() // the kubelet's SIGTERM to the sidecar
			if err := <-done; err != nil {
				t.Fatalf("gate: %v", err)
			}
			raw, err := os.ReadFile(stopFile)
			if err != nil {
				t.Fatalf("the gate never let the driver stop: %v", err)
			}
			if !strings.Contains(string(raw), "emptied for "+next) {
				t.Errorf("stop file says %q, want the node emptied for %s", raw, next)
			}
			for _, step := range []string{"cordon", "evict", "pause"} {
				if at, ok := stopFileAt[step]; !ok || at {
					t.Errorf("step %s: ran %v, stop file already written %v; want it run before the driver may stop", step, ok, at)
				}
			}
			if got := e.evictionsOf(); !slices.Equal(got, []string{"train"}) {
				t.Errorf("evictions %v, want the GPU pod only (the driver pod is already being deleted)", got)
			}
			n := e.node()
			if state(n) != nodestate.PodRestartRequired || !nodestate.CordonedByUs(n) || n.Labels[nodestate.DeployLabelPrefix+"device-plugin"] != nodestate.Paused {
				t.Errorf("node: state %q, cordoned by us %v, device plugin %q; want it emptied for the next pod",
					state(n), nodestate.CordonedByUs(n), n.Labels[nodestate.DeployLabelPrefix+"device-plugin"])
			}
			if mods := e.host.LoadedModules(); len(mods) != 4 {
				t.Errorf("modules %v: the unload is the driver's stop's and the next manager's", mods)
			}
		})
	}
}

// An uninstall (no driver DaemonSet of the release left for the node), or a node taken to another role (its VFIO
// manager's DaemonSet, which also runs the driver manager, selects it now), lets the driver stop at once: no driver
// pod will take the node over, and the pre-delete cleanup waits for the driver pods to go.
func TestDriverPodDeletedWithNoDriverToFollowStopsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// other: a DaemonSet of another component that selects the node
		other bool
	}{{"uninstall", false}, {"node taken to vm-passthrough", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
			e.withGPUPod(nil)
			e.withDriverPod(oldDigest)
			if err := e.client.AppsV1().DaemonSets(namespace).Delete(context.Background(), driverDS, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.other {
				e.withDriverDaemonSet("nvidia-vfio-manager", nil)
				ds, err := e.client.AppsV1().DaemonSets(namespace).Get(context.Background(), "nvidia-vfio-manager", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ds.Spec.Template.Labels[ComponentLabel] = "vfio-manager"
				if _, err := e.client.AppsV1().DaemonSets(namespace).Update(context.Background(), ds, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done, stopFile, _, out := e.stopGate(ctx)
			e.deletePodGracefully(driverPod, time.Minute)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("gate: %v\n%s", err, out)
			}
			if raw, err := os.ReadFile(stopFile); err != nil || !strings.Contains(string(raw), "no driver DaemonSet of the release runs on the node") {
				t.Fatalf("stop file %q (%v), want the driver let go at once", raw, err)
			}
			if got := e.evictionsOf(); len(got) > 0 {
				t.Errorf("evictions %v", got)
			}
			if n := e.node(); n.Spec.Unschedulable || state(n) != nodestate.UpgradeDone {
				t.Errorf("node: unschedulable %v, state %q; want it untouched", n.Spec.Unschedulable, state(n))
			}
		})
	}
}

// A gate container that stops while its pod stays (the container alone restarts) lets nothing go: the driver
// container is not stopping.
func TestGateStoppedWithoutItsPodWritesNoStopFile(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
	e.withGPUPod(nil)
	e.withDriverPod(oldDigest)
	ctx, cancel := context.WithCancel(context.Background())
	done, stopFile, _, out := e.stopGate(ctx)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
	if _, err := os.Stat(stopFile); err == nil {
		t.Fatal("stop file written although the pod is not being deleted")
	}
	if got := e.evictionsOf(); len(got) > 0 {
		t.Errorf("evictions %v", got)
	}
}

// The gate's own replacement already emptied the node: its pod's deletion lets the driver stop at once, evicting
// nothing more.
func TestReplacedDriverPodLetsItsDriverStopOnceEmptied(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withGPUPod(nil)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	done, stopFile, _, out := e.stopGate(ctx)
	waitUntil(t, "the driver pod's eviction", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	if _, err := os.Stat(stopFile); err == nil {
		t.Fatal("stop file written before the pod's deletion")
	}
	// the fake API removes an evicted pod at once; the API server marks it deleted with its grace period
	pod, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), driverPod, metav1.GetOptions{})
	if err == nil {
		t.Fatalf("the fake API kept the evicted pod: %v", pod.DeletionTimestamp)
	}
	restored := driverPodObject()
	if err := e.client.Tracker().Add(restored); err != nil {
		t.Fatal(err)
	}
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
	if raw, err := os.ReadFile(stopFile); err != nil || !strings.Contains(string(raw), "its node is emptied") {
		t.Fatalf("stop file %q (%v)", raw, err)
	}
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train", driverPod}) {
		t.Errorf("evictions %v, want the GPU pod and the driver pod once each", got)
	}
}

// A new driver pod's manager waits while an older driver pod is still on the node (its gate empties the node, its
// driver unloads), changing nothing, and starts once it is gone.
func TestNewDriverPodWaitsForTheOlderOneToGo(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
	e.withDriverPod(oldDigest)
	e.deletePodGracefully(driverPod, time.Minute)
	newer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: driverPod + "-next", Namespace: namespace, UID: "driver-uid-next",
		CreationTimestamp: metav1.NewTime(time.Now().Add(time.Second)),
		OwnerReferences:   []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: driverDS, UID: "ds-uid", Controller: ptrTo(true)}}},
		Spec: driverSpec(oldDigest)}
	if err := e.client.Tracker().Add(newer); err != nil {
		t.Fatal(err)
	}
	o := e.options(oldDigest)
	o.Lease.Identity = newer.Name
	out := &syncbuffer.Buffer{}
	done := make(chan error, 1)
	go func() { done <- o.Run(context.Background(), out) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the manager ran while the older driver pod was on the node: %v", err)
	default:
	}
	if _, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), "kube-gpu-stack-driver-"+nodeName, metav1.GetOptions{}); err == nil {
		t.Fatal("the manager took the node's Lease while the older driver pod was on the node")
	}
	if err := e.client.CoreV1().Pods(namespace).Delete(context.Background(), driverPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("manager: %v\n%s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager did not start after the older pod went")
	}
}

// withPoolPeer adds pool's driver DaemonSet ds (its template selects pool=pool), and node peer in that pool with
// mark and a pod of ds: the pool's plan, as the other nodes of its DaemonSet carry it.
func (e *env) withPoolPeer(ds, pool, peer, mark string) {
	e.t.Helper()
	e.withDriverDaemonSet(ds, map[string]string{"pool": pool})
	n := planned(peer, nodestate.UpgradeDone, mark)
	n.Labels["pool"] = pool
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	d, err := e.client.AppsV1().DaemonSets(namespace).Get(context.Background(), ds, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ds + "-" + peer, Namespace: namespace, UID: types.UID(pool + "-pod-" + peer),
		Labels:          map[string]string{ComponentLabel: "driver", "pool": pool},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds, UID: d.UID, Controller: ptrTo(true)}}},
		Spec: d.Spec.Template.Spec}
	pod.Spec.NodeName = peer
	if err := e.client.Tracker().Add(pod); err != nil {
		e.t.Fatal(err)
	}
	d.Spec.Template.Labels = map[string]string{ComponentLabel: "driver", "pool": pool}
	if _, err := e.client.AppsV1().DaemonSets(namespace).Update(context.Background(), d, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// slotHolders are the holders of pool's slots Lease, sorted; none when no slot of it was ever taken.
func (e *env) slotHolders(pool string) []string {
	e.t.Helper()
	l, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), slots.Name(pool), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	h, err := slots.Holders(l)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(h))
}

// movedToPoolB is the node, with a GPU pod and its old driver pod of pool a's DaemonSet (the driver DaemonSet, which
// selects pool=a), relabelled to pool b while it carries markA; pool b's DaemonSet runs on gpu-2, marked markB.
func movedToPoolB(t *testing.T, markA, markB string) *env {
	t.Helper()
	moved := planned(nodeName, nodestate.UpgradeDone, markA)
	moved.Labels["pool"] = "b"
	e := newEnv(t, moved)
	e.withGPUPod(nil)
	e.withDriverPod(oldDigest)
	e.setNodeSelector(map[string]string{"pool": "a"})
	e.withPoolPeer("nvidia-driver-b-ubuntu2204", "b", "gpu-2", markB)
	return e
}

// A node moved from pool a to pool b (relabelled by the admin) still carries pool a's mark when its old driver pod is
// deleted (its DaemonSet no longer selects it): its gate empties it under pool b's plan, as the other nodes of pool
// b's DaemonSet carry it, and takes a slot of pool b, whose bound it now counts against.
func TestMovedNodesDriverPodIsEmptiedUnderItsNewPool(t *testing.T) {
	e := movedToPoolB(t, canary.Mark{Pool: "a", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1}.Format(),
		canary.Mark{Pool: "b", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 2}.Format())

	ctx, cancel := context.WithCancel(context.Background())
	done, stopFile, _, out := e.stopGate(ctx)
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
	if _, err := os.Stat(stopFile); err != nil {
		t.Fatalf("the driver was never let go: %v\n%s", err, out)
	}
	n := e.node()
	if mk, err := canary.Read(n); err != nil || mk == nil || mk.Pool != "b" {
		t.Fatalf("the moved node's mark %+v (%v): want pool b's plan\n%s", mk, err, out)
	}
	lease, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), slots.Prefix+"b", metav1.GetOptions{})
	if err != nil || !strings.Contains(lease.Annotations[slots.HoldersAnnotation], nodeName) {
		t.Fatalf("pool b's slots %v (%v): want %s among their holders\n%s", lease, err, nodeName, out)
	}
	if state(n) != nodestate.PodRestartRequired || !slices.Equal(e.evictionsOf(), []string{"train"}) {
		t.Errorf("state %q, evictions %v: want the node emptied", state(n), e.evictionsOf())
	}
}

// A node moved to pool b and back to pool a within seconds (the soak, one CI run: pool a 4 out against 3): its old
// driver pod of pool a's DaemonSet was deleted by the first move, and its gate waits for a slot of pool b, the pool
// that took the node over then. By the time b's slot frees the node is back in a: it is emptied under pool a's plan
// and slot, not under b's, which would take it out beyond a's bound while b counted it.
func TestNodeMovedBackWhileItsStoppingGateWaitsIsEmptiedUnderThePoolItIsIn(t *testing.T) {
	markA := canary.Mark{Pool: "a", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1}.Format()
	e := movedToPoolB(t, markA, canary.Mark{Pool: "b", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1}.Format())
	stayed := planned("gpu-3", nodestate.UpgradeDone, markA) // pool a's plan on its other node
	stayed.Labels["pool"] = "a"
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), stayed, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poolB := slots.Pool{Client: e.client, Namespace: namespace, Name: "b", Max: 1}
	if c, err := poolB.Take(context.Background(), "gpu-2", e.clock()); err != nil || !c.Taken {
		t.Fatalf("gpu-2: %+v %v", c, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done, stopFile, _, out := e.stopGate(ctx)
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	assertHeld(t, e, "waiting for a slot of pool b")
	n := e.node()
	n.Labels["pool"] = "a" // moved back
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	e.setState("gpu-2", nodestate.UpgradeDone)
	if err := poolB.Give(context.Background(), "gpu-2"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gate: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gate did not end")
	}
	if _, err := os.Stat(stopFile); err != nil {
		t.Fatalf("the driver was never let go: %v", err)
	}
	n = e.node()
	if mk, err := canary.Read(n); err != nil || mk == nil || mk.Pool != "a" {
		t.Errorf("the node's mark %+v (%v): want pool a's plan, the pool it is in", mk, err)
	}
	if got := e.slotHolders("a"); !slices.Equal(got, []string{nodeName}) {
		t.Errorf("pool a's slot holders %v, want %s", got, nodeName)
	}
	if got := e.slotHolders("b"); slices.Contains(got, nodeName) {
		t.Errorf("pool b's slot holders %v: the node went out under the pool it had left", got)
	}
	if state(n) != nodestate.PodRestartRequired || !slices.Equal(e.evictionsOf(), []string{"train"}) {
		t.Errorf("state %q, evictions %v: want the node emptied", state(n), e.evictionsOf())
	}
}

// A plan calls the node off (upgrade-done) while its deleted driver pod's gate starts to wait for a slot: the plan
// judged the node by the next driver pod, already waiting on the node with the release's config, while the old
// driver still runs and is about to stop. That is no turn: the gate waits for a slot before it cordons, instead of
// taking the node out beyond its pool's bound (the soak caught it after a pool rename: pool b 8 out against 7).
func TestStoppingDriverPodOfANodeCalledOffWaitsForASlot(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	e.withGPUPod(nil)
	e.withDriverPod(oldDigest)
	var once sync.Once
	var armed atomic.Bool
	e.client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !armed.Load() {
			return false, nil, nil
		}
		// the plan's call-off lands between the stopping gate's read of the node and its wait's first look
		once.Do(func() {
			n, err := e.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", nodeName)
			if err == nil {
				n := n.(*corev1.Node).DeepCopy()
				n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone)
				_ = e.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, "")
			}
		})
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done, stopFile, _, out := e.stopGate(ctx)
	// the gate's agent has its watches before the pod's deletion: the call-off is meant for the stopping gate
	waitUntil(t, "the gate's agent", func() bool { return strings.Contains(out.String(), "nothing to do") })
	time.Sleep(300 * time.Millisecond)
	e.deletePodGracefully(driverPod, time.Minute)
	armed.Store(true)
	cancel()
	assertHeld(t, e, "waiting for a slot of pool default")
	if _, err := os.Stat(stopFile); err == nil {
		t.Fatalf("the driver was let go before the node's turn\n%s", out)
	}
	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("gate: %v\n%s", err, out)
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v after the emptying, want the node's own slot\n%s", got, out)
	}
	if n := e.node(); state(n) != nodestate.PodRestartRequired || !slices.Equal(e.evictionsOf(), []string{"train"}) {
		t.Errorf("state %q, evictions %v: want the node emptied once it had its slot", state(n), e.evictionsOf())
	}
}

// A driver pod deleted while its Node object is gone (deleted, its kubelet about to register it again): the Node that
// comes back takes pods at once, a GPU pod among them, so the gate waits for it and empties it before the driver
// stops, rather than letting the driver stop because the node could not be read.
func TestDriverPodDeletedWhileItsNodeIsGoneEmptiesTheNodeThatComesBack(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}))
	e.withDriverPod(oldDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done, stopFile, stopFileAt, out := e.stopGate(ctx)
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	time.Sleep(300 * time.Millisecond) // the gate runs as the node's agent
	if err := e.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.deletePodGracefully(driverPod, time.Minute)
	cancel() // the kubelet's SIGTERM to the sidecar
	time.Sleep(500 * time.Millisecond)
	if _, err := os.Stat(stopFile); err == nil {
		t.Fatal("the driver was let stop while its Node object was gone")
	}
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), gpuNode(nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.withGPUPod(nil) // scheduled on the Node registered again
	if err := <-done; err != nil {
		t.Fatalf("gate: %v", err)
	}
	if _, err := os.Stat(stopFile); err != nil {
		t.Fatalf("the gate never let the driver stop: %v", err)
	}
	for _, step := range []string{"cordon", "evict"} {
		if at, ok := stopFileAt[step]; !ok || at {
			t.Errorf("step %s: ran %v, stop file already written %v; want it run before the driver may stop", step, ok, at)
		}
	}
	if got := e.evictionsOf(); !slices.Equal(got, []string{"train"}) {
		t.Errorf("evictions %v, want the GPU pod that came with the Node registered again", got)
	}
}

// A stopping driver pod removed with no grace while its gate waits for the node's turn (the pod garbage collector,
// for a Node deleted and registered again) is gone with its containers: its driver stopped already, and a newer pod's
// manager may have taken the node over meanwhile. The gate stands down when its turn comes instead of emptying the
// node: it did, after the next pod's manager had kept the driver, and left the node pod-restart-required with no
// manager to move it on (the soak, seed 3 with failing drivers).
func TestStoppingGateWhosePodIsGoneStandsDownAtItsTurn(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	e.withGPUPod(nil)
	e.withDriverPod(oldDigest)
	ctx, cancel := context.WithCancel(context.Background())
	done, _, _, out := e.stopGate(ctx)
	waitUntil(t, "the gate's agent", func() bool { return strings.Contains(out.String(), "nothing to do") })
	time.Sleep(300 * time.Millisecond)
	e.deletePodGracefully(driverPod, time.Minute)
	cancel()
	assertHeld(t, e, "waiting for a slot of pool default")
	if err := e.client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), namespace, driverPod); err != nil {
		t.Fatal(err)
	}
	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the gate did not end\n%s", out)
	}
	if n := e.node(); nodestate.CordonedByUs(n) || state(n) != nodestate.UpgradeRequired || len(e.evictionsOf()) > 0 {
		t.Errorf("state %q, cordoned %v, evictions %v: a gone pod's gate emptied the node\n%s", state(n), nodestate.CordonedByUs(n), e.evictionsOf(), out)
	}
	if got := e.holders(); len(got) > 0 {
		t.Errorf("holders %v: the gate that stood down kept a slot\n%s", got, out)
	}
}
