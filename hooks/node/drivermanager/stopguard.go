package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kwait "k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/statusfiles"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// A driver pod is also deleted outside the gate's own replacement: `kubectl delete pod`, a node moved to another
// pool (its DaemonSet no longer selects it), a pool renamed (its DaemonSet replaced). The upstream driver's stop
// would then stop the fabric manager and the persistence daemon under running GPU jobs. So the driver container's
// preStop waits for the gate's StopFile, and the gate, stopped with its pod, writes it only once the node was
// emptied as for a driver change (its pool's turn and slot, cordon, evictions, operands paused), leaving it to the
// DaemonSet's next pod on the node. With no driver DaemonSet of the release left for the node (an uninstall, the
// node taken out of every driver pool) nothing will take the node over: the driver stops at once, as before.

// stopMargin is kept from the pod's grace period for the driver container's own stop (its unload) after the file.
const stopMargin = 10 * time.Second

// letDriverStop is the gate's last act when its pod stops (ctx ended): it decides whether the node must be emptied
// before the driver container's stop, empties it within the pod's grace period, and then writes StopFile. A pod
// that is not being deleted (only this container stops) writes nothing: its driver runs on.
func (o *UncordonOptions) letDriverStop(ctx context.Context, base *slog.Logger, out io.Writer) error {
	ctx = context.WithoutCancel(ctx)
	log := base.With("node", o.NodeName)
	rctx, cancelRead := context.WithTimeout(ctx, 20*time.Second)
	pod, err := o.ownPod(rctx)
	cancelRead()
	var gone *podGoneError
	switch {
	case errors.As(err, &gone):
		return o.writeStopFile("its pod is gone")
	case err != nil:
		// nothing is known: the preStop holds the driver until the grace period ends, as without a gate
		return fmt.Errorf("the driver pod stops, but reading it failed, so the node was not emptied first: %w", err)
	case pod.DeletionTimestamp == nil:
		return nil
	}
	deadline := pod.DeletionTimestamp.Add(-stopMargin)
	if min := time.Now().Add(time.Second); deadline.Before(min) {
		deadline = min
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	why, err := o.emptyBeforeStop(dctx, base, out, pod)
	if err != nil {
		log.Error("the driver pod is being deleted and its node could not be emptied first: its GPU pods lose the driver's daemons when it stops",
			"err", err, "pod", pod.Name)
		why = fmt.Sprintf("the node could not be emptied first (%v)", err)
	}
	return o.writeStopFile(why)
}

// emptyBeforeStop empties the node for the DaemonSet that runs the next driver pod on it, and says why the driver
// may now stop. A node moved to another pool while it waits for its turn (moved back, say, within seconds) is
// emptied for the pool it is in when its turn comes: under the pool it left it went out beyond its own pool's bound.
func (o *UncordonOptions) emptyBeforeStop(ctx context.Context, base *slog.Logger, out io.Writer, pod *corev1.Pod) (string, error) {
	for {
		node, err := o.nodeBack(ctx, base)
		if err != nil {
			return "", err
		}
		why, err := o.emptyForNext(ctx, base, out, pod, node)
		if !errors.Is(err, errNoLongerOutdated) {
			return why, err
		}
		base.With("node", o.NodeName).Info("the node moved to another driver DaemonSet while it waited for its turn: emptying it for that one instead")
	}
}

// emptyForNext is emptyBeforeStop for the node as read: errNoLongerOutdated when another DaemonSet than the one it
// found takes the node over by the node's turn.
func (o *UncordonOptions) emptyForNext(ctx context.Context, base *slog.Logger, out io.Writer, pod *corev1.Pod, node *corev1.Node) (string, error) {
	if nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel]) == nodestate.PodRestartRequired {
		return "its node is emptied (" + nodestate.UpgradeStateLabel + "=" + string(nodestate.PodRestartRequired) + ")", nil
	}
	next, err := o.nextDriverDaemonSet(ctx, pod, node)
	if err != nil {
		return "", err
	}
	if _, labelled := node.Labels[nodestate.RevertLabel]; next == nil && labelled {
		// a reverted node whose revert DaemonSet let go of it (the node moved to another pool, the DaemonSet went
		// with its pool's renamed one): without the label its pool's driver DaemonSet takes it over
		unlabelled := node.DeepCopy()
		delete(unlabelled.Labels, nodestate.RevertLabel)
		if next, err = o.nextDriverDaemonSet(ctx, pod, unlabelled); err != nil {
			return "", err
		}
		if next != nil {
			if node, err = nodestate.Update(ctx, o.Client, o.NodeName, func(n *corev1.Node) (nodestate.Patch, error) {
				return nodestate.EndRevert(n), nil
			}); err != nil {
				return "", err
			}
			base.With("node", o.NodeName).Info("the revert DaemonSet let go of the node: it goes back to its driver DaemonSet", "next", next.Name)
		}
	}
	if next == nil {
		return "no driver DaemonSet of the release runs on the node any more (an uninstall, or the node left every driver pool): nothing to empty it for", nil
	}
	why := "its driver pod " + pod.Name + " is being deleted"
	// still the DaemonSet that takes the node over, as its labels are now (a fresh read)
	stillNext := func(ctx context.Context, _ bool) string {
		fresh, err := nodestate.Get(ctx, o.Client, o.NodeName)
		if err != nil {
			return why // unreadable: the emptying goes on for the DaemonSet it found, as before its turn
		}
		now, err := o.nextDriverDaemonSet(ctx, pod, fresh)
		if err == nil && (now == nil || now.UID != next.UID) {
			return ""
		}
		return why
	}
	if o.ManagerOptions == nil {
		return "", errors.New("no driver-manager settings reader: cannot empty the node")
	}
	mo, err := o.ManagerOptions(templateEnv(pod, &next.Spec.Template))
	if err != nil {
		return "", fmt.Errorf("the driver DaemonSet %s's driver-manager settings: %w", next.Name, err)
	}
	mo.Client, mo.Log, mo.Now, mo.Lease.Identity = o.Client, base, o.Now, pod.Name
	// the node goes under the pool of the DaemonSet that takes it over, its own or another (the node moved): its
	// plan's mark as the other nodes of that DaemonSet carry it, or without one one node of that DaemonSet at a time
	mo.NodeName, mo.Namespace, mo.Stopping, mo.PoolDaemonSet = o.NodeName, o.Namespace, true, next
	mo.Complete()
	if err := errors.Join(append(scopeErrors(mo.Client, mo.NodeName, mo.Namespace), mo.Lease.validate())...); err != nil {
		return "", err
	}
	base.With("node", o.NodeName).Info("the driver pod is being deleted while its node has a driver DaemonSet: emptying the node before the driver stops",
		"pod", pod.Name, "next", next.Name, "deadline", deadlineOf(ctx))
	if err := mo.empty(ctx, base, out, next.Name, why, stillNext); err != nil {
		return "", err
	}
	fmt.Fprintf(out, "node %s emptied before its driver pod %s stops; the DaemonSet %s's next pod takes the node over\n", o.NodeName, pod.Name, next.Name)
	return "its node is emptied for " + next.Name + "'s next pod", nil
}

