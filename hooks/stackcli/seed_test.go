package stackcli

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
