package drivermanager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
)

// slotMark is the plan's mark of pool default without a canary or threshold: one slot.
var slotMark = canary.Mark{Pool: "default", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1}.Format()

// slotEnv is nodeName planned under slotMark, with peers.
func slotEnv(t *testing.T, peers ...string) *env {
	t.Helper()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	for _, name := range peers {
		if _, err := e.client.CoreV1().Nodes().Create(context.Background(), planned(name, nodestate.UpgradeRequired, slotMark), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// pool is the slots of pool default, one slot, as slotMark sizes them.
func pool(e *env) slots.Pool {
	return slots.Pool{Client: e.client, Namespace: namespace, Name: "default", Max: 1}
}

// freeSlotOf frees holder's slot as its gate does (upgrade-done, the slot given back) and waits for the run that
// waited for it (done) to end well.
func (e *env) freeSlotOf(holder string, done <-chan error) {
	e.t.Helper()
	e.setState(holder, nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), holder); err != nil {
		e.t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			e.t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		e.t.Fatal("the node did not go once the slot was free")
	}
}

// holdSlot puts node out of service holding pool default's one slot, as a node mid-change does.
func (e *env) holdSlot(node string) {
	e.t.Helper()
	e.setState(node, nodestate.PodRestartRequired)
	if c, err := pool(e).Take(context.Background(), node, e.clock()); err != nil || !c.Taken {
		e.t.Fatalf("%s: %+v %v", node, c, err)
	}
}

// holders are pool default's slot holders, sorted.
func (e *env) holders() []string { return e.slotHolders("default") }

// A node whose pool's one slot another node holds (the DaemonSet replaced an un-Ready old driver pod outside its
// bound) waits, untouched and holding no node Lease, until that node gives the slot back; then it takes it and
// goes. The gate gives it back at upgrade-done.
func TestFullPoolHoldsTheNodeUntouchedUntilASlotIsGivenBack(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for a slot of pool default: 1 of its nodes, its maxUnavailable, are out of service (the holders: kubectl get lease -n gpu-system kube-gpu-stack-slots-default)")
	time.Sleep(300 * time.Millisecond)
	assertHeld(t, e, "waiting for a slot")
	lease, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName(nodeName), metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Fatalf("node Lease while waiting for a slot: %+v %v; want given back", lease.Spec, err)
	}
	if got := e.holders(); !slices.Equal(got, []string{"gpu-7"}) {
		t.Fatalf("holders %v while the node waits", got)
	}

	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired || len(e.host.LoadedModules()) != 0 {
		t.Fatalf("after the give-back: state %q, modules %v", state(n), e.host.LoadedModules())
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v, want the node alone", got)
	}
	finish(t, e)
	if got := e.holders(); len(got) != 0 {
		t.Fatalf("holders %v after the gate finished the node, want its slot given back", got)
	}
}

// The watches of a held node's turn carry over from the look under the node's Lease that finds the pool full to the
// wait without the Lease: they read the same nodes, and list them once (a rollout's waiting nodes all look at once,
// when their DaemonSet changes). The fresh run once the slot is free lists them again, after its own writes.
func TestHeldNodeListsTheNodesOfItsTurnOnceUntilItsTurn(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for a slot of pool default")
	e.freeSlotOf("gpu-7", done)
	if n := e.node(); state(n) != nodestate.ValidationRequired {
		t.Fatalf("after the give-back: state %q", state(n))
	}
	lists := map[string]int{}
	for _, a := range e.client.Actions() {
		if l, ok := a.(k8stesting.ListAction); ok && a.GetResource().Resource == "nodes" {
			r := l.GetListRestrictions()
			lists["labels "+r.Labels.String()+" fields "+r.Fields.String()]++
		}
	}
	// the failed nodes, the reverted nodes and the node itself (no canary): once for the look and the wait, once for
	// the fresh run
	if len(lists) != 3 {
		t.Fatalf("node lists %v; want the turn's three watches", lists)
	}
	for what, n := range lists {
		if n != 2 {
			t.Errorf("nodes listed %d times (%s), want twice", n, what)
		}
	}
}

// A node out of service under one pool's slot whose mark names another pool by the time it is done (it moved
// between pools mid-change, or lost its mark with its Node object and took its new pool's plan) gives that slot
// back: its mark's pool holds none of it, so every pool's slots are looked through. The claim held a slot of the pool
// it had left until the claim grace ran out.
func TestDoneNodeGivesBackASlotItTookUnderAnotherPool(t *testing.T) {
	e := slotEnv(t)
	e.setState(nodeName, nodestate.PodRestartRequired) // emptied under pool a's slot, marked for pool default since
	left := slots.Pool{Client: e.client, Namespace: namespace, Name: "a", Max: 2}
	if c, err := left.Take(context.Background(), nodeName, e.clock()); err != nil || !c.Taken {
		t.Fatalf("%s in pool a: %+v %v", nodeName, c, err)
	}
	if err := wait(t, e.start(context.Background())); err != nil {
		t.Fatal(err)
	}
	if got := e.holders(); len(got) != 0 {
		t.Fatalf("pool default's holders %v: a node out already takes no slot of its new pool", got)
	}
	finish(t, e)
	if got := e.slotHolders("a"); len(got) != 0 {
		t.Errorf("pool a's holders %v after the node was done, want its claim given back", got)
	}
}

// A node emptied for a driver pod that keeps its driver (a pool renamed: the old pod's gate took a slot and emptied
// the node, and the new pod's driver is the one that last validated there) goes back in service at once from its
// manager, not from its gate: the manager gives the slot back. It kept it until the claim grace ran out, and in the
// soak a pool renamed back and forth crawled with all its slots held by nodes in service.
func TestNodeBackInServiceWithItsValidatedDriverGivesItsSlotBack(t *testing.T) {
	e := slotEnv(t)
	e.setState(nodeName, nodestate.PodRestartRequired)
	n := e.node()
	n.Annotations[nodestate.ValidatedDigestAnnotation] = oldDigest // the loaded driver, the new pod's too
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if c, err := pool(e).Take(context.Background(), nodeName, e.clock()); err != nil || !c.Taken {
		t.Fatalf("%s: %+v %v", nodeName, c, err)
	}
	out, err := e.run(e.options(oldDigest))
	if err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
		t.Fatalf("state %q, unschedulable %v; want the node back in service\n%s", state(n), n.Spec.Unschedulable, out)
	}
	if got := e.holders(); len(got) != 0 {
		t.Errorf("holders %v with the node back in service, want its slot given back\n%s", got, out)
	}
}

