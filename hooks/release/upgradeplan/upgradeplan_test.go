package upgradeplan

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func readyNode(name string, extra map[string]string) *corev1.Node {
	l := map[string]string{"nvidia.com/gpu.present": "true"}
	for k, v := range extra {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

func driverPod(node, digest string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "driver-" + node, Namespace: "gpu", Labels: map[string]string{
			"app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "driver"}},
		Spec: corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: "k8s-driver-manager", Env: []corev1.EnvVar{{Name: DigestEnv, Value: digest}}}},
			Containers:     []corev1.Container{{Name: "driver", Image: "nvcr.io/nvidia/driver:570.86.15-ubuntu22.04"}}},
		// Ready: its driver validated (the upgrade gate's startup probe)
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func gpuWorkload(node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-" + node, Namespace: "ml", Labels: map[string]string{"app": "train"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

var everyGPUNode = []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "nvidia.com/gpu.present", Operator: corev1.NodeSelectorOpExists}}}}

func pool(digest string, maxUnavailable intstr.IntOrString) []driverpools.Pool {
	return []driverpools.Pool{{Name: "default", Source: "container", NodeSelectorTerms: everyGPUNode, MaxUnavailable: &maxUnavailable,
		DaemonSets: []driverpools.DaemonSet{{Name: "nvidia-driver-daemonset-ubuntu22.04", NodeSelectorTerms: everyGPUNode, Digest: digest}}}}
}

func run(t *testing.T, pools []driverpools.Pool, objs ...runtime.Object) (*Plan, string, error, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	var out bytes.Buffer
	plan, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pools, Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &out)
	return plan, out.String(), err, client
}

func TestFirstInstallHasNothingToDo(t *testing.T) {
	plan, out, err, _ := run(t, pool("new", intstr.FromInt32(1)), readyNode("a", nil))
	if err != nil || len(plan.Nodes) != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("err %v, plan %+v, out %q", err, plan, out)
	}
}

// An upgrade that changes no node's driver (a chart-only bump) prints nothing to do, and no pool's failure threshold:
// with no node of the pool changing, "pool P holds after 1 failed node(s)" read as the pool's state.
func TestUnchangedDriverPrintsNoThreshold(t *testing.T) {
	plan, out, err, _ := run(t, pool("new", intstr.FromInt32(1)), readyNode("a", nil), readyNode("b", nil), driverPod("a", "new"), driverPod("b", "new"))
	if err != nil || len(plan.Nodes) != 0 || !strings.Contains(out, "nothing to do") || strings.Contains(out, "holds after") {
		t.Fatalf("err %v, nodes %v, out %q", err, plan.Nodes, out)
	}
}

// A malformed maxUnavailable fails the plan naming the key, changing nothing; it is never read as 1.
func TestMalformedMaxUnavailableIsAnError(t *testing.T) {
	for _, v := range []intstr.IntOrString{intstr.FromString("abc"), intstr.FromString("150%"), intstr.FromInt32(-1)} {
		plan, _, err, client := run(t, pool("new", v), readyNode("a", nil), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
		if err == nil || !strings.Contains(err.Error(), "driver pool default: upgradePolicy.maxUnavailable") {
			t.Errorf("maxUnavailable %s: plan %+v, err %v; want an error naming the key", v.String(), plan, err)
		}
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" || a.GetVerb() == "update" {
				t.Errorf("maxUnavailable %s: the plan wrote %s %s", v.String(), a.GetVerb(), a.GetResource().Resource)
			}
		}
		o := Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pool("new", v)}
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "upgradePolicy.maxUnavailable") {
			t.Errorf("maxUnavailable %s: Validate = %v", v.String(), err)
		}
	}
}

func TestPlansChangedNodesInBatchesAndMarksThem(t *testing.T) {
	noCanary := 0 // canary_test.go: the canary goes before the batches
	pools := pool("new", intstr.FromString("50%"))
	pools[0].Canary = &noCanary
	plan, out, err, client := run(t, pools,
		readyNode("a", nil), readyNode("b", nil), readyNode("c", nil), readyNode("d", map[string]string{nodestate.UpgradeSkipLabel: "true"}),
		driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "new"), driverPod("d", "old"))
	if err != nil {
		t.Fatal(err)
	}
	// four nodes in the pool, 50% → 2 at a time; c is current and d is skipped
	if got := len(plan.Batches["nvidia-driver-daemonset-ubuntu22.04"]); got != 1 || len(plan.Nodes) != 2 ||
		!strings.Contains(out, "nvidia-driver-daemonset-ubuntu22.04 (pool default) batch 1: a, b") {
		t.Fatalf("plan %+v\n%s", plan, out)
	}
	for name, want := range map[string]string{"a": "upgrade-required", "b": "upgrade-required", "c": "", "d": ""} {
		n, _ := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if got := n.Labels[nodestate.UpgradeStateLabel]; got != want {
			t.Errorf("node %s state %q, want %q", name, got, want)
		}
	}
}

