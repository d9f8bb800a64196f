package drivermanager

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// A node's pool, when its own plan mark does not say it: the plan marks the nodes it reads, but a node registered
// again, added to its pool after the plan, or moved to another pool carries no mark of its pool. The other nodes of
// its driver pod's DaemonSet (every DaemonSet serves one pool) carry their pool's plan.

// inheritMark gives a node that no plan marked (registered again after its Node object was deleted, or added to
// the pool after the plan) the latest mark on the other nodes of its driver pod's DaemonSet, and marks it
// upgrade-required under it: its change then waits for its pool's canary, failure threshold and slots as the
// planned nodes' do, instead of going at once outside the pool's bound. No sibling mark (no plan ever ran for the
// pool, or the pod is not a DaemonSet's): nil, and the change goes as before.
func (m *manager) inheritMark(ctx context.Context) (*canary.Mark, error) {
	latest, ds, err := m.siblingMark(ctx)
	if err != nil || latest == nil {
		return nil, err
	}
	why := fmt.Sprintf("no plan marked the node: it takes pool %s's plan from the other nodes of its DaemonSet %s, and waits for its turn", latest.Pool, ds)
	if err := m.remark(ctx, latest, why); err != nil {
		return nil, err
	}
	m.log.Info("no plan mark on the node: took its pool's from its DaemonSet's other nodes", "pool", latest.Pool, "seq", latest.Seq, "daemonSet", ds)
	return latest, nil
}

// movedPool is the mark of the pool the node belongs to now, when its own mark names another pool and that pool
// holds it at its failure threshold: an admin moved a waiting node to another pool (its new pool's DaemonSet runs
// its driver pod now), and the old pool's failures no longer govern it. nil when the node did not move.
func (m *manager) movedPool(ctx context.Context, mark *canary.Mark) (*canary.Mark, error) {
	latest, ds, err := m.siblingMark(ctx)
	if err != nil || latest == nil || latest.Pool == mark.Pool {
		return nil, err
	}
	why := fmt.Sprintf("moved from pool %s to pool %s (its DaemonSet %s): governed by pool %s's plan, waits for its turn", mark.Pool, latest.Pool, ds, latest.Pool)
	if err := m.remark(ctx, latest, why); err != nil {
		return nil, err
	}
	m.log.Info("the node's mark names another pool than its DaemonSet's other nodes: it follows its new pool's plan", "from", mark.Pool, "to", latest.Pool, "daemonSet", ds)
	return latest, nil
}

// remark marks the node upgrade-required under mark, with why.
func (m *manager) remark(ctx context.Context, mark *canary.Mark, why string) error {
	value := mark.Format()
	return m.apply(ctx, func(n *corev1.Node) (nodestate.Patch, error) {
		return nodestate.Merge(m.setState(n, nodestate.UpgradeRequired, why), nodestate.Patch{Annotations: map[string]*string{canary.MarkAnnotation: &value}}), nil
	})
}

// siblingMark is the latest plan mark (by canary.NotBefore) on the other nodes whose pods its driver pod's
// DaemonSet runs, and that DaemonSet's name; nil when none carries one, or the pod is no DaemonSet's.
func (m *manager) siblingMark(ctx context.Context) (*canary.Mark, string, error) {
	if ds := m.o.PoolDaemonSet; ds != nil {
		return m.markOfPeers(ctx, ds.Name, ds.UID, ds.Spec.Template.Labels)
	}
	pods := m.o.Client.CoreV1().Pods(m.o.Namespace)
	own, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return pods.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", m.o.Lease.Identity).String()})
	})
	if err != nil {
		return nil, "", fmt.Errorf("node %s: read its driver pod %s/%s for its pool's plan: %w", m.o.NodeName, m.o.Namespace, m.o.Lease.Identity, err)
	}
	i := slices.IndexFunc(own.Items, func(p corev1.Pod) bool { return p.Name == m.o.Lease.Identity && p.Spec.NodeName == m.o.NodeName })
	if i < 0 {
		return nil, "", nil // no pod of that name on the node (a run outside a pod): nothing to learn from
	}
	self := &own.Items[i]
	owner := metav1.GetControllerOf(self)
	if owner == nil || owner.Kind != "DaemonSet" {
		return nil, "", nil
	}
	return m.markOfPeers(ctx, owner.Name, owner.UID, self.Labels)
}