// Killed or stopped right after it took its slot, the node keeps that one slot: the next run takes its own slot
// back (not a second one, and not refused by a full pool) and goes on; the gate gives it back.
func TestStoppedAfterTheClaimKeepsOneSlot(t *testing.T) {
	for _, how := range []string{"SIGKILL", "SIGTERM"} {
		t.Run(how, func(t *testing.T) {
			e := slotEnv(t, "gpu-8")
			o := e.options(newDigest)
			ctx := context.Background()
			var err error
			if how == "SIGKILL" {
				o.AfterStep = killAfter("claim")
				_, err = e.run(o)
			} else {
				ctx, o.AfterStep = stopAfter("claim")
				err = o.Run(ctx, &strings.Builder{})
			}
			if !errors.Is(err, errCrashed) && !errors.Is(err, errSIGTERM) {
				t.Fatalf("first run: %v, want the %s", err, how)
			}
			if n := e.node(); state(n) != nodestate.UpgradeRequired || n.Spec.Unschedulable || len(e.host.LoadedModules()) != 4 {
				t.Fatalf("after a %s at the claim: state %q unschedulable %v", how, state(n), n.Spec.Unschedulable)
			}
			if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
				t.Fatalf("holders %v, want the node's claim kept", got)
			}
			// the pool is full (its one slot is the node's): another node is held meanwhile
			if c, err := pool(e).Take(context.Background(), "gpu-8", e.clock()); err != nil || c.Taken {
				t.Fatalf("gpu-8 took a slot of a full pool: %+v %v", c, err)
			}
			if _, err := e.run(e.options(newDigest)); err != nil {
				t.Fatalf("next run: %v", err)
			}
			if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
				t.Fatalf("holders %v after the next run, want the node alone", got)
			}
			finish(t, e)
			if got := e.holders(); len(got) != 0 {
				t.Fatalf("holders %v after the gate, want none", got)
			}
		})
	}
}

