package upgradeplan

import (
	"bytes"
	"errors"
	"fmt"
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

// The plan prints the pool's canary first, alone, then the batches of maxUnavailable without it, and its failure
// threshold; every planned node gets the pool's mark in the same patch as upgrade-required.
func TestPlanPutsTheCanaryFirstAndMarksThePool(t *testing.T) {
	pools := pool("new", intstr.FromInt32(2))
	plan, out, err, client := run(t, pools,
		readyNode("a", nil), readyNode("b", nil), readyNode("c", nil), readyNode("d", nil), readyNode("e", nil),
		driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "old"), driverPod("d", "old"), driverPod("e", "old"))
	if err != nil {
		t.Fatal(err)
	}
	want := "pool default canary: a (nvidia-driver-daemonset-ubuntu22.04); changes alone and must validate before any other node of the pool starts\n" +
		"pool default holds after 1 failed node(s): no other node of it starts until `kube-gpu-stack upgrade retry NODE`\n" +
		"nvidia-driver-daemonset-ubuntu22.04 (pool default) batch 1: b, c\n" +
		"nvidia-driver-daemonset-ubuntu22.04 (pool default) batch 2: d, e\n"
	if !strings.Contains(out, want) {
		t.Fatalf("plan output:\n%s\nwant:\n%s", out, want)
	}
	if len(plan.Canary["default"]) != 1 {
		t.Fatalf("canary %+v", plan.Canary)
	}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		n, _ := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		m, err := canary.Read(n)
		if err != nil || m == nil {
			t.Fatalf("node %s: mark %v, %v", name, m, err)
		}
		if m.Pool != "default" || m.Plan != "1970-01-01T00:00:00Z" || m.MaxFailures != 1 || len(m.Canary) != 1 || m.Canary["a"] != "new" {
			t.Errorf("node %s: mark %+v", name, m)
		}
		if n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
			t.Errorf("node %s: state %q", name, n.Labels[nodestate.UpgradeStateLabel])
		}
	}
	// the mark and the state go in one patch per node
	for _, a := range client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
			body := string(p.GetPatch())
			if strings.Contains(body, nodestate.UpgradeStateLabel) != strings.Contains(body, canary.MarkAnnotation) {
				t.Errorf("state and mark in separate patches: %s", body)
			}
		}
	}
}

// A canary of N takes the first N planned nodes; canary 0 and maxFailures 0 write a mark with the pool's slots
// alone, replacing an earlier plan's; an OnDelete pool (autoUpgrade=false) has no mark: there the admin picks each
// node.
func TestCanarySizeNoCanaryAndOnDelete(t *testing.T) {
	two, zero, off := 2, 0, false
	pools := pool("new", intstr.FromInt32(1))
	pools[0].Canary = &two
	plan, out, err, _ := run(t, pools, readyNode("a", nil), readyNode("b", nil), readyNode("c", nil),
		driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "old"))
	if err != nil || len(plan.Canary["default"]) != 2 || !strings.Contains(out, "canary: a (nvidia-driver-daemonset-ubuntu22.04), b (") ||
		!strings.Contains(out, "batch 1: c\n") {
		t.Fatalf("canary 2: err %v\n%s", err, out)
	}

	stale := readyNode("a", nil)
	stale.Annotations = map[string]string{canary.MarkAnnotation: canary.Mark{Pool: "default", Plan: "old", Canary: map[string]string{"b": "x"}}.Format()}
	for name, tc := range map[string]struct {
		set  func()
		mark bool
	}{
		"none":     {func() { pools[0].Canary, pools[0].MaxFailures, pools[0].AutoUpgrade = &zero, &zero, nil }, true},
		"OnDelete": {func() { pools[0].Canary, pools[0].MaxFailures, pools[0].AutoUpgrade = nil, nil, &off }, false},
	} {
		tc.set()
		plan, out, err, client := run(t, pools, stale.DeepCopy(), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
		if err != nil || len(plan.Canary) != 0 || strings.Contains(out, "canary") || !strings.Contains(out, "batch 1: a\n") {
			t.Fatalf("%s: err %v, plan %+v\n%s", name, err, plan, out)
		}
		n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
		got, err := canary.Read(n)
		switch {
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case !tc.mark && (got != nil || len(plan.Marks) != 0):
			t.Errorf("%s: mark %+v on the node, plan marks %+v: want none", name, got, plan.Marks)
		case tc.mark && (got == nil || got.Plan == "old" || len(got.Canary) != 0 || got.MaxFailures != 0 || got.MaxUnavailable != 1):
			t.Errorf("%s: mark %+v on the node: want this plan's, with the pool's one slot alone", name, got)
		}
	}
}

// A plan that fails half way takes its marks back with the states.
func TestFailedPlanTakesItsMarksBack(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	client := fakeWith(readyNode("a", nil), readyNode("b", nil), driverPod("a", "old"), driverPod("b", "old"))
	client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetName() == "b" && strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), canary.MarkAnnotation) {
			return true, nil, errors.New("etcd is gone")
		}
		return false, nil, nil
	})
	if _, err := runWith(t, client, pools); err == nil {
		t.Fatal("want the plan to fail")
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "a", metav1.GetOptions{})
	if _, ok := n.Annotations[canary.MarkAnnotation]; ok || n.Labels[nodestate.UpgradeStateLabel] != "" {
		t.Fatalf("node a kept the failed plan's mark or state: %v %v", n.Labels, n.Annotations)
	}
}

func fakeWith(objs ...runtime.Object) *fake.Clientset { return fake.NewClientset(objs...) }

func runWith(t *testing.T, client *fake.Clientset, pools []driverpools.Pool) (*Plan, error) {
	t.Helper()
	return Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: pools, Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &bytes.Buffer{})
}

// The slots are the pool's bound, whatever DaemonSets serve it: 20 nodes over 10 kernel DaemonSets at 10% is 2 nodes
// out at once, not the sum of each DaemonSet's own bound (10% of 2 nodes, at least 1: 10 nodes, half the pool).
func TestPoolSlotsSpanItsDaemonSets(t *testing.T) {
	noCanary := 0
	max := intstr.FromString("10%")
	p := driverpools.Pool{Name: "default", Source: "container", NodeSelectorTerms: everyGPUNode, MaxUnavailable: &max, Canary: &noCanary}
	var objs []runtime.Object
	for k := range 10 {
		kernel := fmt.Sprintf("6.8.0-%d-generic", k)
		p.DaemonSets = append(p.DaemonSets, driverpools.DaemonSet{Name: "nvidia-driver-precompiled-" + kernel, Digest: "new",
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: kernelLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{kernel}}}}}})
		for i := range 2 {
			name := fmt.Sprintf("gpu-%d-%d", k, i)
			objs = append(objs, readyNode(name, map[string]string{kernelLabel: kernel}), driverPod(name, "old"))
		}
	}
	plan, out, err, client := run(t, []driverpools.Pool{p}, objs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Nodes) != 20 {
		t.Fatalf("planned %d nodes, want 20:\n%s", len(plan.Nodes), out)
	}
	n, _ := client.CoreV1().Nodes().Get(t.Context(), "gpu-3-1", metav1.GetOptions{})
	if m, err := canary.Read(n); err != nil || m == nil || m.MaxUnavailable != 2 {
		t.Fatalf("mark %+v (%v), want the pool's 2 slots", m, err)
	}
}