// TestRevertedUpgradeClearsNodesItNeverReached: an upgrade marked a, b and c, then was reverted before the rollout
// replaced b's and c's driver pods; the next plan re-marks a (its pod has the reverted driver) and sets b and c,
// whose pods already run the config the release renders, back to upgrade-done: no driver manager will move them on,
// and the post-upgrade gate would wait for them.
func TestRevertedUpgradeClearsNodesItNeverReached(t *testing.T) {
	marked := map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)}
	plan, out, err, client := run(t, pool("old", intstr.FromInt32(1)),
		readyNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}), readyNode("b", marked), readyNode("c", marked),
		driverPod("a", "broken"), driverPod("b", "old"), driverPod("c", "old"))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Nodes) != 1 || plan.Nodes[0].Node != "a" || !strings.Contains(out, "node b was upgrade-required but its driver pod already has") {
		t.Fatalf("plan %+v\n%s", plan, out)
	}
	for name, want := range map[string]string{"a": "upgrade-required", "b": "upgrade-done", "c": "upgrade-done"} {
		n, _ := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if got := n.Labels[nodestate.UpgradeStateLabel]; got != want {
			t.Errorf("node %s state %q, want %q", name, got, want)
		}
	}
}

func TestRefusesUnsafeUpgradesAndChangesNothing(t *testing.T) {
	failed := readyNode("f", map[string]string{nodestate.UpgradeStateLabel: "upgrade-failed"})
	failed.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "module nvidia is in use by pid 42"}
	down := readyNode("down", nil)
	down.Status.Conditions[0].Status = corev1.ConditionFalse
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep-all", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}}
	_, out, err, client := run(t, pool("new", intstr.FromInt32(1)),
		readyNode("a", nil), failed, down, driverPod("a", "old"), driverPod("down", "old"), driverPod("gone", "old"),
		gpuWorkload("a"), pdb)
	if !errors.Is(err, ErrUnsafe) {
		t.Fatalf("want a refusal, got %v\n%s", err, out)
	}
	for _, want := range []string{
		"node f is in upgrade-failed (module nvidia is in use by pid 42)",
		"GPU pod ml/train-a on node a: PodDisruptionBudget keep-all never allows an eviction",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
	if _, marked := n.Labels[nodestate.UpgradeStateLabel]; marked {
		t.Error("a refused upgrade marked a node")
	}
}

func TestRefusesNodesPoolsNoLongerCover(t *testing.T) {
	pools := []driverpools.Pool{{Name: "a100", Source: "container",
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"a100"}}}}},
		DaemonSets:        []driverpools.DaemonSet{{Name: "nvidia-driver-a100-ubuntu22.04", NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: osIDLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"ubuntu"}}}}}, Digest: "new"}}}}
	_, out, err, _ := run(t, pools,
		readyNode("h100", map[string]string{"gpu": "h100"}), driverPod("h100", "old"),
		readyNode("rhel", map[string]string{"gpu": "a100", osIDLabel: "rhel"}), driverPod("rhel", "old"))
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(out, "node h100 runs a driver but no pool selects it any more") ||
		!strings.Contains(out, "node rhel (rhel , kernel ): pool a100 has no driver image for its OS/kernel") {
		t.Errorf("err %v\n%s", err, out)
	}
}

