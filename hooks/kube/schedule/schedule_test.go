package schedule

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A cordoned node carries the unschedulable taint: an ordinary pod does not fit, a DaemonSet's pod does (the
// controller adds the toleration); a taint the template does not tolerate keeps both off.
func TestFitsDaemonSetToleratesWhatTheControllerAdds(t *testing.T) {
	spec := &corev1.PodSpec{}
	cordoned := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Unschedulable: true,
		Taints: []corev1.Taint{{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}}}}
	if ok, err := Fits(spec, cordoned); err != nil || ok {
		t.Errorf("Fits on a cordoned node = %v, %v; want false", ok, err)
	}
	if ok, err := FitsDaemonSet(spec, cordoned); err != nil || !ok {
		t.Errorf("FitsDaemonSet on a cordoned node = %v, %v; want true", ok, err)
	}
	if len(spec.Tolerations) != 0 {
		t.Errorf("FitsDaemonSet changed the template's tolerations: %v", spec.Tolerations)
	}
	tainted := cordoned.DeepCopy()
	tainted.Spec.Taints = append(tainted.Spec.Taints, corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule})
	if ok, err := FitsDaemonSet(spec, tainted); err != nil || ok {
		t.Errorf("FitsDaemonSet with an untolerated taint = %v, %v; want false", ok, err)
	}
	network := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule}}}}
	if ok, _ := FitsDaemonSet(spec, network); ok {
		t.Error("a pod without hostNetwork fits a network-unavailable node")
	}
	if ok, _ := FitsDaemonSet(&corev1.PodSpec{HostNetwork: true}, network); !ok {
		t.Error("a hostNetwork DaemonSet pod does not fit a network-unavailable node")
	}
}
