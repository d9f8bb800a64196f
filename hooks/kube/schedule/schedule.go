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
	return NewFitter(spec).Fits(node)
}

// Fitter is Fits for one pod spec with its node selection parsed once, to match it against many nodes.
type Fitter struct {
	affinity    nodeaffinity.RequiredNodeAffinity
	tolerations []corev1.Toleration
}

// NewFitter parses spec's node selection.
func NewFitter(spec *corev1.PodSpec) *Fitter {
	return &Fitter{affinity: nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: *spec}), tolerations: spec.Tolerations}
}

// Fits reports whether the pod may run on node (see Fits).
func (f *Fitter) Fits(node *corev1.Node) (bool, error) {
	ok, err := f.affinity.Match(node)
	if err != nil || !ok {
		return false, err
	}
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, f.tolerations,
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

// daemonSetTolerations are the tolerations the DaemonSet controller adds to every pod it creates, so its pods stay
// on cordoned, pressured and unreachable nodes (k8s.io/kubernetes pkg/controller/daemon/util; hostNetwork pods also
// tolerate network-unavailable).
func daemonSetTolerations(spec *corev1.PodSpec) []corev1.Toleration {
	exists := func(key string, effect corev1.TaintEffect) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: effect}
	}
	out := []corev1.Toleration{
		exists(corev1.TaintNodeNotReady, corev1.TaintEffectNoExecute),
		exists(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute),
		exists(corev1.TaintNodeDiskPressure, corev1.TaintEffectNoSchedule),
		exists(corev1.TaintNodeMemoryPressure, corev1.TaintEffectNoSchedule),
		exists(corev1.TaintNodePIDPressure, corev1.TaintEffectNoSchedule),
		exists(corev1.TaintNodeUnschedulable, corev1.TaintEffectNoSchedule),
	}
	if spec.HostNetwork {
		out = append(out, exists(corev1.TaintNodeNetworkUnavailable, corev1.TaintEffectNoSchedule))
	}
	return out
}

// FitsDaemonSet is Fits for a DaemonSet's pod template: the pods the controller creates from it also carry the
// tolerations it adds, so a cordoned node still runs them.
func FitsDaemonSet(template *corev1.PodSpec, node *corev1.Node) (bool, error) {
	return NewDaemonSetFitter(template).Fits(node)
}

// NewDaemonSetFitter is NewFitter for a DaemonSet's pod template (see FitsDaemonSet).
func NewDaemonSetFitter(template *corev1.PodSpec) *Fitter {
	spec := *template
	spec.Tolerations = append(append([]corev1.Toleration{}, template.Tolerations...), daemonSetTolerations(template)...)
	return NewFitter(&spec)
}
