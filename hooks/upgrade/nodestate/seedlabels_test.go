package nodestate

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestSeedLabel(t *testing.T) {
	const key = "nvidia.com/mig.config"
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "labelled", Labels: map[string]string{key: "all-balanced"}}})
	for node, want := range map[string]string{"bare": "all-disabled", "labelled": "all-balanced"} {
		var out bytes.Buffer
		if err := SeedLabel(t.Context(), client, node, key, "all-disabled", &out); err != nil {
			t.Fatal(err)
		}
		n, err := client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Labels[key]; got != want {
			t.Errorf("node %s: %s=%q, want %q (%s)", node, key, got, want, out.String())
		}
	}
}

// TestSeedLabelsOnItsRoleOnly: the CC manager's init container seeds its role's sandbox switches in one update, on
// nodes of that role only (a node without a valid role label has the default one), keeping every value set.
func TestSeedLabelsOnItsRoleOnly(t *testing.T) {
	const (
		role = "nvidia.com/gpu.workload.config"
		vfio = "nvidia.com/gpu.deploy.vfio-manager"
		sv   = "nvidia.com/gpu.deploy.sandbox-validator"
	)
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "passthrough", Labels: map[string]string{role: "vm-passthrough", sv: "false"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vgpu", Labels: map[string]string{role: "vm-vgpu"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bad-role", Labels: map[string]string{role: "vm"}}})
	only := Workload{Role: "vm-passthrough", Default: "vm-passthrough"}
	want := map[string]map[string]string{
		"passthrough": {vfio: "true", sv: "false"}, // the admin's false kept
		"vgpu":        {vfio: "", sv: ""},          // another role: untouched
		"unlabelled":  {vfio: "true", sv: "true"},  // the default role
		"bad-role":    {vfio: "true", sv: "true"},
	}
	for node, labels := range want {
		var out bytes.Buffer
		if err := SeedLabels(t.Context(), client, node, [][2]string{{vfio, "true"}, {sv, "true"}}, only, &out); err != nil {
			t.Fatal(err)
		}
		n, err := client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range labels {
			if n.Labels[k] != v {
				t.Errorf("node %s: %s=%q, want %q (%s)", node, k, n.Labels[k], v, out.String())
			}
		}
		// each seeded label is recorded, so that the cleanup takes it back
		for k, v := range labels {
			if seeded, _, _ := SeedOf(n, k); (v == "true") != (seeded == "true") {
				t.Errorf("node %s: %s recorded as seeded %q, want it recorded only when seeded", node, k, seeded)
			}
		}
	}
	updates := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			updates++
		}
	}
	if updates != 3 {
		t.Errorf("%d node writes, want one per node seeded (3)", updates)
	}
}
