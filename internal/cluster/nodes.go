package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// AddNodes registers simulated nodes (marked for kwok) and waits until each has Settled, so that later changes to
// the node are the tests' own. A minute each: on a loaded 2-core machine a node of a control plane that had just
// started once took over 30 s to settle.
func (c *Cluster) AddNodes(ctx context.Context, nodes ...*corev1.Node) error {
	for _, n := range nodes {
		n = n.DeepCopy()
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[SimulatedNodeAnnotation] = "fake"
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", n.Name, err)
		}
	}
	for _, n := range nodes {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return Settled(got), nil
		})
		if err != nil {
			return fmt.Errorf("node %s did not settle (Ready, untainted): %w", n.Name, err)
		}
	}
	return nil
}

// Settled says whether a simulated node has come up: kwok reports it Ready and the node lifecycle controller has
// lifted its not-ready taint. (No controller of the local control plane annotates nodes: the TTL controller is off.)
func Settled(n *corev1.Node) bool {
	if _, ok := n.Annotations[SimulatedNodeAnnotation]; !ok {
		return false
	}
	ready := false
	for _, cond := range n.Status.Conditions {
		ready = ready || (cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue)
	}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady {
			return false
		}
	}
	return ready
}
