// Package schedule answers "may this pod template run on this node" with the scheduler's own helpers: required
// node affinity and node selector (component-helpers nodeaffinity) and NoSchedule/NoExecute taints. The
// DaemonSet controller asks the same questions, so a node this package accepts is a node a DaemonSet fills.
package schedule

import (
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Fits reports whether a pod with this spec may run on node: its required node affinity and node selector match,
// and it tolerates every NoSchedule/NoExecute taint.
func Fits(spec *corev1.PodSpec, node *corev1.Node) (bool, error) {
	pod := &corev1.Pod{Spec: *spec}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node)
	if err != nil || !ok {
		return false, err
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, spec.Tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
	return !untolerated, nil
}

// Selects reports whether a node selector (OR'ed terms of matchExpressions / matchFields) matches node; an empty
// selector matches nothing, as in the API.
func Selects(sel *corev1.NodeSelector, node *corev1.Node) (bool, error) {
	if sel == nil || len(sel.NodeSelectorTerms) == 0 {
		return false, nil
	}
	ns, err := nodeaffinity.NewNodeSelector(sel)
	if err != nil {
		return false, err
	}
	return ns.Match(node), nil
}
