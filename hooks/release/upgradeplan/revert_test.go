package upgradeplan

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

const driverDS = "nvidia-driver-daemonset-ubuntu22.04"

// driverDaemonSet is the pool's driver DaemonSet as the cluster has it before the release: its template installs digest.
func driverDaemonSet(digest string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: driverDS, Namespace: "gpu", UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": driverDS}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": driverDS}}, Spec: corev1.PodSpec{
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: "nvidia.com/gpu.present", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
						{Key: nodestate.RevertLabel, Operator: corev1.NodeSelectorOpDoesNotExist}}}}}}},
				InitContainers: []corev1.Container{{Name: "k8s-driver-manager", Command: []string{"driver-manager"}, Env: []corev1.EnvVar{{Name: DigestEnv, Value: digest}}}}}}}}
}

// doneWith is a node upgrade-done with digest recorded.
func doneWith(name, digest string) *corev1.Node {
	n := readyNode(name, map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)})
	n.Annotations = map[string]string{nodestate.DriverDigestAnnotation: digest}
	return n
}

func revertSets(t *testing.T, objs ...runtime.Object) map[string]appsv1.DaemonSet {
	t.Helper()
	out := map[string]appsv1.DaemonSet{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok && revertset.IsRevert(ds) {
			out[ds.Name] = *ds
		}
	}
	return out
}

// The plan keeps a copy of the driver DaemonSet as it is before the release changes it, for the nodes that run its
// driver: owned by it, the same pod template selecting only nodes labelled for it. Copies no node needs go.
func TestPlanKeepsACopyOfTheChangingDaemonSet(t *testing.T) {
	stale := revertset.Build(driverDaemonSet("older"), "older")   // no node runs it, none is labelled for it
	inUse := revertset.Build(driverDaemonSet("oldest"), "oldest") // a node reverted to it earlier
	reverted := doneWith("c", "oldest")
	reverted.Labels[nodestate.RevertLabel] = "oldest"
	_, out, err, client := run(t, pool("new", intstr.FromInt32(1)),
		doneWith("a", "old"), driverPod("a", "old"), doneWith("b", "old"), driverPod("b", "old"), reverted,
		driverDaemonSet("old"), stale, inUse)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	dss, lerr := client.AppsV1().DaemonSets("gpu").List(context.Background(), metav1.ListOptions{})
	if lerr != nil {
		t.Fatal(lerr)
	}
	var objs []runtime.Object
	for i := range dss.Items {
		objs = append(objs, &dss.Items[i])
	}
	copies := revertSets(t, objs...)
	want := revertset.Name(driverDS, "old")
	c, ok := copies[want]
	if !ok || len(copies) != 2 {
		t.Fatalf("revert DaemonSets %v, want %s and the one in use\n%s", keys(copies), want, out)
	}
	if _, ok := copies[inUse.Name]; !ok {
		t.Errorf("the revert DaemonSet a node is labelled for was deleted: %v", keys(copies))
	}
	if c.Annotations[revertset.OfAnnotation] != driverDS || c.Annotations[revertset.DigestAnnotation] != "old" ||
		len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != "ds-uid" || c.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("copy metadata %+v owners %+v strategy %v", c.Annotations, c.OwnerReferences, c.Spec.UpdateStrategy.Type)
	}
	if c.Spec.Selector.MatchLabels[nodestate.RevertLabel] != "old" || c.Spec.Template.Labels[nodestate.RevertLabel] != "old" {
		t.Errorf("copy selector %v, template labels %v: want the revert label", c.Spec.Selector.MatchLabels, c.Spec.Template.Labels)
	}
	reqs := c.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions
	if len(reqs) != 2 || reqs[0].Key != "nvidia.com/gpu.present" || reqs[1].Key != nodestate.RevertLabel || reqs[1].Operator != corev1.NodeSelectorOpIn || reqs[1].Values[0] != "old" {
		t.Errorf("copy affinity %+v: want the pool's terms with the revert label required instead of absent", reqs)
	}
	if !strings.Contains(out, want+" keeps driver config old") || !strings.Contains(out, "revert DaemonSet "+stale.Name+" removed") {
		t.Errorf("output does not say what it kept and removed:\n%s", out)
	}
	// a node done before the record names the driver its pod runs as the one that validated there
	if got := node(t, client, "a").Annotations[nodestate.ValidatedDigestAnnotation]; got != "old" {
		t.Errorf("node a validated digest %q, want old", got)
	}
}

// upgradePolicy.revert=false keeps no copy (and removes the copies no node needs).
func TestPlanKeepsNoCopyWithRevertOff(t *testing.T) {
	pools := pool("new", intstr.FromInt32(1))
	off := false
	pools[0].Revert = &off
	_, out, err, client := run(t, pools, doneWith("a", "old"), driverPod("a", "old"), driverDaemonSet("old"))
	if err != nil {
		t.Fatal(err)
	}
	if _, gerr := client.AppsV1().DaemonSets("gpu").Get(context.Background(), revertset.Name(driverDS, "old"), metav1.GetOptions{}); gerr == nil {
		t.Errorf("a revert DaemonSet was kept with revert off:\n%s", out)
	}
}

