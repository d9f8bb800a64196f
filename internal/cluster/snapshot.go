package cluster

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeState is what an install and uninstall must leave untouched on a node.
type NodeState struct {
	Labels, Annotations map[string]string
	Taints              []corev1.Taint
	Unschedulable       bool
}

// SnapshotNodes records every node's NodeState.
func SnapshotNodes(ctx context.Context, client kubernetes.Interface) (map[string]NodeState, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]NodeState{}
	for _, n := range nodes.Items {
		out[n.Name] = NodeState{n.Labels, n.Annotations, n.Spec.Taints, n.Spec.Unschedulable}
	}
	return out, nil
}

// NodeChanges names each node whose labels, annotations, taints or schedulability differ between a and b.
func NodeChanges(a, b map[string]NodeState) string {
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(a)) {
		x := a[name]
		y, ok := b[name]
		switch {
		case !ok:
			fmt.Fprintf(&out, "node %s is gone\n", name)
		case !maps.Equal(x.Labels, y.Labels):
			fmt.Fprintf(&out, "node %s labels: %v -> %v\n", name, x.Labels, y.Labels)
		case !maps.Equal(x.Annotations, y.Annotations):
			fmt.Fprintf(&out, "node %s annotations: %v -> %v\n", name, x.Annotations, y.Annotations)
		case !reflect.DeepEqual(x.Taints, y.Taints):
			fmt.Fprintf(&out, "node %s taints: %v -> %v\n", name, x.Taints, y.Taints)
		case x.Unschedulable != y.Unschedulable:
			fmt.Fprintf(&out, "node %s unschedulable: %v -> %v\n", name, x.Unschedulable, y.Unschedulable)
		}
	}
	return out.String()
}