// TestStatusTable: one row per node with a driver pod or a state; a driver pod that is not Ready is said so (its
// image is not the driver the node runs), skipped nodes are marked, nodes with neither are left out.
func TestStatusTable(t *testing.T) {
	failed := readyNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	failed.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "evict GPU pods: PDB ml/train",
		nodestate.UpgradeSinceAnnotation: "2026-09-01T12:00:00Z"}
	done := readyNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone), nodestate.UpgradeSkipLabel: "true"})
	notReady := driverPod("a", "x")
	notReady.Status.Conditions = nil
	client := fake.NewClientset(failed, done, readyNode("c", nil), notReady, driverPod("b", "x"))
	var out bytes.Buffer
	if err := WriteStatus(t.Context(), client, "gpu", "rel", &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows, got:\n%s", out.String())
	}
	for i, want := range [][]string{
		{"a", "upgrade-failed", "570.86.15-ubuntu22.04 (pod not ready)", "2026-09-01T12:00:00Z", "evict GPU pods: PDB ml/train"},
		{"b", "upgrade-done (held: skip label)", "570.86.15-ubuntu22.04", "-", "-"},
	} {
		for _, field := range want {
			if !strings.Contains(lines[i+1], field) {
				t.Errorf("row %q lacks %q", lines[i+1], field)
			}
		}
	}
	if strings.Contains(lines[2], "not ready") {
		t.Errorf("a Ready driver pod is shown as not ready: %q", lines[2])
	}
}

// TestRefusesDRAGPUPodsABudgetNeverLetsGo: a pod that holds its GPU through a resource claim allocated by
// gpu.nvidia.com is a GPU pod too (the driver manager evicts it), so a budget that never lets it go refuses the
// upgrade; a pod whose claim another driver allocated is not.
func TestRefusesDRAGPUPodsABudgetNeverLetsGo(t *testing.T) {
	claimed := func(name, claim string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", Labels: map[string]string{"app": "train"}},
			Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c"}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	allocated := func(name, driver string) *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
			Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
				Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: "a", Device: "gpu-0"}}}}}}
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep-all", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 2, DesiredHealthy: 2, ExpectedPods: 2}}
	_, out, err, _ := run(t, pool("new", intstr.FromInt32(1)), readyNode("a", nil), driverPod("a", "old"),
		claimed("dra-train", "gpu-claim"), allocated("gpu-claim", "gpu.nvidia.com"),
		claimed("nic-job", "nic-claim"), allocated("nic-claim", "nic.example.com"), pdb)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(out, "GPU pod ml/dra-train on node a: PodDisruptionBudget keep-all never allows an eviction") {
		t.Fatalf("want a refusal naming the DRA GPU pod, got %v\n%s", err, out)
	}
	if strings.Contains(out, "nic-job") {
		t.Errorf("a pod whose claim another driver allocated was counted as a GPU pod:\n%s", out)
	}
}