// A node whose change fails keeps its slot (it is out of service until retried): the pool's next node waits.
func TestFailedNodeKeepsItsSlot(t *testing.T) {
	e := slotEnv(t, "gpu-8")
	e.host.Kernel.Fail = func(call string) error {
		if call == "delete_module nvidia" {
			return unix.EBUSY
		}
		return nil
	}
	if _, err := e.run(e.options(newDigest)); err == nil {
		t.Fatal("want the run to fail: the driver is busy")
	}
	if st := state(e.node()); st != nodestate.UpgradeFailed {
		t.Fatalf("state %q, want upgrade-failed", st)
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v, want the failed node's slot kept", got)
	}
	if c, err := pool(e).Take(context.Background(), "gpu-8", e.clock()); err != nil || c.Taken || !slices.Equal(c.Holders, []string{nodeName}) {
		t.Fatalf("gpu-8: %+v %v, want held by the failed node", c, err)
	}
}

// Slots nobody can read refuse before anything changes, naming the Lease.
func TestUnreadableSlotsRefuseUntouched(t *testing.T) {
	e := slotEnv(t)
	bad := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: slots.Name("default"), Namespace: namespace,
		Annotations: map[string]string{slots.HoldersAnnotation: "[gpu-7"}}}
	if _, err := e.client.CoordinationV1().Leases(namespace).Create(context.Background(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), namespace+"/"+slots.Name("default")) || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("err = %v, want a refusal naming the slots Lease", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a refused run wrote: %v", acts)
	}
	if n := e.node(); state(n) != nodestate.UpgradeRequired || n.Spec.Unschedulable || len(e.host.LoadedModules()) != 4 {
		t.Fatalf("refused run changed the node: state %q unschedulable %v modules %v", state(n), n.Spec.Unschedulable, e.host.LoadedModules())
	}
}

// A holder whose manager stopped between its claim and its cordon never gives its slot back, and nothing changes
// the slots Lease again. The node it holds waits on the Lease's watch, which stays quiet; after SlotRecheck it tries
// again, and the claim, now older than slots.ClaimGrace, is dropped: the node takes the slot and goes.
func TestHeldNodeLooksAgainAndDropsAStaleClaim(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	start := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	if c, err := pool(e).Take(context.Background(), "gpu-7", start); err != nil || !c.Taken {
		t.Fatalf("gpu-7: %+v %v", c, err)
	}
	var now atomic.Pointer[time.Time]
	now.Store(&start)
	o := e.options(newDigest)
	o.Now = func() time.Time { return *now.Load() }
	o.SlotRecheck = 300 * time.Millisecond
	done := make(chan error, 1)
	go func() { done <- o.Run(context.Background(), &strings.Builder{}) }()
	assertHeld(t, e, "waiting for a slot of pool default: 1 of its nodes, its maxUnavailable, are out of service")

	// gpu-7 never cordoned: once its claim is past the grace, the next look drops it
	later := start.Add(slots.ClaimGrace + time.Second)
	now.Store(&later)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held node never looked again: gpu-7's stale claim still holds the pool's one slot")
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired {
		t.Fatalf("state %q after the stale claim was dropped, want validation-required", state(n))
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v, want the node alone", got)
	}
}

// A newer plan calls a waiting node off (upgrade-done: it judged the node by the driver it runs and validated), while
// the node's driver pod that will install another one is already past its look at the turn, or starts only now (a
// rollback mid-rollout leaves pods of both drivers). That manager's change is a change like any other: it takes a
// turn and a slot, and a full pool holds it untouched. Treated as already under way, it cordoned at once, one node
// more out than the pool's slots.
func TestCalledOffNodeWhosePodChangesTheDriverWaitsForASlot(t *testing.T) {
	for _, s := range []nodestate.UpgradeState{nodestate.UpgradeDone, ""} {
		t.Run("state "+string(s)+"", func(t *testing.T) {
			e := slotEnv(t, "gpu-7")
			e.setState(nodeName, s)
			e.holdSlot("gpu-7")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := e.start(ctx)
			assertHeld(t, e, "waiting for a slot of pool default")
			if got := e.holders(); !slices.Equal(got, []string{"gpu-7"}) {
				t.Fatalf("holders %v while the node waits", got)
			}
			e.freeSlotOf("gpu-7", done)
			if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
				t.Fatalf("holders %v after the change, want the node's own slot", got)
			}
		})
	}
}

