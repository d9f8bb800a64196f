package releasecheck

import (
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// TestSlimKeepsTheReport: a snapshot of slimmed objects evaluates to the report of the full ones, waiting pods
// (init container index and name), failed validations and upgrade states included, while the slimmed objects lose
// what the gate need not hold.
func TestSlimKeepsTheReport(t *testing.T) {
	plugin := daemonSet("nvidia-device-plugin-daemonset", "device-plugin")
	validator := daemonSet("nvidia-operator-validator", "operator-validator")
	driver := daemonSet("nvidia-driver-default-ubuntu22.04", "driver")
	failed := gpuNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	failed.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "evict GPU pods: PDB ml/train",
		nodestate.ValidationAnnotationPrefix + "driver": "failed: nvidia-smi exited 9"}
	pools := []driverpools.Pool{{Name: "default", Source: "container", NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}
	build := func() Snapshot {
		nodes := []*corev1.Node{gpuNode("a", nil), failed.DeepCopy(), {ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}}
		pods := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(validator, "a", "r1", false), pod(driver, "a", "r1", true),
			pod(plugin, "b", "r1", true), pod(validator, "b", "r1", true), pod(driver, "b", "r1", false)}
		for _, p := range pods {
			p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
			p.Spec.Containers = []corev1.Container{{Name: "main", Image: "x", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}
			p.Spec.InitContainers[0].Image = "y"
			p.Spec.Volumes = []corev1.Volume{{Name: "v"}}
		}
		for _, n := range nodes {
			n.Status.Images = []corev1.ContainerImage{{Names: []string{"driver"}, SizeBytes: 1 << 30}}
		}
		return Snapshot{Nodes: nodes, DaemonSets: []*appsv1.DaemonSet{plugin, validator, driver}, Pods: pods,
			Revisions: map[types.UID]string{plugin.UID: "r2", validator.UID: "r1", driver.UID: "r1"}}
	}
	full, slimmed := build(), build()
	for _, p := range slimmed.Pods {
		mustSlim(t, p)
		if len(p.ManagedFields) != 0 || len(p.Spec.Volumes) != 0 || p.Spec.InitContainers[0].Image != "" ||
			!reflect.DeepEqual(p.Spec.Containers, []corev1.Container{{Name: "main", Image: "x"}}) {
			t.Fatalf("pod %s kept what neither the report nor the fleet view reads, or lost its image: %+v", p.Name, p.Spec)
		}
	}
	for _, n := range slimmed.Nodes {
		mustSlim(t, n)
		if len(n.Status.Images) != 0 {
			t.Fatalf("node %s kept its image list", n.Name)
		}
	}
	want, err := Evaluate("gpu", "ns", pools, full)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Evaluate("gpu", "ns", pools, slimmed)
	if err != nil {
		t.Fatal(err)
	}
	if want.Table() != got.Table() {
		t.Errorf("slimmed objects change the report:\n%s\nwant:\n%s", got.Table(), want.Table())
	}
	if want.Passed() || want.Summary[Failed] == 0 || want.Summary[Waiting] == 0 {
		t.Fatalf("the snapshot must have failed and waiting cells to compare: %v", want.Summary)
	}

	rev := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "r", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Data: runtime.RawExtension{Raw: []byte(`{"spec":{}}`)}, Revision: 3}
	mustSlim(t, rev)
	if rev.Data.Raw != nil || rev.ManagedFields != nil || rev.Revision != 3 {
		t.Errorf("revision slimmed to %+v", rev)
	}
	// a deleted object the watch missed passes through untouched
	var tomb any = cache.DeletedFinalStateUnknown{Key: "gpu-operator/gone"}
	if out, err := slim(tomb); err != nil || out != tomb {
		t.Errorf("slim(%T) = %v, %v", tomb, out, err)
	}
}

func mustSlim(t *testing.T, obj any) {
	t.Helper()
	if _, err := slim(obj); err != nil {
		t.Fatal(err)
	}
}