// markOfPeers is the latest plan mark on the nodes other than this one that DaemonSet name (uid) runs pods on; its
// pods are found by podLabels (a pod's or the template's: the revision's own labels are left out), then by owner.
func (m *manager) markOfPeers(ctx context.Context, name string, uid types.UID, podLabels map[string]string) (*canary.Mark, string, error) {
	pods := m.o.Client.CoreV1().Pods(m.o.Namespace)
	labels := map[string]string{}
	for k, v := range podLabels {
		if k != appsv1.DefaultDaemonSetUniqueLabelKey && k != "pod-template-generation" {
			labels[k] = v
		}
	}
	var list metav1.ListOptions // no labels (a template without any): every pod of the namespace, then by owner
	if len(labels) > 0 {
		list.LabelSelector = metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: labels})
	}
	siblings, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return pods.List(ctx, list)
	})
	if err != nil {
		return nil, "", fmt.Errorf("node %s: list the pods of its driver DaemonSet %s/%s for its pool's plan: %w", m.o.NodeName, m.o.Namespace, name, err)
	}
	peers := map[string]bool{}
	for _, p := range siblings.Items {
		if c := metav1.GetControllerOf(&p); c != nil && c.UID == uid && p.Spec.NodeName != m.o.NodeName {
			peers[p.Spec.NodeName] = true
		}
	}
	// every planned node carries an upgrade state: one list of those, not a read per peer
	marked, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.NodeList, error) {
		return m.o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodestate.UpgradeStateLabel})
	})
	if err != nil {
		return nil, "", fmt.Errorf("node %s: list the nodes of its pool for its plan: %w", m.o.NodeName, err)
	}
	var latest *canary.Mark
	for i := range marked.Items {
		if !peers[marked.Items[i].Name] {
			continue
		}
		if mk, err := canary.Read(&marked.Items[i]); err == nil && mk != nil && (latest == nil || !canary.NotBefore(latest, mk)) {
			latest = mk
		}
	}
	if latest == nil {
		// a DaemonSet just created (its pool renamed, or renamed back) has no pods on the other nodes yet: the nodes it
		// selects carry the pool's plan; without it the node went alone, outside the pool's bound
		latest = m.markOfSelected(ctx, name, uid, marked.Items)
	}
	return latest, name, nil
}

// markOfSelected is the latest plan mark on the nodes other than this one that DaemonSet name (uid) selects; nil when
// none carries one or the DaemonSet cannot be read (its pods' nodes had none to offer either).
func (m *manager) markOfSelected(ctx context.Context, name string, uid types.UID, marked []corev1.Node) *canary.Mark {
	ds, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSet, error) {
		return m.o.Client.AppsV1().DaemonSets(m.o.Namespace).Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil || ds.UID != uid {
		return nil
	}
	fitter := schedule.NewDaemonSetFitter(&ds.Spec.Template.Spec)
	var latest *canary.Mark
	for i := range marked {
		n := &marked[i]
		if n.Name == m.o.NodeName {
			continue
		}
		if fits, err := fitter.Fits(n); err != nil || !fits {
			continue
		}
		if mk, err := canary.Read(n); err == nil && mk != nil && (latest == nil || !canary.NotBefore(latest, mk)) {
			latest = mk
		}
	}
	return latest
}

// followNewPool re-marks a node, not yet under way, that moved to another pool (Options.PoolDaemonSet: the DaemonSet
// that takes the node over) and still carries its old pool's mark: it waits for its new pool's turn and slot.
func (m *manager) followNewPool(ctx context.Context) error {
	if m.o.PoolDaemonSet == nil || underWay(m.node) {
		return nil
	}
	mark, err := canary.Read(m.node)
	if err != nil || mark == nil {
		return err
	}
	latest, ds, err := m.siblingMark(ctx)
	if err != nil || latest == nil || latest.Pool == mark.Pool {
		return err
	}
	why := fmt.Sprintf("moved from pool %s to pool %s (its DaemonSet %s): emptied under pool %s's plan", mark.Pool, latest.Pool, ds, latest.Pool)
	if err := m.remark(ctx, latest, why); err != nil {
		return err
	}
	m.log.Info("the node moved to another pool: its emptying follows the new pool's plan", "from", mark.Pool, "to", latest.Pool, "daemonSet", ds)
	return nil
}