// nodeGoneWait bounds nodeBack's wait: past it the pod garbage collector has deleted the gone node's pods (after
// 40 s), this one with no grace period, and the driver stops whatever the gate does.
const nodeGoneWait = 90 * time.Second

// nodeBack reads the node; while its Node object is gone (deleted, registered again next) it waits for it, up to
// nodeGoneWait within ctx's deadline: the registered Node takes pods at once, a GPU pod among them, which must go
// before the driver stops. A Node that does not come back takes no pod: the driver may stop.
func (o *UncordonOptions) nodeBack(ctx context.Context, base *slog.Logger) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, nodeGoneWait)
	defer cancel()
	var node *corev1.Node
	logged := false
	err := kwait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		n, err := nodestate.Get(ctx, o.Client, o.NodeName)
		if apierrors.IsNotFound(err) {
			if !logged {
				base.With("node", o.NodeName).Info("the Node object is gone: waiting for it to register again before the driver stops")
				logged = true
			}
			return false, nil
		}
		node = n
		return err == nil, err
	})
	if node == nil && err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("its Node object is gone and was not registered again within %s or the pod's grace period: %w", nodeGoneWait, context.Cause(ctx))
	}
	return node, err
}

// nextDriverDaemonSet is the driver DaemonSet of the release that runs a pod on node after pod: the pod's own while
// it still selects the node, else another one (same namespace and component, a driver-manager init container, not
// being deleted) that does; nil when none does.
func (o *UncordonOptions) nextDriverDaemonSet(ctx context.Context, pod *corev1.Pod, node *corev1.Node) (*appsv1.DaemonSet, error) {
	dss, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSetList, error) {
		return o.Client.AppsV1().DaemonSets(o.Namespace).List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("list the driver DaemonSets in %s: %w", o.Namespace, err)
	}
	var own types.UID
	if c := metav1.GetControllerOf(pod); c != nil {
		own = c.UID
	}
	var next *appsv1.DaemonSet
	for i := range dss.Items {
		ds := &dss.Items[i]
		// a driver pod's node is taken over by a driver DaemonSet only: a node that leaves the driver for another
		// role (vm-passthrough, whose VFIO manager also runs the driver manager) stops its driver at once, as before
		if ds.DeletionTimestamp != nil || upgradeplan.ManagerContainer(ds.Spec.Template.Spec.InitContainers) == nil ||
			ds.Spec.Template.Labels[ComponentLabel] != pod.Labels[ComponentLabel] {
			continue
		}
		fits, err := schedule.FitsDaemonSet(&ds.Spec.Template.Spec, node)
		if err != nil {
			return nil, fmt.Errorf("does DaemonSet %s run on node %s: %w", ds.Name, node.Name, err)
		}
		if !fits {
			continue
		}
		if ds.UID == own {
			return ds, nil
		}
		if next == nil {
			next = ds
		}
	}
	return next, nil
}

