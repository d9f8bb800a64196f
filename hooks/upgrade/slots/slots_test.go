package slots

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const namespace = "gpu-operator"

var now = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// node is a GPU node in an upgrade state, cordoned by the upgrade when cordoned.
func node(name string, state nodestate.UpgradeState, cordoned bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if state != "" {
		n.Labels[nodestate.UpgradeStateLabel] = string(state)
	}
	if cordoned {
		n.Spec.Unschedulable = true
		n.Annotations[nodestate.CordonedAnnotation] = "driver-upgrade"
	}
	return n
}

// newClient is a fake API server that keeps each Lease's resourceVersion and refuses an update that does not carry
// the stored one (409), as the real one does: what makes claims one after another.
func newClient(objs ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objs...)
	rv := 100
	c.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "create" && a.GetVerb() != "update" {
			return false, nil, nil
		}
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease) // an update action has the same methods
		if a.GetVerb() == "update" {
			cur, err := c.Tracker().Get(leases, l.Namespace, l.Name)
			if err != nil {
				return true, nil, err
			}
			if cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
				return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), l.Name, errors.New("the object has been modified"))
			}
		}
		rv++
		l.ResourceVersion = strconv.Itoa(rv)
		return false, nil, nil
	})
	return c
}

var leases = coordinationv1.SchemeGroupVersion.WithResource("leases")

