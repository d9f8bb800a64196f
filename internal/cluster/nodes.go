package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// AddNodes registers simulated nodes (marked for kwok) and waits until each has settled: kwok reports it Ready,
// the node lifecycle controller has lifted its not-ready taint and the TTL controller has annotated it, so that
// later changes to the node are the tests' own. A minute each: on a loaded 2-core machine a node of a control
// plane that had just started once took over 30 s to settle.
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
			ready := false
			for _, cond := range got.Status.Conditions {
				ready = ready || (cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue)
			}
			for _, t := range got.Spec.Taints {
				if t.Key == corev1.TaintNodeNotReady {
					return false, nil
				}
			}
			_, ttl := got.Annotations["node.alpha.kubernetes.io/ttl"]
			return ready && ttl, nil
		})
		if err != nil {
			return fmt.Errorf("node %s did not settle (Ready, untainted, annotated): %w", n.Name, err)
		}
	}
	return nil
}