// A node no plan marked (its Node object registered again, or added to the pool after the plan) whose driver pod
// installs another driver takes the latest mark of its DaemonSet's other nodes: it waits for its pool's slots
// instead of going at once, one node more out than the pool's bound. While its DaemonSet is new (its pool renamed,
// or renamed back: no pod of it runs on another node yet), the nodes the DaemonSet selects carry the pool's plan;
// without them the node found no mark and went at once, and a stopping pod's gate took a pool of its own DaemonSet
// with one slot, beside the pool's (the soak: pool b, 8 nodes out against 7).
func TestUnmarkedNodeTakesItsPoolsPlanFromItsDaemonSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		// siblingPod: the DaemonSet runs a pod on the marked peer (else it only selects it)
		siblingPod bool
	}{{"from its pods' nodes", true}, {"a new DaemonSet, from the nodes it selects", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, gpuNode(nil))
			e.withDriverPod(newDigest)
			peer := planned("gpu-7", nodestate.PodRestartRequired, slotMark)
			if _, err := e.client.CoreV1().Nodes().Create(context.Background(), peer, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.siblingPod {
				e.withSiblingDriverPod("gpu-7")
			}
			if c, err := pool(e).Take(context.Background(), "gpu-7", e.clock()); err != nil || !c.Taken {
				t.Fatalf("gpu-7: %+v %v", c, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				o := e.options(newDigest)
				o.Lease.Identity = driverPod
				done <- o.Run(ctx, &bytes.Buffer{})
			}()
			assertHeld(t, e, "waiting for a slot of pool default")
			if mark, err := canary.Read(e.node()); err != nil || mark == nil || mark.Pool != "default" || mark.MaxUnavailable != 1 {
				t.Fatalf("mark %+v (%v), want pool default's", mark, err)
			}
			e.freeSlotOf("gpu-7", done)
		})
	}
}

// A waiting node held by its pool's failure threshold, moved by the admin to another pool (its new pool's
// DaemonSet runs its driver pod now): the old pool's failures no longer hold it. It follows its new pool's plan, as
// the other nodes of its DaemonSet carry it, and goes once that pool lets it.
func TestNodeMovedToAnotherPoolIsGovernedByItsNewPool(t *testing.T) {
	oldPool := canary.Mark{Pool: "old", Plan: planID, Seq: 3, Canary: map[string]string{}, MaxFailures: 1, MaxUnavailable: 1}.Format()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, oldPool))
	e.withDriverPod(newDigest)
	for _, n := range []*corev1.Node{planned("gpu-9", nodestate.UpgradeFailed, oldPool), planned("gpu-7", nodestate.UpgradeDone, slotMark)} {
		if _, err := e.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.withSiblingDriverPod("gpu-7")
	o := e.options(newDigest)
	o.Lease.Identity = driverPod
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.Run(ctx, &bytes.Buffer{}); err != nil {
		t.Fatalf("the moved node was held: %v (reason %q)", err, e.node().Annotations[nodestate.UpgradeReasonAnnotation])
	}
	mark, err := canary.Read(e.node())
	if err != nil || mark == nil || mark.Pool != "default" {
		t.Fatalf("mark %+v (%v), want pool default's", mark, err)
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("pool default's holders %v, want the moved node", got)
	}
}

// A newer plan calls the node off (upgrade-done: its driver pod already has the release's config) in the moment
// between the manager's read of the node and its wait for a turn, while this pod installs another driver than the
// node runs (its old pod was deleted, the host kept the other driver). The wait's watch then shows a node that is
// no longer upgrade-required: that is no turn. The node waits for a slot again instead of going out beyond the
// pool's bound (the soak caught it: pool a with 4 nodes out against 3).
func TestNodeCalledOffWhileItsManagerStartsToWaitWaitsForASlot(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	e.holdSlot("gpu-7")
	o := e.options(newDigest)
	calledOff := false
	o.AfterStep = func(step string) error {
		if step == "detect" && !calledOff {
			calledOff = true
			e.setState(nodeName, nodestate.UpgradeDone) // the plan's CalledOff, after the run read the node
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, &bytes.Buffer{}) }()
	assertHeld(t, e, "waiting for a slot of pool default")
	if got := e.holders(); !slices.Equal(got, []string{"gpu-7"}) {
		t.Fatalf("holders %v while the node waits", got)
	}
	e.freeSlotOf("gpu-7", done)
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v after the change, want the node's own slot", got)
	}
}

