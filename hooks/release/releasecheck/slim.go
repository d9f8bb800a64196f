package releasecheck

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// slim drops, before an object enters the watches' caches, what Evaluate never reads: every object's managed
// fields, a pod's spec but its node, its containers' names and images and its init containers' names and restart
// policies, a node's image list and a revision's template. On
// 1,000 nodes the pods' specs and the managed fields are most of what the gate would hold.
func slim(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		inits := make([]corev1.Container, len(o.Spec.InitContainers))
		for i, c := range o.Spec.InitContainers {
			inits[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy} // a native sidecar's runs on
		}
		// the containers' names and images stay: a driver pod's image is the driver it runs (the fleet view's)
		cs := make([]corev1.Container, len(o.Spec.Containers))
		for i, c := range o.Spec.Containers {
			cs[i] = corev1.Container{Name: c.Name, Image: c.Image}
		}
		o.Spec = corev1.PodSpec{NodeName: o.Spec.NodeName, InitContainers: inits, Containers: cs}
	case *corev1.Node:
		o.Status.Images = nil
	case *appsv1.ControllerRevision:
		o.Data = runtime.RawExtension{}
	}
	return obj, nil
}
