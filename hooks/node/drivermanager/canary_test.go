package drivermanager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const (
	canaryNode = "gpu-0"
	planID     = "2026-09-01T11:59:00.123456789Z"
)

// planMark is the mark the pre-upgrade plan writes on every planned node of pool default: gpu-0 is its canary.
func planMark(plan string, maxFailures int) string {
	return canary.Mark{Pool: "default", Plan: plan, Canary: map[string]string{canaryNode: newDigest}, MaxFailures: maxFailures}.Format()
}

// planned is a node the plan marked upgrade-required under mark.
func planned(name string, state nodestate.UpgradeState, mark string) *corev1.Node {
	n := gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(state)})
	n.Name = name
	n.Annotations = map[string]string{canary.MarkAnnotation: mark}
	return n
}

// canaryEnv is gpu-1 planned behind the canary gpu-0 (in canaryState, marked by the same plan), with peers.
func canaryEnv(t *testing.T, canaryState nodestate.UpgradeState, maxFailures int, peers ...*corev1.Node) *env {
	t.Helper()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, planMark(planID, maxFailures)))
	for _, n := range append([]*corev1.Node{planned(canaryNode, canaryState, planMark(planID, maxFailures))}, peers...) {
		if _, err := e.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *env) setState(name string, s nodestate.UpgradeState) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.Labels[nodestate.UpgradeStateLabel] = string(s)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// touch changes node name without changing its upgrade state: its watchers look again.
func (e *env) touch(name string) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n.Annotations["test/touched"] = time.Now().Format(time.RFC3339Nano)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// start runs the manager in the background; the result arrives on the channel.
func (e *env) start(ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() { done <- e.options(newDigest).Run(ctx, &bytes.Buffer{}) }()
	return done
}

// assertHeld: the node is untouched while it waits: upgrade-required with why, not cordoned, nothing evicted or
// paused, its driver loaded.
func assertHeld(t *testing.T, e *env, why string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(e.node().Annotations[nodestate.UpgradeReasonAnnotation], why) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	n := e.node()
	if got := n.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(got, why) {
		t.Fatalf("reason %q, want it to say %q", got, why)
	}
	if state(n) != nodestate.UpgradeRequired || n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Fatalf("held node: state=%q unschedulable=%v; want upgrade-required and not cordoned", state(n), n.Spec.Unschedulable)
	}
	assertNothingPaused(t, n)
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Fatalf("held node: modules %v, want the old driver kept", mods)
	}
	for _, a := range e.mutatingActions() {
		if strings.Contains(a, "eviction") && !strings.HasPrefix(a, "create pods/eviction") {
			t.Fatalf("held node: %s", a)
		}
	}
}

func wait(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the manager kept waiting")
		return nil
	}
}

// A node behind the canary waits, untouched, until the canary is upgrade-done; then its change goes ahead in the
// same run.
func TestNodeBehindTheCanaryWaitsUntouchedUntilItValidates(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+canaryNode)
	e.setState(canaryNode, nodestate.ValidationRequired)
	time.Sleep(200 * time.Millisecond)
	assertHeld(t, e, "waiting for the canary")
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired || len(e.host.LoadedModules()) != 0 {
		t.Fatalf("after the canary: state %q, modules %v", state(n), e.host.LoadedModules())
	}
}

// The canary itself goes at once.
func TestTheCanaryGoesFirst(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, canary.Mark{Pool: "default", Plan: planID,
		Canary: map[string]string{nodeName: newDigest}, MaxFailures: 1}.Format()))
	if err := wait(t, e.start(context.Background())); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("canary: state %q", state(e.node()))
	}
}

// SIGTERM while waiting for the canary stops the run with nothing changed but the reason; the next driver pod
// waits again and goes once the canary validated.
func TestStopWhileWaitingForTheCanaryConverges(t *testing.T) {
	e := canaryEnv(t, nodestate.CordonRequired, 1)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := e.start(ctx)
	assertHeld(t, e, "waiting for the canary")
	cancel(errSIGTERM)
	if err := wait(t, done); !errors.Is(err, errSIGTERM) {
		t.Fatalf("err = %v, want the stop", err)
	}
	assertHeld(t, e, "waiting for the canary")
	done = e.start(context.Background())
	time.Sleep(200 * time.Millisecond)
	assertHeld(t, e, "waiting for the canary")
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("state %q", state(e.node()))
	}
}