func holders(t *testing.T, c *fake.Clientset, pool string) map[string]string {
	t.Helper()
	l, err := c.CoordinationV1().Leases(namespace).Get(context.Background(), Name(pool), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Holders(l)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func take(t *testing.T, p Pool, n string) Claim {
	t.Helper()
	c, err := p.Take(context.Background(), n, now)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A pool of two slots: two nodes take one each, the third is held and told who holds them; a restarted manager
// takes its own slot back; a give-back frees one for the held node.
func TestTakeUpToMaxThenHoldUntilAGiveBack(t *testing.T) {
	c := newClient(node("a", nodestate.CordonRequired, false), node("b", nodestate.PodRestartRequired, true), node("c", nodestate.UpgradeRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	if !take(t, p, "a").Taken || !take(t, p, "b").Taken {
		t.Fatal("the first two nodes got no slot")
	}
	if got := take(t, p, "c"); got.Taken || strings.Join(got.Holders, ",") != "a,b" {
		t.Fatalf("third node: %+v, want held by a and b", got)
	}
	if !take(t, p, "a").Taken {
		t.Fatal("a holder that claims again (its manager restarted) was refused its own slot")
	}
	if err := p.Give(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if !take(t, p, "c").Taken {
		t.Fatal("no slot after a give-back")
	}
	if h := holders(t, c, "a100"); len(h) != 2 || h["b"] == "" || h["c"] != "2026-09-01T12:00:00Z" {
		t.Fatalf("holders %v, want b and c", h)
	}
	if err := p.Give(context.Background(), "a"); err != nil {
		t.Fatalf("giving back a slot not held: %v", err)
	}
	if err := (Pool{Client: c, Namespace: namespace, Name: "other", Max: 1}).Give(context.Background(), "a"); err != nil {
		t.Fatalf("giving back in a pool without a Lease: %v", err)
	}
}

// Two managers race for the last slot: the one whose write lands second sees a conflict, takes nothing and says it
// lost (its manager then waits on the slots Lease), without reading and writing again. Never both.
func TestRaceForTheLastSlotHasOneWinner(t *testing.T) {
	c := newClient(node("a", nodestate.CordonRequired, false), node("d", nodestate.UpgradeRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	take(t, p, "a")
	raced := false
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if raced || !strings.Contains(l.Annotations[HoldersAnnotation], `"c"`) {
			return false, nil, nil
		}
		raced = true // d's claim lands between c's read and c's write (straight into the store: a reactor may not call the client)
		cur, err := c.Tracker().Get(leases, namespace, Name("a100"))
		if err != nil {
			return true, nil, err
		}
		d := cur.(*coordinationv1.Lease).DeepCopy()
		h, _ := Holders(d)
		h["d"] = now.Format(time.RFC3339)
		if err := write(d, h); err != nil {
			return true, nil, err
		}
		d.ResourceVersion += "-d"
		if err := c.Tracker().Update(leases, d, namespace); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	c.ClearActions()
	got := take(t, p, "c")
	if !raced || got.Taken || !got.Lost {
		t.Fatalf("c: %+v (raced %v), want lost; holders %v", got, raced, holders(t, c, "a100"))
	}
	var verbs []string
	for _, a := range c.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if strings.Join(verbs, ",") != "get,update" {
		t.Errorf("requests %v: a lost race read or wrote again", verbs)
	}
	if h := holders(t, c, "a100"); len(h) != 2 || h["a"] == "" || h["d"] == "" {
		t.Fatalf("holders %v, want a and d: more than maxUnavailable, or the winner's claim undone", h)
	}
}

// A holder whose claim went stale while it waited (a new plan's canary went first) takes its turn at the moment a
// waiting node, finding the pool full, drops it as idle. The holder's own take stamps its claim again by an update,
// so the two conflict: here the drop lands first, and the holder, reading again, finds itself dropped and the pool
// full, and is held. Its take used to answer "yours" without a write, and both nodes went out of service on one
// slot (the soak's pool "a": 4 nodes out of 3).
func TestStaleHolderDroppedMidTakeDoesNotGo(t *testing.T) {
	old := now.Add(-ClaimGrace - time.Second).Format(time.RFC3339)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name("a100"), Namespace: namespace, ResourceVersion: "5"}}
	if err := write(lease, map[string]string{"h": old, "other": now.Format(time.RFC3339)}); err != nil {
		t.Fatal(err)
	}
	c := newClient(lease, node("h", nodestate.UpgradeRequired, false), node("other", nodestate.CordonRequired, true), node("w", nodestate.UpgradeRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	dropped := false
	c.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if dropped {
			return false, nil, nil
		}
		dropped = true // w's take (drop h, add w) lands between h's read and h's write
		cur, err := c.Tracker().Get(leases, namespace, Name("a100"))
		if err != nil {
			return true, nil, err
		}
		l := cur.(*coordinationv1.Lease).DeepCopy()
		if err := write(l, map[string]string{"other": now.Format(time.RFC3339), "w": now.Format(time.RFC3339)}); err != nil {
			return true, nil, err
		}
		l.ResourceVersion += "-w"
		if err := c.Tracker().Update(leases, l, namespace); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	if got := take(t, p, "h"); !dropped || got.Taken || strings.Join(got.Holders, ",") != "other,w" {
		t.Fatalf("h: %+v (dropped %v), want held by other and w; holders %v", got, dropped, holders(t, c, "a100"))
	}
	if h := holders(t, c, "a100"); len(h) != 2 || h["h"] != "" {
		t.Fatalf("holders %v, want other and w", h)
	}
}

// The same holder taking its turn before any drop stamps its claim fresh, so a waiting node's look, reading the
// Lease after it, counts it as out and is held.
func TestHolderTakingItsTurnRenewsItsClaim(t *testing.T) {
	old := now.Add(-ClaimGrace - time.Second).Format(time.RFC3339)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name("a100"), Namespace: namespace, ResourceVersion: "5"}}
	if err := write(lease, map[string]string{"h": old, "other": now.Format(time.RFC3339)}); err != nil {
		t.Fatal(err)
	}
	c := newClient(lease, node("h", nodestate.UpgradeRequired, false), node("other", nodestate.CordonRequired, true), node("w", nodestate.UpgradeRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	if !take(t, p, "h").Taken {
		t.Fatal("the holder lost its own slot")
	}
	if got := take(t, p, "w"); got.Taken {
		t.Fatalf("w: %+v, want held: h renewed its claim for the cordon it writes next", got)
	}
}

// Two managers create the pool's Lease at once: the second's create fails with AlreadyExists, and it reads the
// first's: it lost the race for the first slot and takes nothing.
func TestRaceToCreateTheLease(t *testing.T) {
	c := newClient(node("other", nodestate.CordonRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 1}
	raced := false
	c.PrependReactor("create", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if raced {
			return false, nil, nil
		}
		raced = true
		first := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name("a100"), Namespace: namespace}}
		if err := write(first, map[string]string{"other": now.Format(time.RFC3339)}); err != nil {
			return true, nil, err
		}
		if err := c.Tracker().Create(leases, first, namespace); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	if got := take(t, p, "a"); got.Taken || !got.Lost {
		t.Fatalf("a: %+v, want lost to the node that created the Lease first", got)
	}
	if h := holders(t, c, "a100"); len(h) != 1 || h["other"] == "" {
		t.Fatalf("holders %v, want the creator alone", h)
	}
}

// A full pool drops the holders that are no longer out of service, reading their nodes: one upgrade-done (its
// give-back was lost), one deleted, one whose claim is older than ClaimGrace with no change started. Holders still
// out stay: failed, retried (upgrade-required but cordoned by the upgrade), mid-change, a fresh claim, and a fresh
// claim on a node a new plan called off (upgrade-done) right after its manager took the slot: that manager cordons
// next, so dropping it would put one node more out than the pool's slots.
func TestFullPoolDropsHoldersNoLongerOut(t *testing.T) {
	old := now.Add(-ClaimGrace - time.Second).Format(time.RFC3339)
	fresh := now.Add(-time.Minute).Format(time.RFC3339)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name("a100"), Namespace: namespace, ResourceVersion: "5"}}
	kept := map[string]string{"failed": old, "retried": old, "midchange": old, "fresh": fresh, "calledoff": fresh}
	all := map[string]string{"done": old, "gone": old, "stale": old}
	for k, v := range kept {
		all[k] = v
	}
	if err := write(lease, all); err != nil {
		t.Fatal(err)
	}
	c := newClient(lease, node("done", nodestate.UpgradeDone, false), node("stale", nodestate.UpgradeRequired, false),
		node("failed", nodestate.UpgradeFailed, false), node("retried", nodestate.UpgradeRequired, true),
		node("midchange", nodestate.ValidationRequired, true), node("fresh", nodestate.UpgradeRequired, false),
		node("calledoff", nodestate.UpgradeDone, false),
		node("new", nodestate.UpgradeRequired, false), node("another", nodestate.UpgradeRequired, false))
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 6}
	if got := take(t, p, "new"); !got.Taken {
		t.Fatalf("new: %+v, want a slot once the idle holders are dropped", got)
	}
	h := holders(t, c, "a100")
	for _, n := range []string{"failed", "retried", "midchange", "fresh", "calledoff", "new"} {
		if h[n] == "" {
			t.Errorf("holder %s dropped", n)
		}
	}
	if len(h) != 6 {
		t.Errorf("holders %v, want done, gone and stale dropped", h)
	}
	if got := take(t, p, "another"); got.Taken {
		t.Fatalf("another: %+v, want held: every holder is out", got)
	}
}

// A holders annotation nobody can read refuses with an error that names the Lease and how to reset it, and
// writes nothing; so does a pool without a slot.
func TestUnreadableHoldersRefuse(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name("a100"), Namespace: namespace,
		Annotations: map[string]string{HoldersAnnotation: "a,b"}}}
	c := newClient(lease)
	_, err := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}.Take(context.Background(), "n", now)
	if err == nil || !strings.Contains(err.Error(), namespace+"/"+Name("a100")) || !strings.Contains(err.Error(), "delete the Lease") {
		t.Fatalf("err = %v", err)
	}
	if _, err := (Pool{Client: c, Namespace: namespace, Name: "a100", Max: 0}).Take(context.Background(), "n", now); err == nil {
		t.Fatal("a pool of 0 slots took a claim")
	}
	for _, a := range c.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("a refused claim wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// An API error that may pass (the API server restarting) is retried; the claim lands once.
func TestTransientErrorsAreRetried(t *testing.T) {
	c := newClient()
	fails := 2
	c.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails > 0 {
			fails--
			return true, nil, apierrors.NewServiceUnavailable("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := p.Take(ctx, "a", now)
	if err != nil || !got.Taken {
		t.Fatalf("%+v, %v", got, err)
	}
	if h := holders(t, c, "a100"); len(h) != 1 {
		t.Fatalf("holders %v", h)
	}
}

// Pool names that are no Lease name are hashed; the same pool always names the same Lease.
func TestName(t *testing.T) {
	if got := Name("a100"); got != "kube-gpu-stack-slots-a100" {
		t.Errorf("Name(a100) = %q", got)
	}
	for _, pool := range []string{"A100_sxm", strings.Repeat("x", 60), "ends-"} {
		if got := Name(pool); got != Name(pool) || len(got) > 63 || !validName(got) {
			t.Errorf("Name(%q) = %q", pool, got)
		}
	}
}

// A node back in service gives back every slot it holds, whichever pool it took it of: a node moved between pools
// (its mark names its new pool) or registered again (no mark at all) held its old claim until the claim grace ran
// out, and the pool crawled meanwhile. The other holders and the node Leases stay.
func TestGiveEverywhereFreesTheNodesSlotsInEveryPool(t *testing.T) {
	c := newClient(node("a", nodestate.UpgradeDone, false), node("b", nodestate.CordonRequired, false))
	for _, name := range []string{"a100", "h100"} {
		p := Pool{Client: c, Namespace: namespace, Name: name, Max: 2}
		take(t, p, "a")
		take(t, p, "b")
	}
	nodeLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-gpu-stack-node-a", Namespace: namespace,
		Labels: map[string]string{nodestate.DriverManagerLeaseLabel: "true"}}}
	if _, err := c.CoordinationV1().Leases(namespace).Create(context.Background(), nodeLease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	given, err := GiveEverywhere(context.Background(), c, namespace, "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{Name("a100"), Name("h100")}; !slices.Equal(given, want) {
		t.Errorf("gave back in %v, want %v", given, want)
	}
	for _, name := range []string{"a100", "h100"} {
		if h := holders(t, c, name); len(h) != 1 || h["b"] == "" {
			t.Errorf("pool %s: holders %v, want b's alone", name, h)
		}
	}
	if l, err := c.CoordinationV1().Leases(namespace).Get(context.Background(), nodeLease.Name, metav1.GetOptions{}); err != nil || len(l.Annotations) > 0 {
		t.Errorf("node Lease %+v (%v): want it untouched", l, err)
	}
	if given, err := GiveEverywhere(context.Background(), c, namespace, "a"); err != nil || len(given) > 0 {
		t.Errorf("giving back slots not held: %v %v", given, err)
	}
}

// seenLease is the pool's slots Lease as a waiting node's watch shows it now.
func seenLease(t *testing.T, c *fake.Clientset, pool string) *coordinationv1.Lease {
	t.Helper()
	l, err := c.CoordinationV1().Leases(namespace).Get(context.Background(), Name(pool), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Waiting nodes go for a slot freed on the Lease their watch shows: the first write takes it; a waiter whose watch
// showed the same version loses with no error and no read, and leaves the Lease as the winner wrote it; a seen
// Lease with every slot held writes nothing.
func TestTakeSeenOneWriteEachTheFirstWins(t *testing.T) {
	c := newClient()
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	take(t, p, "a")
	seen := seenLease(t, c, "a100") // both waiters' watches show one slot free
	c.ClearActions()
	if taken, err := p.TakeSeen(context.Background(), seen, "w1", now); err != nil || !taken {
		t.Fatalf("first waiter: taken %v, %v", taken, err)
	}
	if taken, err := p.TakeSeen(context.Background(), seen, "w2", now); err != nil || taken {
		t.Fatalf("second waiter on the same version: taken %v, %v; want lost, no error", taken, err)
	}
	var verbs []string
	for _, a := range c.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if strings.Join(verbs, ",") != "update,update" {
		t.Errorf("requests %v, want one update per waiter and no read", verbs)
	}
	if h := holders(t, c, "a100"); len(h) != 2 || h["w1"] == "" || h["w2"] != "" {
		t.Fatalf("holders %v, want a and w1", h)
	}
	c.ClearActions()
	if taken, err := p.TakeSeen(context.Background(), seenLease(t, c, "a100"), "w2", now); err != nil || taken {
		t.Fatalf("a full pool: taken %v, %v", taken, err)
	}
	for _, a := range c.Actions() {
		if a.GetVerb() != "get" { // seenLease's own read
			t.Errorf("a full seen Lease wrote: %s", a.GetVerb())
		}
	}
}

// A write that fails otherwise (the API server restarting) is an error, not a lost race: the caller's fresh Take
// reads the Lease and finds whether the claim landed.
func TestTakeSeenReturnsOtherErrors(t *testing.T) {
	c := newClient()
	p := Pool{Client: c, Namespace: namespace, Name: "a100", Max: 2}
	take(t, p, "a")
	seen := seenLease(t, c, "a100")
	c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcdserver: request timed out")
	})
	if taken, err := p.TakeSeen(context.Background(), seen, "w", now); err == nil || taken || !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("taken %v, %v; want the 503", taken, err)
	}
}
