package upgradeplan

import (
	"bytes"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

// releaseDaemonSet is a driver DaemonSet of release rel.
func releaseDaemonSet(name string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu", UID: types.UID("uid-" + name),
		Labels: map[string]string{"app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "driver"}}}
}

// ownedBy makes pod a pod of ds.
func ownedBy(pod *corev1.Pod, ds *appsv1.DaemonSet) *corev1.Pod {
	yes := true
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}
	return pod
}

// A pool renamed by an upgrade that failed, then renamed back by another that failed too, leaves a driver DaemonSet no
// revision Helm still diffs against: Helm prunes only what the last deployed release named, so the DaemonSet of the
// failed revisions' name stays, and its pods and the pool's own DaemonSet's pods meet on every node of the pool (the
// soak: two driver pods per node, each waiting for the other). The plan deletes such a DaemonSet once the DaemonSet
// that takes each of its nodes over exists, so its pods stop through their gates like those of any renamed pool.
func TestPlanDeletesADriverDaemonSetLeftByFailedReleases(t *testing.T) {
	target := releaseDaemonSet("nvidia-driver-daemonset-ubuntu22.04")
	left := releaseDaemonSet("nvidia-driver-b-renamed-ubuntu22.04")
	copyOf := releaseDaemonSet(revertset.Name(target.Name, "old"))
	copyOf.Annotations = map[string]string{revertset.OfAnnotation: target.Name, revertset.DigestAnnotation: "old"}
	pools := pool("new", intstr.FromInt32(1))
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), target, left, copyOf,
		ownedBy(driverPod("a", "old"), left), ownedBy(driverPod("b", "old"), target))
	_, out, err := planAt(t, client, pools, time.Unix(100, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := client.AppsV1().DaemonSets("gpu").Get(t.Context(), left.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the DaemonSet left by the failed releases is still there (%v):\n%s", err, out)
	}
	if !strings.Contains(out, left.Name) {
		t.Errorf("the plan does not say it deletes %s:\n%s", left.Name, out)
	}
	for _, kept := range []string{target.Name, copyOf.Name} {
		if _, err := client.AppsV1().DaemonSets("gpu").Get(t.Context(), kept, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
}

// A pool renamed by this upgrade: its old DaemonSet is still the last deployed release's, and its successor does not
// exist yet (Helm creates it after the plan). The plan leaves it to Helm, which deletes it once the new one exists:
// deleted first, its pods' gates would find no DaemonSet to empty their nodes for, and the old drivers would stop
// under their GPU pods.
func TestPlanLeavesARenamedPoolsDaemonSetToHelm(t *testing.T) {
	old := releaseDaemonSet("nvidia-driver-b-ubuntu22.04")
	pools := pool("new", intstr.FromInt32(1)) // renders nvidia-driver-daemonset-ubuntu22.04, not there yet
	client := fake.NewClientset(readyNode("a", nil), old, ownedBy(driverPod("a", "old"), old))
	_, out, err := planAt(t, client, pools, time.Unix(100, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := client.AppsV1().DaemonSets("gpu").Get(t.Context(), old.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the renamed pool's DaemonSet: %v\n%s", err, out)
	}
}

// The pre-upgrade plan of the upgrade that renames a pool back cannot delete the failed revisions' DaemonSet (its
// successor does not exist yet, and Helm, diffing against the last deployed release, never deletes it); the gate,
// after Helm applied the release, does. A vGPU manager DaemonSet, whose pools the gate does not know, is left alone.
func TestGateDeletesADriverDaemonSetLeftOnceItsSuccessorExists(t *testing.T) {
	target := releaseDaemonSet("nvidia-driver-daemonset-ubuntu22.04")
	left := releaseDaemonSet("nvidia-driver-b-renamed-ubuntu22.04")
	vgpu := releaseDaemonSet("nvidia-vgpu-manager-daemonset-ubuntu22.04")
	vgpu.Labels["app.kubernetes.io/component"] = KindVGPUManager
	o := Options{Namespace: "gpu", Release: "rel", Pools: pool("new", intstr.FromInt32(1))}
	o.Client = fake.NewClientset(readyNode("a", nil), left, vgpu, ownedBy(driverPod("a", "old"), left))
	var out bytes.Buffer
	if err := DeleteLeftOverDrivers(t.Context(), o, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Client.AppsV1().DaemonSets("gpu").Get(t.Context(), left.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("deleted before its successor exists (%v):\n%s", err, out.String())
	}
	// Helm created the successor
	if _, err := o.Client.AppsV1().DaemonSets("gpu").Create(t.Context(), target, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := DeleteLeftOverDrivers(t.Context(), o, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Client.AppsV1().DaemonSets("gpu").Get(t.Context(), left.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the left-over DaemonSet is still there (%v):\n%s", err, out.String())
	}
	for _, kept := range []string{target.Name, vgpu.Name} {
		if _, err := o.Client.AppsV1().DaemonSets("gpu").Get(t.Context(), kept, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
	if !strings.Contains(out.String(), "validation gate: DaemonSet "+left.Name+" deleted") {
		t.Errorf("the gate does not say what it deleted:\n%s", out.String())
	}
}