// A failing canary stops the pool at one node: the others never cordon, with the threshold at 1 (the pool holds)
// and above it (the canary never validated).
func TestFailingCanaryStopsThePoolAtOneNode(t *testing.T) {
	for maxFailures, why := range map[int]string{1: "pool default holds: 1 of its nodes failed", 3: "waiting for the canary"} {
		e := canaryEnv(t, nodestate.PodDeletionRequired, maxFailures)
		ctx, cancel := context.WithCancelCause(context.Background())
		done := e.start(ctx)
		e.setState(canaryNode, nodestate.UpgradeFailed)
		assertHeld(t, e, why)
		time.Sleep(200 * time.Millisecond)
		assertHeld(t, e, why)
		cancel(errSIGTERM)
		if err := wait(t, done); !errors.Is(err, errSIGTERM) {
			t.Fatalf("maxFailures %d: err = %v", maxFailures, err)
		}
	}
}

// After the canary, failed nodes count toward the pool's threshold; at it the pool holds, and `upgrade retry` of
// a failed node releases it. A failed node of another pool does not count.
func TestThresholdHoldsThePoolUntilARetry(t *testing.T) {
	failed := planned("gpu-2", nodestate.UpgradeFailed, planMark(planID, 2))
	other := planned("gpu-9", nodestate.UpgradeFailed, canary.Mark{Pool: "other", Plan: planID, MaxFailures: 1}.Format())
	e := canaryEnv(t, nodestate.UpgradeDone, 2, failed, other, planned("gpu-3", nodestate.PodDeletionRequired, planMark(planID, 2)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := e.start(ctx)
	e.setState("gpu-3", nodestate.UpgradeFailed)
	assertHeld(t, e, "pool default holds: 2 of its nodes failed their driver change (gpu-2, gpu-3), its threshold is 2")
	if err := upgradeplan.Retry(context.Background(), e.client, namespace, "rel", "gpu-3", time.Now(), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("after the retry: state %q", state(e.node()))
	}
}

// A canary upgrade-done from before this plan (its mark names an earlier plan: the state was read before the plan
// marked it) is no validation: the node waits until the canary is done under this plan.
func TestCanaryDoneUnderAnEarlierPlanIsNoValidation(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, planMark(planID, 1)))
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(),
		planned(canaryNode, nodestate.UpgradeDone, planMark("2026-08-01T10:00:00Z", 1)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary")
	// the plan's patch: mark and state together; then the canary's change; only then the node goes
	n, _ := e.client.CoreV1().Nodes().Get(context.Background(), canaryNode, metav1.GetOptions{})
	n.Annotations[canary.MarkAnnotation] = planMark(planID, 1)
	n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeRequired)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	assertHeld(t, e, "waiting for the canary")
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

// An admin who removes the mark of a waiting node (its canary node was deleted) lets it go on at once.
func TestRemovingTheMarkReleasesAWaitingNode(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	if err := e.client.CoreV1().Nodes().Delete(context.Background(), canaryNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary")
	n := e.node()
	delete(n.Annotations, canary.MarkAnnotation)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("state %q", state(e.node()))
	}
}

// A node whose change already started (cordoned by an earlier run; a later plan set it back to upgrade-required)
// does not wait: it is out of service already.
func TestNodeMidChangeDoesNotWait(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	n := e.node()
	n.Spec.Unschedulable = true
	n.Annotations[nodestate.CordonedAnnotation] = "driver-upgrade"
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := wait(t, e.start(ctx)); err != nil {
		t.Fatalf("a node mid-change waited: %v", err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("state %q", state(e.node()))
	}
}

// A malformed mark refuses before anything changes; a node without a mark (added to the pool after the plan) is
// not held by a canary it does not know.
func TestMalformedOrMissingMark(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, `{"pool":`))
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), canary.MarkAnnotation) || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("err = %v, want a refusal naming the annotation", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a refused run wrote: %v", acts)
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Errorf("modules %v, want the driver kept", mods)
	}

	e = newEnv(t, gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)}))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("unmarked node: state %q", state(e.node()))
	}
}

