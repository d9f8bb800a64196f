package gpupods

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func pod(name string, spec corev1.PodSpec) *corev1.Pod {
	if len(spec.Containers) == 0 {
		spec.Containers = []corev1.Container{{Name: "c"}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}, Spec: spec}
}

func one(name string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceName(name): resource.MustParse("1")}
}

func TestRequestsGPU(t *testing.T) {
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{pod("gpu", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("nvidia.com/gpu")}}}}), true},
		{pod("shared", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("nvidia.com/gpu.shared")}}}}), true},
		{pod("mig", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: one("nvidia.com/mig-1g.10gb")}}}}), true},
		{pod("init", corev1.PodSpec{InitContainers: []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{Requests: one("nvidia.com/gpu")}}}}), true},
		{pod("pod-level", corev1.PodSpec{Resources: &corev1.ResourceRequirements{Limits: one("nvidia.com/gpu")}}), true},
		{pod("cpu", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("cpu")}}}}), false},
		{pod("other-vendor", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("amd.com/gpu")}}}}), false},
		{pod("nvidia-other", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("nvidia.com/vgpu-profile")}}}}), false},
	} {
		if got := RequestsGPU(tc.pod); got != tc.want {
			t.Errorf("%s: RequestsGPU = %v, want %v", tc.pod.Name, got, tc.want)
		}
	}
}

func claimed(name, claim string) *corev1.Pod {
	return pod(name, corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}})
}

func allocated(name, driver string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: "p", Device: "d0"}}}}}}
}

// TestCheckerCountsClaimsAllocatedByTheGPUDriver: a claim allocated by gpu.nvidia.com makes a GPU pod, one by
// another driver or not allocated does not; claims are listed once per namespace, and not at all for pods without
// claims.
func TestCheckerCountsClaimsAllocatedByTheGPUDriver(t *testing.T) {
	pending := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "ml"}}
	client := fake.NewClientset(allocated("gpu-claim", DRADriver), allocated("nic-claim", "nic.example.com"), pending)
	c := &Checker{Client: client}
	ctx := context.Background()
	for _, tc := range []struct {
		pod  *corev1.Pod
		want bool
	}{
		{pod("plain", corev1.PodSpec{}), false},
		{claimed("dra-gpu", "gpu-claim"), true},
		{claimed("dra-nic", "nic-claim"), false},
		{claimed("dra-pending", "pending"), false},
		{claimed("dra-missing", "gone"), false},
	} {
		got, err := c.Uses(ctx, tc.pod)
		if err != nil || got != tc.want {
			t.Errorf("%s: Uses = %v, %v; want %v", tc.pod.Name, got, err, tc.want)
		}
	}
	lists := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "list" && a.GetResource().Resource == "resourceclaims" {
			lists++
		}
	}
	if lists != 1 {
		t.Errorf("%d resourceclaims lists, want 1", lists)
	}
}

// TestCheckerWithoutDRA: a cluster that does not serve resource.k8s.io has no claims; any other list error is
// returned.
func TestCheckerWithoutDRA(t *testing.T) {
	for _, tc := range []struct {
		err     error
		wantErr bool
	}{
		{apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, ""), false},
		{apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", nil), true},
	} {
		client := fake.NewClientset()
		client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
		got, err := (&Checker{Client: client}).Uses(context.Background(), claimed("dra", "c"))
		if got || (err != nil) != tc.wantErr {
			t.Errorf("list error %v: Uses = %v, %v", tc.err, got, err)
		}
	}
}

// TestClaimHolders: only pods on the node that hold a gpu.nvidia.com claim count, terminating ones too; a
// device-plugin pod, a pod of another driver's claim, a finished pod and a pod on another node do not.
func TestClaimHolders(t *testing.T) {
	on := func(p *corev1.Pod, node string) *corev1.Pod { p.Spec.NodeName = node; return p }
	terminating := on(claimed("terminating", "c-term"), "n1")
	now := metav1.Now()
	terminating.DeletionTimestamp = &now
	terminating.Finalizers = []string{"keep"}
	done := on(claimed("done", "c-done"), "n1")
	done.Status.Phase = corev1.PodSucceeded
	client := fake.NewClientset(
		on(claimed("holder", "c-gpu"), "n1"), terminating, done,
		on(claimed("other-driver", "c-other"), "n1"),
		on(claimed("elsewhere", "c-else"), "n2"),
		on(pod("plugin-gpu", corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: one("nvidia.com/gpu")}}}}), "n1"),
		allocated("c-gpu", DRADriver), allocated("c-term", DRADriver), allocated("c-done", DRADriver),
		allocated("c-other", "example.com"), allocated("c-else", DRADriver),
	)
	got, err := ClaimHolders(context.Background(), client, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ml/holder", "ml/terminating"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("ClaimHolders = %v, want %v", got, want)
	}
}

// An offline checker (claims from files) knows only the claims it was given: a pod whose claim is elsewhere, or in
// a namespace with no claim given, holds no GPU, and nothing asks an API.
func TestNewOffline(t *testing.T) {
	name, other := "gpu", "missing"
	alloc := &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
		Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: DRADriver, Pool: "n", Device: "gpu-0"}}}}
	c := NewOffline([]resourcev1.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name},
		Status: resourcev1.ResourceClaimStatus{Allocation: alloc}}})
	for _, tc := range []struct {
		ns, claim string
		want      bool
	}{{"ml", name, true}, {"ml", other, false}, {"web", name, false}} {
		p := pod("p", corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: &tc.claim}}})
		p.Namespace = tc.ns
		got, err := c.Uses(context.Background(), p)
		if err != nil || got != tc.want {
			t.Errorf("%s/%s: Uses = %v, %v; want %v", tc.ns, tc.claim, got, err, tc.want)
		}
	}
}
