package upgradeplan

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func TestDriverVersionAndDowngrade(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{{Image: "nvcr.io/nvidia/driver:600.10.01-ubuntu22.04"}, {Image: "gate:1"}}}
	if v := DriverVersion(spec); v != "600.10.01-ubuntu22.04" {
		t.Errorf("DriverVersion = %q", v)
	}
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"600.10.01-ubuntu22.04", "595.91.07-ubuntu22.04", true},
		{"595.91.07-ubuntu22.04", "600.10.01-ubuntu22.04", false},
		{"580.95.05-rhel9", "580.95.05-rhel9", false},
		{"sha256:0123", "595.91.07-ubuntu22.04", false}, // pinned by digest alone: no version to compare
	} {
		if got := Downgrade(c.from, c.to); got != c.want {
			t.Errorf("Downgrade(%s, %s) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

// TestUpgradeStatusShowsTheDriverEachNodeMovesTo: a node whose driver pod runs another driver than its DaemonSet
// installs now shows both, the version first, a downgrade called out; a node already on it shows its driver alone.
func TestUpgradeStatusShowsTheDriverEachNodeMovesTo(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-daemonset-ubuntu22.04", Namespace: "gpu", UID: "ds-uid",
		Labels: map[string]string{"app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "driver"}},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "driver", Image: "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"}}}}}}
	owned := func(node, tag string) *corev1.Pod {
		p := driverPod(node, "d")
		p.Spec.Containers[0].Image = "nvcr.io/nvidia/driver:" + tag
		p.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}
		return p
	}
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)}}}
	}
	client := fake.NewClientset(ds, node("gpu-1"), node("gpu-2"), owned("gpu-1", "600.10.01-ubuntu22.04"), owned("gpu-2", "595.91.07-ubuntu22.04"))
	var out strings.Builder
	if err := WriteStatus(t.Context(), client, "gpu", "rel", &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	row := func(node string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, node+" ") {
				return l
			}
		}
		return ""
	}
	if !strings.Contains(row("gpu-1"), "600.10.01-ubuntu22.04 -> 595.91.07-ubuntu22.04 DOWNGRADE") {
		t.Errorf("gpu-1 moves down a driver: %q", row("gpu-1"))
	}
	if r := row("gpu-2"); !strings.Contains(r, "595.91.07-ubuntu22.04") || strings.Contains(r, "->") {
		t.Errorf("gpu-2 is on the driver its DaemonSet installs: %q", r)
	}
}
