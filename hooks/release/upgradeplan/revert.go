package upgradeplan

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

// keepReverts keeps, before the release changes any driver DaemonSet, a revert DaemonSet of each driver DaemonSet
// as it is now (package revertset) when its driver is one the DaemonSet's nodes may have to go back to
// (Plan.Reverts), and deletes the revert DaemonSets no node needs: none of those drivers, and no node labelled for
// it. A node whose new driver then never validates goes back, by itself, to the one that last validated on it.
func keepReverts(ctx context.Context, o Options, plan *Plan, out io.Writer) error {
	needed := map[string]bool{} // "<driver DaemonSet>/<digest>"
	for _, name := range slices.Sorted(maps.Keys(plan.Reverts)) {
		need := plan.Reverts[name]
		for _, d := range need.Digests {
			needed[name+"/"+d] = true
		}
		ds, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSet, error) {
			return o.Client.AppsV1().DaemonSets(o.Namespace).Get(ctx, name, metav1.GetOptions{})
		})
		if apierrors.IsNotFound(err) {
			continue // new with this release: nothing runs it yet
		}
		if err != nil {
			return fmt.Errorf("read the driver DaemonSet %s/%s to keep a copy to revert to: %w", o.Namespace, name, err)
		}
		current := PodDigest(&corev1.Pod{Spec: ds.Spec.Template.Spec})
		if current == "" || current == need.Target || !slices.Contains(need.Digests, current) {
			continue // no node may go back to what it installs now
		}
		copyName, err := revertset.Ensure(ctx, o.Client, ds, current)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "pre-upgrade: %s keeps driver config %s: a node of %s whose new driver does not validate goes back to it\n",
			copyName, nodestate.ShortDigest(current), name)
	}
	labelled, err := revertLabels(ctx, o)
	if err != nil {
		return err
	}
	gone, err := revertset.Collect(ctx, o.Client, o.Namespace, func(r *appsv1.DaemonSet) bool {
		digest := r.Annotations[revertset.DigestAnnotation]
		return needed[r.Annotations[revertset.OfAnnotation]+"/"+digest] || labelled[nodestate.ShortDigest(digest)]
	})
	for _, name := range gone {
		fmt.Fprintf(out, "pre-upgrade: revert DaemonSet %s removed: no node needs it\n", name)
	}
	return err
}

// revertLabels are the nodestate.RevertLabel values on the nodes: the revert DaemonSets in use.
func revertLabels(ctx context.Context, o Options) (map[string]bool, error) {
	nodes, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.NodeList, error) {
		return o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodestate.RevertLabel})
	})
	if err != nil {
		return nil, fmt.Errorf("list the nodes under a revert DaemonSet: %w", err)
	}
	out := map[string]bool{}
	for _, n := range nodes.Items {
		out[n.Labels[nodestate.RevertLabel]] = true
	}
	return out, nil
}

// RevertNeed is what a driver DaemonSet's nodes may go back to.
type RevertNeed struct {
	// Target is the driver config the release gives the DaemonSet.
	Target string
	// Digests are the driver configs its nodes still changing to Target may go back to: what they run now, and
	// what last validated on them.
	Digests []string
}

// add counts one node of the DaemonSet, whose pod runs driver config from: a node changing to target (its pod
// runs another driver, or its change to it has not validated yet) may go back.
func (r RevertNeed) add(target, from string, node *corev1.Node) RevertNeed {
	r.Target = target
	done := node.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeDone) || node.Labels[nodestate.UpgradeStateLabel] == ""
	if from == target && done {
		return r
	}
	for _, d := range []string{from, node.Annotations[nodestate.ValidatedDigestAnnotation]} {
		if d != "" && d != target && !slices.Contains(r.Digests, d) {
			r.Digests = append(r.Digests, d)
		}
	}
	return r
}
