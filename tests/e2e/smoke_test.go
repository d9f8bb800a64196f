package e2e

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestClusterUp(t *testing.T) {
	e := use(t)
	nodes, err := e.kube.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(fixtureNodes) {
		t.Fatalf("%d nodes, want %d", len(nodes.Items), len(fixtureNodes))
	}
}
