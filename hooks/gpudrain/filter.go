package gpudrain

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"
)

// What makes a pod a GPU user.
const (
	// GPUResourcePrefix prefixes the device plugin's GPU resources (nvidia.com/gpu, nvidia.com/gpu.shared).
	GPUResourcePrefix = "nvidia.com/gpu"
	// MIGResourcePrefix prefixes the device plugin's MIG resources (nvidia.com/mig-1g.10gb, ...).
	MIGResourcePrefix = "nvidia.com/mig-"
	// DRADriver is the DRA driver whose allocated claims are NVIDIA GPUs.
	DRADriver = "gpu.nvidia.com"
)

// RequestsGPU reports whether a container or the pod itself requests or limits an NVIDIA GPU or MIG resource.
func RequestsGPU(pod *corev1.Pod) bool {
	lists := []corev1.ResourceList{}
	if r := pod.Spec.Resources; r != nil {
		lists = append(lists, r.Requests, r.Limits)
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			lists = append(lists, c.Resources.Requests, c.Resources.Limits)
		}
	}
	for _, l := range lists {
		for name := range l {
			if strings.HasPrefix(string(name), GPUResourcePrefix) || strings.HasPrefix(string(name), MIGResourcePrefix) {
				return true
			}
		}
	}
	return false
}

// ClaimNames returns the names of the ResourceClaims the pod uses (its own and generated from templates, as the
// pod status reports them, and the claim behind DRA-backed extended resources).
func ClaimNames(pod *corev1.Pod) []string {
	generated := map[string]*string{}
	for _, s := range pod.Status.ResourceClaimStatuses {
		generated[s.Name] = s.ResourceClaimName
	}
	var names []string
	for _, c := range pod.Spec.ResourceClaims {
		switch {
		case c.ResourceClaimName != nil:
			names = append(names, *c.ResourceClaimName)
		case generated[c.Name] != nil:
			names = append(names, *generated[c.Name])
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		names = append(names, s.ResourceClaimName)
	}
	return names
}

// AllocatedByGPUDriver reports whether the claim's allocation holds a device of DRADriver.
func AllocatedByGPUDriver(claim *resourcev1.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == DRADriver {
			return true
		}
	}
	return false
}

// gpuUsers decides which pods use NVIDIA GPUs. Claims are listed once per namespace, and only for namespaces
// with a pod that has claims, so a node without DRA costs no request.
type gpuUsers struct {
	ctx    context.Context
	client kubernetes.Interface
	mu     sync.Mutex
	claims map[string]map[string]*resourcev1.ResourceClaim // namespace -> name -> claim
}

func (g *gpuUsers) uses(pod *corev1.Pod) (bool, error) {
	if RequestsGPU(pod) {
		return true, nil
	}
	for _, name := range ClaimNames(pod) {
		claims, err := g.namespaceClaims(pod.Namespace)
		if err != nil {
			return false, err
		}
		if c := claims[name]; c != nil && AllocatedByGPUDriver(c) {
			return true, nil
		}
	}
	return false, nil
}

func (g *gpuUsers) namespaceClaims(ns string) (map[string]*resourcev1.ResourceClaim, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c, ok := g.claims[ns]; ok {
		return c, nil
	}
	list, err := g.client.ResourceV1().ResourceClaims(ns).List(g.ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		list, err = &resourcev1.ResourceClaimList{}, nil // DRA not served: no claims
	}
	if err != nil {
		return nil, fmt.Errorf("list resource claims in namespace %s: %w", ns, err)
	}
	m := map[string]*resourcev1.ResourceClaim{}
	for i := range list.Items {
		m[list.Items[i].Name] = &list.Items[i]
	}
	if g.claims == nil {
		g.claims = map[string]map[string]*resourcev1.ResourceClaim{}
	}
	g.claims[ns] = m
	return m, nil
}

// filter keeps GPU users and skips every other pod.
func (g *gpuUsers) filter(pod corev1.Pod) drain.PodDeleteStatus {
	ok, err := g.uses(&pod)
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
