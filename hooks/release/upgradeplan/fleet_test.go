package upgradeplan

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// The canary is a node that can show the new driver works: Ready, schedulable, its current driver validated (its
// driver pod Ready: the upgrade gate's startup probe passes only then). A pool whose first node by name is down
// would otherwise wait for it for good.
func TestCanaryIsAReadyNodeWhoseDriverValidated(t *testing.T) {
	down := readyNode("a", nil)
	down.Status.Conditions[0].Status = corev1.ConditionUnknown
	cordoned := readyNode("b", nil)
	cordoned.Spec.Unschedulable = true
	notValidated := driverPod("c", "old")
	notValidated.Status.Conditions = nil
	failedBefore := readyNode("d", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.ValidationRequired)})
	plan, out, err, client := run(t, pool("new", intstr.FromInt32(4)),
		down, cordoned, readyNode("c", nil), failedBefore, readyNode("e", nil), readyNode("f", nil),
		driverPod("a", "old"), driverPod("b", "old"), notValidated, driverPod("d", "old"), driverPod("e", "old"), driverPod("f", "old"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := plan.Canary["default"]; len(got) != 1 || got[0].Node != "e" {
		t.Fatalf("canary %+v, want e (a is NotReady, b cordoned, c's driver not validated, d mid-change)\n%s", got, out)
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
	if m, err := canary.Read(n); err != nil || m == nil || !m.IsCanary("e") || m.IsCanary("a") {
		t.Fatalf("node a's mark %+v (%v): want canary e", m, err)
	}
}

// A pool with no node that can be its canary refuses, naming why each node cannot, and changes nothing.
func TestNoNodeCanBeTheCanaryRefuses(t *testing.T) {
	down := readyNode("a", nil)
	down.Status.Conditions[0].Status = corev1.ConditionFalse
	notValidated := driverPod("b", "old")
	notValidated.Status.Conditions = nil
	_, out, err, client := run(t, pool("new", intstr.FromInt32(2)), down, readyNode("b", nil), driverPod("a", "old"), notValidated)
	if err == nil || !strings.Contains(err.Error(), "no node of pool default can be its canary") ||
		!strings.Contains(err.Error(), "a (NotReady)") || !strings.Contains(err.Error(), "b (driver pod not Ready") ||
		!strings.Contains(err.Error(), "upgradePolicy.canary: 0") {
		t.Fatalf("err %v\n%s", err, out)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			t.Fatalf("a refused plan wrote %v", a)
		}
	}
}

// A re-sync that does not change the driver (an Argo CD sync runs the plan every time; a chart-only helm upgrade)
// while the pool's rollout runs keeps the running plan: same plan, same canary, and nothing written. Without it,
// each sync named a new canary among the waiting nodes and set nodes mid-change back to upgrade-required.
func TestResyncKeepsTheRunningPlan(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	first := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), readyNode("c", nil),
		driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "old"))
	if _, err := runAt(t, first, pools, time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	// the rollout moves on: the canary a is done with its new driver, b is being emptied by its old pod's gate
	setState(t, first, "a", nodestate.UpgradeDone, false)
	repod(t, first, "a", "new")
	setState(t, first, "b", nodestate.DrainRequired, true)
	before := marks(t, first)

	first.ClearActions()
	out, err := runAt(t, first, pools, time.Unix(200, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, a := range first.Actions() {
		if _, ok := a.(k8stesting.PatchAction); ok {
			t.Errorf("the re-sync wrote %s %s: %s", a.GetResource().Resource, a.(k8stesting.PatchAction).GetName(), a.(k8stesting.PatchAction).GetPatch())
		}
	}
	after := marks(t, first)
	for name, m := range before {
		if after[name] != m {
			t.Errorf("node %s: mark %s became %s", name, m, after[name])
		}
	}
	if n := node(t, first, "b"); n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.DrainRequired) {
		t.Errorf("node b mid-change went to %s", n.Labels[nodestate.UpgradeStateLabel])
	}
	if !strings.Contains(out, "resumes its plan") {
		t.Errorf("the plan does not say it resumes:\n%s", out)
	}

	// another driver change is a new plan, with a new canary among the nodes still to change
	out, err = runAt(t, first, pool("newer", intstr.FromInt32(1)), time.Unix(300, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m, _ := canary.Read(node(t, first, "c"))
	if m == nil || m.Plan == before["c"] || !strings.Contains(out, "canary: a") {
		t.Fatalf("a new target kept the old plan: %+v\n%s", m, out)
	}
}

// Plans are ordered by what the cluster shows, not by the clock of the pod that ran them: a second upgrade whose hook
// pod's clock is behind still makes a later plan, so a node left with the first plan's mark (its driver pod was
// being recreated when the second plan ran) follows the canary that validated under the second.
func TestALaterPlanIsLaterWhateverTheClock(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
	if _, err := runAt(t, client, pools, time.Unix(1000, 0)); err != nil {
		t.Fatal(err)
	}
	// b's driver pod is gone for a moment (recreated) when the next upgrade plans: b keeps the first plan's mark
	if err := client.CoreV1().Pods("gpu").Delete(t.Context(), "driver-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := runAt(t, client, pool("newer", intstr.FromInt32(1)), time.Unix(10, 0)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	setState(t, client, "a", nodestate.UpgradeDone, false)
	b := node(t, client, "b")
	mb, err := canary.Read(b)
	if err != nil || mb == nil {
		t.Fatalf("node b mark %v %v", mb, err)
	}
	turn := canary.Decide("b", mb, []*corev1.Node{node(t, client, "a"), b})
	if !turn.Go {
		t.Fatalf("node b waits (%s): its canary a validated under a later plan", turn.Waiting)
	}
}

func runAt(t *testing.T, client *fake.Clientset, pools []driverpools.Pool, at time.Time) (string, error) {
	t.Helper()
	_, out, err := planAt(t, client, pools, at)
	return out, err
}

// planAt is runAt with the plan it made.
func planAt(t *testing.T, client *fake.Clientset, pools []driverpools.Pool, at time.Time) (*Plan, string, error) {
	t.Helper()
	var out bytes.Buffer
	plan, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pools, Evict: true,
		Now: func() time.Time { return at }}, &out)
	return plan, out.String(), err
}

func node(t *testing.T, client *fake.Clientset, name string) *corev1.Node {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// setState moves a node as the rollout would: its state, and the stack's cordon while it is out.
func setState(t *testing.T, client *fake.Clientset, name string, state nodestate.UpgradeState, cordoned bool) {
	t.Helper()
	n := node(t, client, name)
	n.Labels[nodestate.UpgradeStateLabel] = string(state)
	n.Spec.Unschedulable = cordoned
	if cordoned {
		n.Annotations[nodestate.CordonedAnnotation] = "true"
	} else {
		delete(n.Annotations, nodestate.CordonedAnnotation)
	}
	if _, err := client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// repod replaces a node's driver pod with one of digest.
func repod(t *testing.T, client *fake.Clientset, name, digest string) {
	t.Helper()
	if err := client.CoreV1().Pods("gpu").Delete(t.Context(), "driver-"+name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("gpu").Create(t.Context(), driverPod(name, digest), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func marks(t *testing.T, client *fake.Clientset) map[string]string {
	t.Helper()
	out := map[string]string{}
	list, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		out[n.Name] = n.Annotations[canary.MarkAnnotation]
	}
	return out
}

// A node the admin holds (the skip label) is not planned or marked, and the plan says so, with the driver it keeps.
func TestPlanShowsHeldNodes(t *testing.T) {
	held := readyNode("b", map[string]string{nodestate.UpgradeSkipLabel: "true"})
	plan, out, err, client := run(t, pool("new", intstr.FromInt32(1)), readyNode("a", nil), held, driverPod("a", "old"), driverPod("b", "old"))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Held) != 1 || plan.Held[0].Node != "b" || len(plan.Nodes) != 1 {
		t.Fatalf("held %+v, planned %+v", plan.Held, plan.Nodes)
	}
	if !strings.Contains(out, "node b (pool default) held: nvidia.com/gpu-driver-upgrade.skip=true keeps its driver (config old) in service") {
		t.Errorf("plan output:\n%s", out)
	}
	if n := node(t, client, "b"); n.Labels[nodestate.UpgradeStateLabel] != "" || n.Annotations[canary.MarkAnnotation] != "" {
		t.Errorf("held node b was marked: %v %v", n.Labels, n.Annotations)
	}
}

// A pool's plan names its slots by its node selection: the same pool renamed gets the same slots (the nodes out
// under the old name keep counting against it), another selection other slots.
func TestPlanNamesSlotsByTheNodeSelection(t *testing.T) {
	slotsOf := func(pools []driverpools.Pool) string {
		t.Helper()
		client := fake.NewClientset(readyNode("a", nil), driverPod("a", "old"))
		if out, err := runAt(t, client, pools, time.Unix(100, 0)); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		m, err := canary.Read(node(t, client, "a"))
		if err != nil || m == nil || m.Slots == "" {
			t.Fatalf("mark %+v (%v): want slots named", m, err)
		}
		return m.Slots
	}
	pools := pool("new", intstr.FromInt32(1))
	before := slotsOf(pools)
	pools[0].Name = "renamed"
	if got := slotsOf(pools); got != before {
		t.Errorf("renamed pool's slots %s, want the same as before the rename (%s)", got, before)
	}
	pools[0].NodeSelectorTerms = []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nvidia.com/gpu.present", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
		{Key: "nvidia.com/driver.pool", Operator: corev1.NodeSelectorOpDoesNotExist}}}}
	if got := slotsOf(pools); got == before {
		t.Errorf("a pool of another node selection shares the slots %s", got)
	}
}

// A node is judged by the driver it runs, not by its driver pod's template alone: a node waiting for its turn whose
// old pod was deleted (by hand, a pool rename, a re-registration) already has the new pod, which installs the
// target, while its host runs the old driver. A re-sync that called it off (upgrade-done, "its pod has this release's
// config") was undone by that pod's manager a moment later (it installs another driver than the node runs, so it
// waits for its turn again), at every re-sync, for as long as the rollout lasted.
func TestNodeWaitingWithItsNewPodIsNotCalledOff(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	ran := map[string]string{nodestate.DriverDigestAnnotation: "old"}
	nodes := []runtime.Object{readyNode("a", nil), readyNode("b", nil), readyNode("c", nil)}
	for _, o := range nodes {
		o.(*corev1.Node).Annotations = maps.Clone(ran)
	}
	client := fake.NewClientset(append(nodes, driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "old"))...)
	if _, err := runAt(t, client, pools, time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	before := marks(t, client)
	// b's old pod is deleted while b waits; its new pod waits in its driver manager (not Ready), b still runs "old"
	repod(t, client, "b", "new")
	waiting := node(t, client, "b").DeepCopy()
	pod, err := client.CoreV1().Pods("gpu").Get(t.Context(), "driver-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Conditions = nil
	if _, err := client.CoreV1().Pods("gpu").UpdateStatus(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	plan, out, err := planAt(t, client, pools, time.Unix(200, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(plan.CalledOff) > 0 {
		t.Errorf("the re-sync called off %v: node b runs the old driver, its new pod only waits to install the new one\n%s", plan.CalledOff, out)
	}
	b := node(t, client, "b")
	if st := b.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeRequired) {
		t.Errorf("node b is %s after the re-sync, want upgrade-required (it runs the old driver)", st)
	}
	if b.Annotations[canary.MarkAnnotation] != before["b"] || b.ResourceVersion != waiting.ResourceVersion {
		t.Errorf("the re-sync rewrote node b (mark %s, was %s): a waiting node keeps its plan", b.Annotations[canary.MarkAnnotation], before["b"])
	}
	if !slices.ContainsFunc(plan.Nodes, func(np NodePlan) bool { return np.Node == "b" && np.From == "old" && np.To == "new" }) {
		t.Errorf("node b is not planned old -> new: %+v", plan.Nodes)
	}

	// once b's new driver validated (recorded, the pod Ready, upgrade-done), the next re-sync has nothing for it
	setState(t, client, "b", nodestate.UpgradeDone, false)
	done := node(t, client, "b")
	done.Annotations[nodestate.DriverDigestAnnotation] = "new"
	if _, err := client.CoreV1().Nodes().Update(t.Context(), done, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	repod(t, client, "b", "new")
	plan, out, err = planAt(t, client, pools, time.Unix(300, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if slices.ContainsFunc(plan.Nodes, func(np NodePlan) bool { return np.Node == "b" }) {
		t.Errorf("node b, done with the new driver, is planned again: %+v", plan.Nodes)
	}
}

// A node whose driver pod is being deleted (by hand, a pool rename, its node moved) is being emptied by that pod's
// gate before its driver stops, whatever the next pod installs: a re-sync does not call it off. It did (the next pod
// has this release's config and the node records that driver), the gate set it back to wait for its turn, and the
// two took turns at every re-sync while the node never went (the soak, seed 3 with failing drivers).
func TestNodeWhoseDriverPodStopsIsNotCalledOff(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	b := readyNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
	b.Annotations = map[string]string{nodestate.DriverDigestAnnotation: "new"}
	stopping := driverPod("b", "new")
	stopping.Name = "driver-b-old"
	now := metav1.Now()
	stopping.DeletionTimestamp, stopping.Finalizers = &now, []string{"test/stopping"}
	client := fake.NewClientset(readyNode("a", nil), b, driverPod("a", "new"), stopping, driverPod("b", "new"))
	plan, out, err := planAt(t, client, pools, time.Unix(200, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(plan.CalledOff) > 0 {
		t.Errorf("the re-sync called off %v while b's old driver pod stops\n%s", plan.CalledOff, out)
	}
	if st := node(t, client, "b").Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeRequired) {
		t.Errorf("node b is %s, want upgrade-required while its old driver pod's gate empties it", st)
	}
}
