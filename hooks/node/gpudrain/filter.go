package gpudrain

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubectl/pkg/drain"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
)

// gpuUsers chooses the pods that use NVIDIA GPUs (gpupods' definition, shared with the pre-upgrade plan).
type gpuUsers struct {
	ctx     context.Context
	checker *gpupods.Checker
}

// filter keeps GPU users and skips every other pod.
func (g *gpuUsers) filter(pod corev1.Pod) drain.PodDeleteStatus {
	var ok bool
	err := apiretry.Do(g.ctx, func(ctx context.Context) error { // its claim list: an error that may pass is retried
		var err error
		ok, err = g.checker.Uses(ctx, &pod)
		return err
	})
	switch {
	case err != nil:
		return drain.MakePodDeleteStatusWithError(err.Error())
	case ok:
		return drain.MakePodDeleteStatusOkay()
	}
	return drain.MakePodDeleteStatusSkip()
}

// The library's own messages for these cases name --force and --delete-emptydir-data; the driver manager's
// switches are values, so say those.
const (
	unmanagedFatal    = "GPU pods not managed by a controller (nothing would recreate them; set force to delete them anyway)"
	orphanedFatal     = "GPU pods of a DaemonSet that no longer exists (set force to delete them anyway)"
	localStorageFatal = "GPU pods with local storage (emptyDir; set deleteEmptyDir to evict them anyway, losing that data)"
)

// policy applies force and deleteEmptyDir to the GPU pods only. In GPU mode the library's filters run with both
// allowed, so a pod we never touch (an unmanaged non-GPU pod) cannot fail the eviction; this puts the same rules
// back for the pods we do evict.
func policy(force, deleteEmptyDir bool) drain.PodFilter {
	return func(pod corev1.Pod) drain.PodDeleteStatus {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return drain.MakePodDeleteStatusOkay()
		}
		if !deleteEmptyDir {
			for _, v := range pod.Spec.Volumes {
				if v.EmptyDir != nil {
					return drain.MakePodDeleteStatusWithError(localStorageFatal)
				}
			}
		}
		if !force {
			ref := metav1.GetControllerOf(&pod)
			if ref == nil {
				return drain.MakePodDeleteStatusWithError(unmanagedFatal)
			}
			if ref.Kind == "DaemonSet" && ref.APIVersion == "apps/v1" {
				// a live DaemonSet's pod was skipped by the library's filter; this one's DaemonSet is gone
				return drain.MakePodDeleteStatusWithError(orphanedFatal)
			}
		}
		return drain.MakePodDeleteStatusOkay()
	}
}