// A pool renamed mid-rollout (the same nodes, the same selector): the renamed pool's plan names its slots by the
// pool's node selection, as the old plan's did, so a node of the renamed pool waits behind the node still out under
// the old name instead of taking a slot of a new, empty Lease: the bound survives the rename.
func TestRenamedPoolKeepsItsSlots(t *testing.T) {
	const key = "pool-0123456789ab"
	oldMark := canary.Mark{Pool: "b", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1, Slots: key}
	newMark := canary.Mark{Pool: "b-renamed", Plan: "2026-09-01T12:00:30Z", Seq: 2, Canary: map[string]string{}, MaxUnavailable: 1, Slots: key}
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, newMark.Format()))
	out := planned("gpu-7", nodestate.PodRestartRequired, newMark.Format()) // re-marked by the new plan, still out
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), out, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := slots.Pool{Client: e.client, Namespace: namespace, Name: oldMark.SlotsName(), Max: 1}
	if c, err := old.Take(context.Background(), "gpu-7", e.clock()); err != nil || !c.Taken {
		t.Fatalf("gpu-7 under the old name: %+v %v", c, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := e.start(ctx)
	assertHeld(t, e, "waiting for a slot of pool b-renamed")
	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := old.Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	l, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), slots.Name(key), metav1.GetOptions{})
	if err != nil || !strings.Contains(l.Annotations[slots.HoldersAnnotation], nodeName) {
		t.Fatalf("the pool's slots %v (%v): want %s holding one", l, err, nodeName)
	}
}

// A turn taken that does not go gives its slot back: a node a plan calls off just after its manager took the
// pool's slot (its pod installs another driver, so it waits for its turn again) is in service, and holds no slot
// while it waits. Kept, its claim was stamped afresh at each turn it took again (slots.Pool.Take), so a node that
// kept being called off held a slot for good while in service.
func TestNodeCalledOffJustAfterItTookItsSlotGivesItBack(t *testing.T) {
	e := slotEnv(t, "gpu-7")
	var took, gave atomic.Bool
	calledOff := func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(interface{ GetObject() runtime.Object }).GetObject().(*coordinationv1.Lease)
		h, err := slots.Holders(l)
		if err != nil || l.Name != slots.Name("default") {
			return false, nil, nil
		}
		if _, ok := h[nodeName]; ok && !took.Swap(true) {
			// the plan's CalledOff lands right after the claim (the tracker directly: the fake's lock is held here)
			n, err := e.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", nodeName)
			if err != nil {
				return false, nil, err
			}
			n = n.DeepCopyObject()
			n.(*corev1.Node).Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone)
			return false, nil, e.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, "")
		}
		if _, ok := h[nodeName]; !ok && took.Load() && !gave.Swap(true) {
			// gpu-7, waiting, takes the slot the moment it is free
			h["gpu-7"] = e.clock().UTC().Format(time.RFC3339)
			b, _ := json.Marshal(h)
			l.Annotations[slots.HoldersAnnotation] = string(b)
		}
		return false, nil, nil
	}
	e.client.PrependReactor("create", "leases", calledOff)
	e.client.PrependReactor("update", "leases", calledOff)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := e.start(ctx)
	assertHeld(t, e, "waiting for a slot of pool default")
	if got := e.holders(); !slices.Equal(got, []string{"gpu-7"}) {
		t.Fatalf("holders %v while the called-off node waits, want gpu-7 alone (the slot it gave back)", got)
	}
	e.freeSlotOf("gpu-7", done)
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v after the change, want the node's own slot", got)
	}
}

