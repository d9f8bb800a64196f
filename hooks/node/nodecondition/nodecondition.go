// Package nodecondition writes one condition of a Node through its status subresource, leaving the kubelet's and
// everyone else's conditions alone.
package nodecondition

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Set writes c on node as a strategic merge patch keyed on the condition's type: nothing when the node already says
// the same (status, reason and message), and lastTransitionTime moves only when the status does.
func Set(ctx context.Context, client kubernetes.Interface, node string, c corev1.NodeCondition) error {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	c.LastHeartbeatTime, c.LastTransitionTime = now, now
	for _, cur := range n.Status.Conditions {
		if cur.Type != c.Type {
			continue
		}
		if cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message {
			return nil
		}
		if cur.Status == c.Status {
			c.LastTransitionTime = cur.LastTransitionTime
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Nodes().PatchStatus(ctx, node, patch)
	return err
}

// Find returns node's condition of type t, if it has one.
func Find(node *corev1.Node, t corev1.NodeConditionType) (corev1.NodeCondition, bool) {
	for _, c := range node.Status.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}
