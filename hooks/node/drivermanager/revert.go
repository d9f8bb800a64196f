package drivermanager

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

// revert is the gate's answer to a new driver that did not validate (reason): the node goes back to the driver that
// last validated on it (nodestate.ValidatedDigestAnnotation), by the revert DaemonSet the pre-upgrade plan kept of its
// driver DaemonSet with that driver (package revertset). In one write, while the node still waits for validation, it
// labels the node for that DaemonSet and records why (nodestate.RevertedAnnotation: the node counts as failed for its
// pool from then on, canary.Decide); the node stays validation-required, cordoned, holding its slot. The driver
// DaemonSet no longer selects the node and deletes this pod, whose stop (letDriverStop) empties the node for the
// revert DaemonSet before the new driver stops: a GPU pod that tolerates the cordon may have come while the node
// waited for validation, with the device plugin back. The revert DaemonSet's pod then installs the old driver, and
// its gate uncordons the node only once that validated.
//
// It says whether it reverted, and if not why not ("" when nothing could have been reverted to).
func (o *UncordonOptions) revert(ctx context.Context, log *slog.Logger, reason string) (bool, string) {
	if !o.Replace || o.PodName == "" {
		return false, ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	pod, err := o.ownPod(ctx)
	if err != nil {
		return false, fmt.Sprintf("reading the driver pod failed: %v", err)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		return false, ""
	}
	node, err := nodestate.Get(ctx, o.Client, o.NodeName)
	if err != nil {
		return false, fmt.Sprintf("reading the node failed: %v", err)
	}
	from, to := upgradeplan.PodDigest(pod), node.Annotations[nodestate.ValidatedDigestAnnotation]
	if to == "" || to == from {
		return false, "no other driver validated on the node before"
	}
	ds, err := revertset.Find(ctx, o.Client, o.Namespace, owner.Name, to)
	if err != nil {
		return false, err.Error()
	}
	if ds == nil {
		return false, fmt.Sprintf("no revert DaemonSet of %s installs driver config %s, the last that validated here (the pool's upgradePolicy.revert is off, or the plan did not run)",
			owner.Name, nodestate.ShortDigest(to))
	}
	now := o.Now().UTC().Format(time.RFC3339)
	started := false
	_, err = nodestate.Update(ctx, o.Client, o.NodeName, func(n *corev1.Node) (nodestate.Patch, error) {
		if nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) != nodestate.ValidationRequired {
			return nodestate.Patch{}, nil // moved on meanwhile (an admin, a newer plan): theirs to decide
		}
		started = true
		why := fmt.Sprintf("reverting to driver config %s (DaemonSet %s): %s", nodestate.ShortDigest(to), ds.Name, reason)
		return nodestate.Merge(nodestate.SetUpgradeState(n, nodestate.ValidationRequired, why, now),
			nodestate.StartRevert(n, nodestate.Revert{From: from, To: to, DaemonSet: ds.Name, Reason: reason, At: now})), nil
	})
	if err != nil {
		return false, fmt.Sprintf("labelling the node for %s failed: %v", ds.Name, err)
	}
	if !started {
		return false, "the node left validation-required meanwhile"
	}
	log.Info("the new driver did not validate: reverting the node to the driver that last validated on it",
		"failed", nodestate.ShortDigest(from), "to", nodestate.ShortDigest(to), "daemonSet", ds.Name, "label", nodestate.RevertLabel)
	return true, ""
}

// beingReverted says whether the node is going back from this pod's driver (the gate reverted it, and was restarted
// since): there is nothing left to validate, only the pod's stop to wait for.
func (o *UncordonOptions) beingReverted(ctx context.Context, node *corev1.Node) bool {
	r, err := nodestate.ReadRevert(node)
	if err != nil || r == nil || !nodestate.Reverted(node) || !o.Replace || o.PodName == "" {
		return false
	}
	pod, err := o.ownPod(ctx)
	return err == nil && upgradeplan.PodDigest(pod) == r.From
}