// A waiting node takes a freed slot itself, before it takes its node's Lease, with one write on the slots Lease as
// its watch shows it: of the pool's waiters that saw the slot freed, each loser of the race spends one refused
// write. Each of them used to go for its node's Lease, read its node and watch again, and in the rollout benchmark
// that was the upgrade gates' heaviest load: some thirty such runs per node, every one for a slot another node had
// taken.
func TestWaitingNodeTakesAFreedSlotBeforeItsNodeLeaseAndALoserWaitsOn(t *testing.T) {
	e := slotEnv(t, "gpu-7", "gpu-8")
	e.holdSlot("gpu-7")
	leases := coordinationv1.SchemeGroupVersion.WithResource("leases")
	var mu sync.Mutex
	var writes []string // in order: "slots <holders>" and "node-lease"
	var freed, raced atomic.Bool
	e.client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		mu.Lock()
		defer mu.Unlock()
		switch l.Name {
		case LeaseName(nodeName):
			writes = append(writes, "node-lease")
		case slots.Name("default"):
			h, _ := slots.Holders(l)
			if h[nodeName] != "" && freed.Load() && !raced.Swap(true) {
				// gpu-8, waiting too, wins the race for the freed slot: its claim lands between this node's view
				// of the Lease and its write, which the API server refuses (the tracker directly: the fake's lock is
				// held here, and the fake keeps no resourceVersions to refuse by)
				obj, err := e.client.Tracker().Get(leases, namespace, slots.Name("default"))
				if err != nil {
					return true, nil, err
				}
				won := obj.DeepCopyObject().(*coordinationv1.Lease)
				won.Annotations[slots.HoldersAnnotation] = `{"gpu-8":"` + e.clock().UTC().Format(time.RFC3339) + `"}`
				if err := e.client.Tracker().Update(leases, won, namespace); err != nil {
					return true, nil, err
				}
				return true, nil, apierrors.NewConflict(leases.GroupResource(), l.Name, errors.New("the object has been modified"))
			}
			if h[nodeName] != "" && raced.Load() {
				// a claim written from a view of the Lease before gpu-8's (a watch not caught up yet) is refused,
				// as the API server refuses its stale resourceVersion: the fake keeps none to refuse by
				obj, err := e.client.Tracker().Get(leases, namespace, slots.Name("default"))
				if err != nil {
					return true, nil, err
				}
				now, _ := slots.Holders(obj.(*coordinationv1.Lease))
				if now["gpu-8"] != "" && h["gpu-8"] == "" {
					return true, nil, apierrors.NewConflict(leases.GroupResource(), l.Name, errors.New("the object has been modified"))
				}
			}
			writes = append(writes, "slots "+l.Annotations[slots.HoldersAnnotation])
			if len(h) == 0 {
				freed.Store(true)
			}
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := e.startWithoutSlotJitter(ctx)
	assertHeld(t, e, "waiting for a slot of pool default")
	// the first look gives its node Lease back after it wrote the reason: that write is not the race's
	waitUntil(t, "the node Lease given back after the first look", func() bool {
		l, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName(nodeName), metav1.GetOptions{})
		return err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "")
	})
	mu.Lock()
	writes = nil // the run's first look under its Lease
	mu.Unlock()

	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !raced.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !raced.Load() {
		t.Fatal("the waiting node never went for the slot freed")
	}
	time.Sleep(300 * time.Millisecond)
	assertHeld(t, e, "waiting for a slot of pool default")
	if got := e.holders(); !slices.Equal(got, []string{"gpu-8"}) {
		t.Fatalf("holders %v after the node lost the race, want gpu-8 alone", got)
	}
	mu.Lock()
	lost := slices.Clone(writes)
	writes = nil
	mu.Unlock()
	if slices.Contains(lost, "node-lease") {
		t.Fatalf("writes while the node lost the race for the freed slot: %q; want no write of its node Lease", lost)
	}

	e.freeSlotOf("gpu-8", done)
	mu.Lock()
	won := slices.Clone(writes)
	mu.Unlock()
	claim := slices.IndexFunc(won, func(w string) bool { return strings.Contains(w, `"`+nodeName+`"`) })
	if lease := slices.Index(won, "node-lease"); claim < 0 || lease < 0 || claim > lease {
		t.Fatalf("writes once gpu-8's slot was free: %q; want the node's claim before its node Lease is taken", won)
	}
	if got := e.holders(); !slices.Equal(got, []string{nodeName}) {
		t.Fatalf("holders %v after the change, want the node's own slot", got)
	}
}