// A waiting node never touches the canary's driver pod: the driver DaemonSets are OnDelete, and the canary's own
// old pod empties its node before it stops (replace.go). Evicting it from here would stop the canary's old driver
// under its GPU pods. Whatever state the canary passes through, the waiter lists no pod, reads no DaemonSet and
// evicts nothing.
func TestWaitingNodeLeavesTheCanarysDriverPodAlone(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	old := upgradeplanDriverPod(canaryNode, oldDigest)
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary")
	touched := func() []string {
		var out []string
		for _, a := range e.client.Actions() {
			if ownNodesPods(a) {
				continue // the manager's look for an older driver pod on its own node (stopguard.go)
			}
			if (a.GetResource().Resource == "pods" && a.GetVerb() != "create") || a.GetResource().Resource == "daemonsets" || a.GetSubresource() == "eviction" {
				out = append(out, a.GetVerb()+" "+a.GetResource().Resource+"/"+a.GetSubresource())
			}
		}
		return out
	}
	for _, s := range []nodestate.UpgradeState{nodestate.UpgradeRequired, nodestate.CordonRequired, nodestate.PodRestartRequired, nodestate.ValidationRequired} {
		e.setState(canaryNode, s)
		time.Sleep(100 * time.Millisecond)
		if got := touched(); len(got) > 0 {
			t.Fatalf("canary at %s: the waiter touched driver pods or DaemonSets: %v", s, got)
		}
		assertHeld(t, e, "waiting for the canary")
	}
	if _, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), old.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the canary's old driver pod is gone: %v", err)
	}
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

// A second upgrade mid-rollout re-marks the canary for another driver while a node still waits under the first
// plan: the waiter never evicts the canary's pod of the later driver (its own mark's digest is stale), and it goes
// once the canary is done under the later plan.
func TestWaiterUnderAnEarlierPlanFollowsTheCanarysLaterPlan(t *testing.T) {
	const laterDigest = "3333333333333333333333333333333333333333333333333333333333333333"
	later := canary.Mark{Pool: "default", Plan: "2026-09-01T12:30:00Z", Canary: map[string]string{canaryNode: laterDigest}, MaxFailures: 1}.Format()
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, planMark(planID, 1)))
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), planned(canaryNode, nodestate.UpgradeRequired, later), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := upgradeplanDriverPod(canaryNode, laterDigest)
	if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary")
	time.Sleep(200 * time.Millisecond)
	for _, a := range e.client.Actions() {
		if a.GetSubresource() == "eviction" {
			t.Fatalf("the waiter evicted the canary's pod of the later driver")
		}
	}
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

func upgradeplanDriverPod(node, digest string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-" + node, Namespace: namespace, UID: types.UID("uid-" + node + digest[:4]),
			Labels: map[string]string{ComponentLabel: "driver"}},
		Spec: corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: "driver-manager", Env: []corev1.EnvVar{{Name: upgradeplan.DigestEnv, Value: digest}}}}},
	}
}

// A waiting node reads only what its turn depends on, each selected by the API server: the nodes in upgrade-failed,
// the nodes under a revert DaemonSet (reverted changes failed too), itself and its pool's canary. A watch of every node carrying an upgrade state would send each of a pool's
// waiting managers the whole pool and each of its changes: at 1,000 nodes, a LIST of megabytes per manager.
func TestWaitingNodeWatchesOnlyWhatItsTurnNeeds(t *testing.T) {
	var peers []*corev1.Node
	for i := range 20 {
		peers = append(peers, planned(fmt.Sprintf("gpu-peer-%02d", i), nodestate.UpgradeRequired, planMark(planID, 1)))
	}
	e := canaryEnv(t, nodestate.UpgradeRequired, 1, peers...)
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+canaryNode)
	failedOnly := nodestate.UpgradeStateLabel + "=" + string(nodestate.UpgradeFailed)
	named := map[string]bool{}
	for _, a := range e.client.Actions() {
		if a.GetResource().Resource != "nodes" || (a.GetVerb() != "list" && a.GetVerb() != "watch") {
			continue
		}
		var lbl, fld string
		switch a := a.(type) {
		case k8stesting.ListAction:
			lbl, fld = a.GetListRestrictions().Labels.String(), a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			lbl, fld = a.GetWatchRestrictions().Labels.String(), a.GetWatchRestrictions().Fields.String()
		}
		name, isNamed := strings.CutPrefix(fld, "metadata.name=")
		switch {
		case lbl == failedOnly && fld == "":
		case lbl == nodestate.RevertLabel && fld == "":
		case lbl == "" && isNamed:
			named[name] = true
		default:
			t.Errorf("%s nodes with labels %q and fields %q: selects more nodes than the turn reads", a.GetVerb(), lbl, fld)
		}
	}
	if !named[nodeName] || !named[canaryNode] || len(named) != 2 {
		t.Errorf("nodes watched by name: %v, want this node %s and the canary %s", named, nodeName, canaryNode)
	}
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