// A plan that fails while marking (an API error on one node) takes back the marks it made: Helm applies nothing
// after a failed pre-upgrade hook, so a node left upgrade-required would wait for a driver change that never comes.
func TestFailedMarkingTakesBackItsMarks(t *testing.T) {
	done := readyNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)})
	done.Annotations = map[string]string{nodestate.UpgradeSinceAnnotation: "2026-01-01T00:00:00Z"}
	client := fake.NewClientset(done, readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
	client.PrependReactor("patch", "nodes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.PatchAction).GetName() == "b" {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	var out bytes.Buffer
	_, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pool("new", intstr.FromInt32(1)), Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &out)
	if err == nil || !strings.Contains(err.Error(), "etcdserver: request timed out") || !strings.Contains(err.Error(), "marks taken back on a") {
		t.Fatalf("want the marking error naming what was taken back, got %v\n%s", err, out.String())
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
	if got := n.Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.UpgradeDone) {
		t.Errorf("node a left %q after the plan failed, want upgrade-done as before", got)
	}
	if got := n.Annotations[nodestate.UpgradeSinceAnnotation]; got != "2026-01-01T00:00:00Z" {
		t.Errorf("node a's upgrade-since %q, want the one before", got)
	}
	if _, ok := n.Annotations[nodestate.UpgradeReasonAnnotation]; ok {
		t.Errorf("node a keeps the plan's reason %q", n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
}

// TestAllocationSwitchIsPlannedAndGatedLikeADriverChange: a pool moving to DRA with its driver unchanged plans its
// nodes still on the device plugin, names the GPU pods that must move, refuses (changing nothing) while a budget
// never lets one go, and marks the nodes once it can. A node already on DRA, or new to the stack, is not planned.
func TestAllocationSwitchIsPlannedAndGatedLikeADriverChange(t *testing.T) {
	pools := pool("same", intstr.FromInt32(1))
	pools[0].Allocation = nodestate.AllocationDRA
	objs := func(extra ...runtime.Object) []runtime.Object {
		return append([]runtime.Object{
			readyNode("a", map[string]string{nodestate.AllocationLabel: nodestate.AllocationDevicePlugin}),
			readyNode("b", map[string]string{nodestate.AllocationLabel: nodestate.AllocationDRA}),
			readyNode("c", nil),
			driverPod("a", "same"), driverPod("b", "same"), driverPod("c", "same"), gpuWorkload("a"), gpuWorkload("b"),
		}, extra...)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep-all", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 2, DesiredHealthy: 2, ExpectedPods: 2}}
	_, out, err, client := run(t, pools, objs(pdb)...)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(out, "GPU pod ml/train-a on node a: PodDisruptionBudget keep-all") {
		t.Fatalf("want a refusal naming ml/train-a, got %v\n%s", err, out)
	}
	if strings.Contains(out, "train-b") {
		t.Errorf("the pod of a node already on DRA is named:\n%s", out)
	}
	if n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{}); n.Labels[nodestate.UpgradeStateLabel] != "" {
		t.Error("a refused switch marked a node")
	}

	plan, out, err, client := run(t, pools, objs()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Nodes) != 1 || plan.Nodes[0].Node != "a" ||
		!strings.Contains(out, "node a switches GPU allocation device-plugin -> dra (pool default); GPU pods to move first: ml/train-a") {
		t.Fatalf("plan %+v\n%s", plan.Nodes, out)
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
	if n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) || !strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], "GPU allocation device-plugin -> dra") {
		t.Errorf("node a: state %q reason %q", n.Labels[nodestate.UpgradeStateLabel], n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
}

// TestPlanRidesOutPassingAPIErrors: the plan runs once, as a single-try hook Job, so a read the API server answers
// with a passing error (etcd timing out) is sent again, not the end of the upgrade. Every list fails once.
func TestPlanRidesOutPassingAPIErrors(t *testing.T) {
	noCanary := 0
	pools := pool("new", intstr.FromInt32(1))
	pools[0].Canary = &noCanary
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"), gpuWorkload("a"))
	failed := map[string]bool{}
	client.PrependReactor("list", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		key := action.GetResource().Resource + "/" + action.(k8stesting.ListAction).GetListRestrictions().Labels.String()
		if failed[key] {
			return false, nil, nil
		}
		failed[key] = true
		return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	})
	var out bytes.Buffer
	plan, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pools, Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &out)
	if err != nil {
		t.Fatalf("the plan gave up on a passing error: %v\n%s", err, out.String())
	}
	if len(plan.Nodes) != 2 || !failed["poddisruptionbudgets/"] || !failed["nodes/"] {
		t.Fatalf("plan %+v after failed lists %v\n%s", plan, failed, out.String())
	}
}

// A node deleted between the plan's read of the pool and its mark (its Node object deleted, to be registered again)
// is skipped, not a failure of the whole plan: registered again, its new driver pod takes its pool's plan from its
// DaemonSet's other nodes.
func TestNodeDeletedMidPlanIsSkipped(t *testing.T) {
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
	client.PrependReactor("get", "nodes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.GetAction).GetName() == "b" {
			return true, nil, apierrors.NewNotFound(corev1.Resource("nodes"), "b")
		}
		return false, nil, nil
	})
	var out bytes.Buffer
	if _, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pool("new", intstr.FromInt32(1)), Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &out); err != nil {
		t.Fatalf("the plan failed on a node deleted meanwhile: %v\n%s", err, out.String())
	}
	n, _ := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	for _, node := range n.Items {
		if node.Name == "a" && node.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
			t.Errorf("node a: %q, want upgrade-required", node.Labels[nodestate.UpgradeStateLabel])
		}
	}
	if !strings.Contains(out.String(), "node b is gone since the plan read it") {
		t.Errorf("the plan does not say it skipped node b:\n%s", out.String())
	}
}

// A node whose only driver pod is being deleted (its gate empties the node before the driver stops) shows that pod,
// said to be stopping; a node with a live pod too shows the live one.
func TestStatusShowsAStoppingDriverPod(t *testing.T) {
	stopping := driverPod("a", "x")
	now := metav1.Now()
	stopping.DeletionTimestamp = &now
	replaced := driverPod("b", "x")
	replaced.DeletionTimestamp = &now
	replaced.Name = "driver-b-old"
	client := fake.NewClientset(readyNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}),
		readyNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}), stopping, replaced, driverPod("b", "x"))
	var out bytes.Buffer
	if err := WriteStatus(t.Context(), client, "gpu", "rel", &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], "(pod stopping: the node is emptied first)") || strings.Contains(lines[2], "stopping") {
		t.Fatalf("want a's pod stopping and b's live pod:\n%s", out.String())
	}
}
