package drivermanager

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// ReasonDriverUpgradeFailed is the GPU health condition's reason (status Unknown) on a node whose driver change
// failed: the maintenance is over, and what the GPUs can do is not known until someone looks.
const ReasonDriverUpgradeFailed = "DriverUpgradeFailed"

// Maintenance is how a driver change tells remediation controllers (NVSentinel's, for example) that the GPUs'
// errors while the driver reloads are planned. The GPU health agent, whose pod is paused with the other GPU
// operands, cannot say so itself once it is gone; it takes its condition back after the new driver validated.
type Maintenance struct {
	// Condition (HEALTH_CONDITION_TYPE) is the GPU health agent's node condition: Unknown with reason
	// nodestate.MaintenanceReason from before the node is cordoned, and DriverUpgradeFailed if the change fails.
	// Empty: the condition is left alone (no agent runs).
	Condition corev1.NodeConditionType
	// LabelKey and LabelValue (MAINTENANCE_LABEL, key=value) are the label a remediation controller skips a node
	// by: put on the node with the cordon-required state (unless the node has it already) and removed at
	// upgrade-done or upgrade-failed. Empty: none.
	LabelKey, LabelValue string
}

// begin writes the Maintenance condition.
func (mt Maintenance) begin(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration) error {
	return mt.condition(ctx, client, node, timeout, nodestate.MaintenanceReason, nodestate.MaintenanceMessage(nodestate.DriverChange))
}

// failed ends the Maintenance condition on a node whose driver change failed; a condition that does not say
// Maintenance (the change failed before it began, or the agent wrote its verdict since) is the agent's to keep.
func (mt Maintenance) failed(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration, reason string) error {
	if mt.Condition == "" {
		return nil
	}
	n, err := nodestate.Get(ctx, client, node)
	if err != nil {
		return err
	}
	if c, ok := nodecondition.Find(n, mt.Condition); !ok || c.Reason != nodestate.MaintenanceReason {
		return nil
	}
	return mt.condition(ctx, client, node, timeout, ReasonDriverUpgradeFailed,
		"the driver change failed ("+reason+"); GPU health is judged again once the GPU health agent runs")
}

func (mt Maintenance) condition(ctx context.Context, client kubernetes.Interface, node string, timeout time.Duration, reason, message string) error {
	if mt.Condition == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := corev1.NodeCondition{Type: mt.Condition, Status: corev1.ConditionUnknown, Reason: reason, Message: message}
	if err := apiretry.Do(ctx, func(ctx context.Context) error { return nodecondition.Set(ctx, client, node, c) }); err != nil {
		return fmt.Errorf("node %s: condition %s=Unknown (%s): %w", node, mt.Condition, reason, err)
	}
	return nil
}

// label is the change that puts the opt-out label on the node.
func (mt Maintenance) label() change {
	return pure(func(n *corev1.Node) nodestate.Patch {
		return nodestate.BeginMaintenanceLabel(n, mt.LabelKey, mt.LabelValue)
	})
}
