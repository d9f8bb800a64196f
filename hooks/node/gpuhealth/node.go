package gpuhealth

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
)

// Reporter writes verdicts on one Node: the condition through the status subresource, the taint through the Node.
type Reporter struct {
	Client   kubernetes.Interface
	NodeName string
	Policy   Policy
}

// Report writes v, retrying API errors that may pass (apiretry) within ctx's deadline.
func (r Reporter) Report(ctx context.Context, v Verdict) error {
	if err := apiretry.Do(ctx, func(ctx context.Context) error { return r.condition(ctx, v) }); err != nil {
		return fmt.Errorf("node %s: condition %s: %w", r.NodeName, r.Policy.ConditionType, err)
	}
	// Unknown leaves the taint as it is: an agent that cannot see the GPUs neither condemns nor clears them.
	if r.Policy.Taint == nil || v.Status == corev1.ConditionUnknown {
		return nil
	}
	if err := apiretry.OnConflict(ctx, func(ctx context.Context) error { return r.taint(ctx, v) }); err != nil {
		return fmt.Errorf("node %s: taint %s:%s: %w", r.NodeName, r.Policy.Taint.Key, r.Policy.Taint.Effect, err)
	}
	return nil
}

// condition writes the one condition (nodecondition.Set): the kubelet's own are never rewritten.
func (r Reporter) condition(ctx context.Context, v Verdict) error {
	return nodecondition.Set(ctx, r.Client, r.NodeName, corev1.NodeCondition{Type: r.Policy.ConditionType, Status: v.Status, Reason: v.Reason, Message: v.Message})
}

// taint puts the policy's taint on the node while the verdict is False and takes it off when it is True, by an
// update that carries the resourceVersion read (a Conflict is retried on a fresh read).
func (r Reporter) taint(ctx context.Context, v Verdict) error {
	node, err := r.Client.CoreV1().Nodes().Get(ctx, r.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want := *r.Policy.Taint
	idx := -1
	for i, t := range node.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			idx = i
		}
	}
	switch {
	case v.Status == corev1.ConditionFalse && idx < 0:
		want.Value = v.Reason
		if want.Effect == corev1.TaintEffectNoExecute {
			now := metav1.Now()
			want.TimeAdded = &now
		}
		node.Spec.Taints = append(node.Spec.Taints, want)
	case v.Status == corev1.ConditionTrue && idx >= 0:
		node.Spec.Taints = append(node.Spec.Taints[:idx], node.Spec.Taints[idx+1:]...)
	default:
		return nil
	}
	_, err = r.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	return err
}