// A new plan naming another canary while a node waits: the node's watches follow its mark to the new canary, and
// it goes once that one validated (the old canary's state no longer counts).
func TestWaitingNodeFollowsItsMarkToANewCanary(t *testing.T) {
	const newCanary, laterPlan = "gpu-9", "2026-09-01T12:30:00Z"
	later := canary.Mark{Pool: "default", Plan: laterPlan, Canary: map[string]string{newCanary: newDigest}, MaxFailures: 1}.Format()
	e := canaryEnv(t, nodestate.UpgradeRequired, 1, planned(newCanary, nodestate.UpgradeRequired, later))
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+canaryNode)
	n := e.node()
	n.Annotations[canary.MarkAnnotation] = later
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+newCanary)
	e.setState(canaryNode, nodestate.UpgradeDone) // the earlier plan's canary: no longer this node's
	time.Sleep(200 * time.Millisecond)
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+newCanary)
	e.setState(newCanary, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if state(e.node()) != nodestate.ValidationRequired {
		t.Fatalf("after the new canary: state %q", state(e.node()))
	}
}

// A node waiting for its canary holds no Lease and writes none: the wait is watches alone (a held Lease would be
// renewed every RetryPeriod, the one steady request stream of a thousand waiting nodes). Once the canary
// validated, the run takes the Lease again, changes the driver and gives the Lease back.
func TestWaitingNodeHoldsNoLease(t *testing.T) {
	e := canaryEnv(t, nodestate.UpgradeRequired, 1)
	done := e.start(context.Background())
	assertHeld(t, e, "waiting for the canary of pool default to validate its new driver: "+canaryNode)
	leaseWrites := func() int {
		n := 0
		for _, a := range e.client.Actions() {
			if a.GetResource().Resource == "leases" && a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
				n++
			}
		}
		return n
	}
	holder := func() string {
		lease, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName(nodeName), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Lease of the run that found the node held: %v", err)
		}
		return ptr.Deref(lease.Spec.HolderIdentity, "")
	}
	// the run under the Lease writes the node's reason, then gives the Lease back: the wait starts after that
	for deadline := time.Now().Add(5 * time.Second); holder() != "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if h := holder(); h != "" {
		t.Errorf("Lease held by %q while the node waits, want it given back", h)
	}
	before := leaseWrites()
	time.Sleep(2*DefaultLeaseRetryPeriod + 500*time.Millisecond) // two renewals, were the Lease held
	if after := leaseWrites(); after != before {
		t.Errorf("%d Lease writes while the node waited for its canary, want none", after-before)
	}
	if h := holder(); h != "" {
		t.Errorf("Lease held by %q while the node waits, want it given back", h)
	}
	e.setState(canaryNode, nodestate.UpgradeDone)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired || len(e.host.LoadedModules()) != 0 {
		t.Fatalf("after the canary: state %q, modules %v", state(n), e.host.LoadedModules())
	}
	if leaseWrites() <= before {
		t.Error("the driver change after the wait took no Lease")
	}
}

// ownNodesPods: a list or watch of the pods bound to the manager's own node.
func ownNodesPods(a k8stesting.Action) bool {
	if a.GetResource().Resource != "pods" {
		return false
	}
	var sel fields.Selector
	switch r := a.(type) {
	case k8stesting.ListAction:
		sel = r.GetListRestrictions().Fields
	case k8stesting.WatchAction:
		sel = r.GetWatchRestrictions().Fields
	default:
		return false
	}
	node, ok := sel.RequiresExactMatch("spec.nodeName")
	return ok && node == nodeName
}
