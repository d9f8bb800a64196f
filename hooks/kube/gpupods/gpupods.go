// Package gpupods is the one definition of a "GPU pod": a pod that uses NVIDIA GPUs through the device plugin
// (nvidia.com/gpu* or nvidia.com/mig-* requests or limits, on a container or the pod itself) or through DRA (a
// resource claim allocated by gpu.nvidia.com). The drain, the pre-upgrade plan and the validator use it, so what
// one evicts, the other counts.
package gpupods

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
)

// What makes a pod a GPU user.
const (
	// GPUResource is the device plugin's resource with MIG strategy single or none.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	// GPUResourcePrefix prefixes the device plugin's GPU resources (nvidia.com/gpu, nvidia.com/gpu.shared).
	GPUResourcePrefix = "nvidia.com/gpu"
	// MIGResourcePrefix prefixes the device plugin's MIG resources with MIG strategy mixed (nvidia.com/mig-1g.10gb).
	MIGResourcePrefix = "nvidia.com/mig-"
	// DRADriver is the DRA driver whose allocated claims are NVIDIA GPUs.
	DRADriver = "gpu.nvidia.com"
)

// IsGPUResource reports whether name is one of the device plugin's GPU or MIG resources.
func IsGPUResource(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), GPUResourcePrefix) || strings.HasPrefix(string(name), MIGResourcePrefix)
}

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
			if IsGPUResource(name) {
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

// Checker decides which pods use NVIDIA GPUs. Claims are listed once per namespace, and only for namespaces with a
// pod that has claims, so a cluster without DRA costs no request. Its ServiceAccount needs `list` on
// resource.k8s.io resourceclaims in those namespaces. Safe for concurrent use.
type Checker struct {
	// Client lists the resource claims.
	Client kubernetes.Interface

	mu     sync.Mutex
	claims map[string]map[string]*resourcev1.ResourceClaim // namespace -> name -> claim
}

// Uses reports whether pod uses an NVIDIA GPU: through the device plugin's resources, or a resource claim
// allocated by DRADriver.
func (c *Checker) Uses(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if RequestsGPU(pod) {
		return true, nil
	}
	for _, name := range ClaimNames(pod) {
		claims, err := c.namespaceClaims(ctx, pod.Namespace)
		if err != nil {
			return false, err
		}
		if cl := claims[name]; cl != nil && AllocatedByGPUDriver(cl) {
			return true, nil
		}
	}
	return false, nil
}

// NewOffline returns a Checker that reads no API: the resource claims it knows are claims (from files); a claim it
// was not given is not allocated.
func NewOffline(claims []resourcev1.ResourceClaim) *Checker {
	c := &Checker{claims: map[string]map[string]*resourcev1.ResourceClaim{}}
	for i := range claims {
		cl := &claims[i]
		if c.claims[cl.Namespace] == nil {
			c.claims[cl.Namespace] = map[string]*resourcev1.ResourceClaim{}
		}
		c.claims[cl.Namespace][cl.Name] = cl
	}
	return c
}

func (c *Checker) namespaceClaims(ctx context.Context, ns string) (map[string]*resourcev1.ResourceClaim, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.claims[ns]; ok || c.Client == nil {
		return m, nil
	}
	list, err := c.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
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
	if c.claims == nil {
		c.claims = map[string]map[string]*resourcev1.ResourceClaim{}
	}
	c.claims[ns] = m
	return m, nil
}

// HoldsGPUClaim reports whether pod holds a resource claim allocated by DRADriver (its device plugin resources do
// not count): while it does, the DRA kubelet plugin that prepared the claim must stay.
func (c *Checker) HoldsGPUClaim(ctx context.Context, pod *corev1.Pod) (bool, error) {
	for _, name := range ClaimNames(pod) {
		claims, err := c.namespaceClaims(ctx, pod.Namespace)
		if err != nil {
			return false, err
		}
		if cl := claims[name]; cl != nil && AllocatedByGPUDriver(cl) {
			return true, nil
		}
	}
	return false, nil
}

// ClaimHolders names (namespace/name) the pods on node that hold a claim allocated by DRADriver, terminating ones
// included (their devices stay prepared until they are gone); finished pods hold nothing. The reference driver
// manager refuses to stop the DRA kubelet plugin while any is left.
func ClaimHolders(ctx context.Context, client kubernetes.Interface, node string) ([]string, error) {
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("list the pods on node %s: %w", node, err)
	}
	c := &Checker{Client: client}
	var out []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ok, err := c.HoldsGPUClaim(ctx, p)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	return out, nil
}