// A reverted node: held while the release gives its pool the very driver that failed there; taken back to its driver
// DaemonSet (label and record) for another driver; kept on its revert DaemonSet but no longer counted as failed when
// its pool goes back to the driver it reverted to (a rollback).
func TestPlanAndARevertedNode(t *testing.T) {
	revertedNode := func() *corev1.Node {
		n := doneWith("r", "old")
		n.Labels[nodestate.RevertLabel] = "old"
		n.Annotations[nodestate.RevertedAnnotation] = `{"from":"new","to":"old","daemonSet":"` + revertset.Name(driverDS, "old") + `","reason":"no validator","at":"t"}`
		return n
	}
	for _, c := range []struct {
		target                string
		planned, held         bool
		label, record, saying string
	}{
		{"new", false, true, "old", "yes", "already failed validation there"},
		{"newer", true, false, "", "", "1 GPU nodes marked"},
		{"old", false, false, "old", "", "no longer counted as failed"},
	} {
		t.Run(c.target, func(t *testing.T) {
			plan, out, err, client := run(t, pool(c.target, intstr.FromInt32(1)), revertedNode(), driverPod("r", "old"), driverDaemonSet("new"))
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			planned := len(plan.Nodes) == 1
			held := len(plan.Held) == 1 && plan.Held[0].HeldBy == HeldByRevert
			n := node(t, client, "r")
			record := ""
			if nodestate.Reverted(n) {
				record = "yes"
			}
			if planned != c.planned || held != c.held || n.Labels[nodestate.RevertLabel] != c.label || record != c.record || !strings.Contains(out, c.saying) {
				t.Errorf("planned %v held %v label %q record %q, want %v %v %q %q and %q in:\n%s",
					planned, held, n.Labels[nodestate.RevertLabel], record, c.planned, c.held, c.label, c.record, c.saying, out)
			}
		})
	}
}

func keys(m map[string]appsv1.DaemonSet) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// `upgrade retry` of a reverted node back on its old driver takes it back from its revert DaemonSet (label and
// record) to upgrade-required, deleting no pod: the revert pod's gate empties the node before it stops. While the
// node is still going back, the retry is refused, changing nothing.
func TestRetryOfARevertedNode(t *testing.T) {
	reverted := func(state nodestate.UpgradeState) *corev1.Node {
		n := doneWith("r", "old")
		n.Labels[nodestate.UpgradeStateLabel] = string(state)
		n.Labels[nodestate.RevertLabel] = "old"
		n.Annotations[nodestate.RevertedAnnotation] = `{"from":"new","to":"old","daemonSet":"x","reason":"no validator","at":"t"}`
		return n
	}
	client := fake.NewClientset(reverted(nodestate.ValidationRequired), driverPod("r", "old"))
	var out bytes.Buffer
	if err := Retry(context.Background(), client, "gpu", "rel", "r", time.Now(), &out); err == nil || !strings.Contains(err.Error(), "going back to its old driver") {
		t.Errorf("retry mid-revert: %v", err)
	}
	if n := node(t, client, "r"); !nodestate.Reverted(n) || n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.ValidationRequired) {
		t.Errorf("a refused retry changed the node: %v %v", n.Labels, n.Annotations)
	}
	client = fake.NewClientset(reverted(nodestate.UpgradeDone), driverPod("r", "old"))
	if err := Retry(context.Background(), client, "gpu", "rel", "r", time.Now(), &out); err != nil {
		t.Fatal(err)
	}
	n := node(t, client, "r")
	if _, ok := n.Labels[nodestate.RevertLabel]; ok || nodestate.Reverted(n) || n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
		t.Errorf("after retry: labels %v annotations %v, want upgrade-required off the revert DaemonSet", n.Labels, n.Annotations)
	}
	if _, err := client.CoreV1().Pods("gpu").Get(context.Background(), "driver-r", metav1.GetOptions{}); err != nil {
		t.Errorf("retry deleted the revert pod (its gate must empty the node first): %v", err)
	}
	if !strings.Contains(out.String(), "taken back from its revert DaemonSet") {
		t.Errorf("output %q", out.String())
	}
}

// `upgrade status` shows a reverted node as such, with what failed and what it runs.
func TestStatusShowsARevertedNode(t *testing.T) {
	n := doneWith("r", "old")
	n.Labels[nodestate.RevertLabel] = "old"
	n.Annotations[nodestate.RevertedAnnotation] = `{"from":"new","to":"old","daemonSet":"x-revert-old","reason":"no validator","at":"t"}`
	var out bytes.Buffer
	if err := WriteStatus(context.Background(), fake.NewClientset(n, driverPod("r", "old")), "gpu", "rel", &out); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "upgrade-done (reverted)") || !strings.Contains(s, "driver config new failed validation (no validator); back on old (DaemonSet x-revert-old)") ||
		!strings.Contains(s, "upgrade retry r") {
		t.Errorf("status:\n%s", s)
	}
}