// writeStopFile lets the driver container's preStop end.
func (o *UncordonOptions) writeStopFile(why string) error {
	if err := statusfiles.Write(filepath.Dir(o.StopFile), filepath.Base(o.StopFile), []byte(why+"\n")); err != nil {
		return fmt.Errorf("write the driver's stop file %s: %w", o.StopFile, err)
	}
	return nil
}

// podGoneError: the gate's own pod is no longer on the API server.
type podGoneError struct{ error }

func deadlineOf(ctx context.Context) string {
	if d, ok := ctx.Deadline(); ok {
		return d.UTC().Format(time.RFC3339)
	}
	return "none"
}

// waitForOlderDriverPods holds a new driver pod's manager while a driver pod that came to the node before it (of
// its own DaemonSet after `kubectl delete pod`, of another after a pool change) is still there: that pod's gate
// empties the node and its driver unloads as it stops, and the two must not act on the node at once. Older is
// earlier created (by name within the same second), or being deleted. A run outside a pod (no such pod on the
// node) does not wait.
func (o *Options) waitForOlderDriverPods(ctx context.Context, log *slog.Logger) error {
	pods, err := kwatch.Start(ctx, kwatch.NodePods(o.Client, o.Namespace, o.NodeName, ""), &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watch the driver pods on node %s: %w", o.NodeName, err)
	}
	shown := ""
	return kwatch.Until(ctx, pods, func(ps []*corev1.Pod) (bool, error) {
		var self *corev1.Pod
		for _, p := range ps {
			if p.Name == o.Lease.Identity {
				self = p
			}
		}
		if self == nil {
			return true, nil
		}
		for _, p := range ps {
			if p.UID == self.UID || !isDriverPod(p) || !olderThan(p, self) {
				continue
			}
			if shown != p.Name {
				log.Info("another driver pod is still on the node: waiting for it to stop (its gate empties the node, its driver unloads)",
					"node", o.NodeName, "pod", p.Name, "deleting", p.DeletionTimestamp != nil)
				shown = p.Name
			}
			return false, nil
		}
		return true, nil
	})
}

// isDriverPod: a DaemonSet's pod that runs the driver manager (a driver or vGPU manager pod).
func isDriverPod(p *corev1.Pod) bool {
	owner := metav1.GetControllerOf(p)
	return owner != nil && owner.Kind == "DaemonSet" && upgradeplan.ManagerContainer(p.Spec.InitContainers) != nil
}

// olderThan orders two driver pods of one node: a deleting one first, then by creation, then by name.
func olderThan(p, self *corev1.Pod) bool {
	if (p.DeletionTimestamp != nil) != (self.DeletionTimestamp != nil) {
		return p.DeletionTimestamp != nil
	}
	if !p.CreationTimestamp.Equal(&self.CreationTimestamp) {
		return p.CreationTimestamp.Before(&self.CreationTimestamp)
	}
	return p.Name < self.Name
}