// A node that took a freed slot while it waited, and whose turn has gone by its run under its node's Lease (a node
// of its pool failed meanwhile, reaching the pool's failure threshold), gives the slot back and waits untouched: a
// waiting node is in service and holds none of its pool's slots.
func TestNodeThatTookASlotWhileWaitingGivesItBackWhenItsTurnHasGone(t *testing.T) {
	mark := canary.Mark{Pool: "default", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 1, MaxFailures: 1}.Format()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, mark))
	for _, name := range []string{"gpu-7", "gpu-9"} {
		if _, err := e.client.CoreV1().Nodes().Create(context.Background(), planned(name, nodestate.UpgradeRequired, mark), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.holdSlot("gpu-7")
	var failed atomic.Bool
	e.client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if h, _ := slots.Holders(l); l.Name != slots.Name("default") || h[nodeName] == "" || failed.Swap(true) {
			return false, nil, nil
		}
		// gpu-9 fails right after the waiting node's claim: the pool is at its failure threshold
		nodes := corev1.SchemeGroupVersion.WithResource("nodes")
		obj, err := e.client.Tracker().Get(nodes, "", "gpu-9")
		if err != nil {
			return false, nil, err
		}
		n := obj.DeepCopyObject().(*corev1.Node)
		n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeFailed)
		return false, nil, e.client.Tracker().Update(nodes, n, "")
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := e.startWithoutSlotJitter(ctx)
	assertHeld(t, e, "waiting for a slot of pool default")
	e.setState("gpu-7", nodestate.UpgradeDone)
	if err := pool(e).Give(context.Background(), "gpu-7"); err != nil {
		t.Fatal(err)
	}
	assertHeld(t, e, "failed their driver change")
	if !failed.Load() {
		t.Fatal("the waiting node never claimed the freed slot")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.holders()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.holders(); len(got) != 0 {
		t.Fatalf("holders %v while the node is held at its pool's failure threshold, want none: it is in service", got)
	}
	select {
	case err := <-done:
		t.Fatalf("the held node's run ended (%v), want it waiting", err)
	default:
	}
}

// startWithoutSlotJitter is start with no pause between a freed slot seen and the try for it: the tests that stage
// who wins the race decide the order themselves.
func (e *env) startWithoutSlotJitter(ctx context.Context) <-chan error {
	o := e.options(newDigest)
	o.SlotJitter = -1
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, &bytes.Buffer{}) }()
	return done
}

// A node that loses the race for a free slot under its node's Lease (another node created the pool's slots Lease
// between its read and its write, taking the first slot) takes nothing and waits on the slots Lease, from where it
// takes the slot still free at once: neither racing again on a fresh read, which at a rollout's start had every
// loser read and write once more for each slot taken, nor waiting for the slot recheck.
func TestNodeThatLostTheRaceForAFreeSlotTakesOneStillFreeFromItsWatch(t *testing.T) {
	mark := canary.Mark{Pool: "default", Plan: planID, Canary: map[string]string{}, MaxUnavailable: 2}.Format()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, mark))
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), planned("gpu-8", nodestate.UpgradeRequired, mark), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := coordinationv1.SchemeGroupVersion.WithResource("leases")
	var raced atomic.Bool
	var creates atomic.Int32
	e.client.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease)
		if l.Name != slots.Name("default") {
			return false, nil, nil
		}
		creates.Add(1)
		if raced.Swap(true) {
			return false, nil, nil
		}
		first := l.DeepCopy()
		first.Annotations[slots.HoldersAnnotation] = `{"gpu-8":"` + e.clock().UTC().Format(time.RFC3339) + `"}`
		if err := e.client.Tracker().Create(leases, first, namespace); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(leases.GroupResource(), l.Name)
	})
	var waited atomic.Bool // the node showed it waits for a slot: it did not race again under its Lease
	e.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), "waiting for a slot") {
			waited.Store(true)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	select {
	case err := <-e.startWithoutSlotJitter(ctx):
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the node did not take the slot still free after it lost the race; reason %q", e.node().Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if !raced.Load() || creates.Load() != 1 || !waited.Load() {
		t.Fatalf("raced %v, slots Lease creates %d, waited %v: want the one lost race, then a wait on the slots Lease", raced.Load(), creates.Load(), waited.Load())
	}
	if got := e.holders(); !slices.Equal(got, slices.Sorted(slices.Values([]string{"gpu-8", nodeName}))) {
		t.Fatalf("holders %v, want gpu-8 and the node", got)
	}
}

// The pool's waiting nodes began to wait together, at the rollout's start: each looks again after SlotRecheck plus
// a random part of up to half of it, so that they do not all take their node Lease in the same second, every
// SlotRecheck, for as long as the rollout lasts.
func TestWaitingNodesLookAgainSpreadOverHalfTheRecheck(t *testing.T) {
	m := &manager{o: &Options{SlotRecheck: 2 * time.Minute}}
	seen := map[time.Duration]bool{}
	for range 50 {
		d := m.recheckAfter()
		if d < 2*time.Minute || d >= 3*time.Minute {
			t.Fatalf("recheck after %s, want from 2 to 3 minutes", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("%d distinct recheck delays in 50 looks: the waiting nodes would look again together", len(seen))
	}
}
