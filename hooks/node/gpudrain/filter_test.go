package gpudrain

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
)

const node = "gpu-1"

type podOpt func(*corev1.Pod)

func pod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: new(true)}}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func limits(name string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(name): resource.MustParse("1")}
	}
}

func initRequests(name string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceName(name): resource.MustParse("1")}}}}
	}
}

func unmanaged(p *corev1.Pod) { p.OwnerReferences = nil }

func emptyDir(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
}

func ownedByDaemonSet(name string) podOpt {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: name, UID: "ds", Controller: new(true)}}
	}
}

// claim makes the pod use a claim generated from a template, as the pod status reports it.
func claim(claimName string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("tmpl")}}
		p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &claimName}}
	}
}

func allocated(name, driver string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: "p", Device: "d0"}}}}},
	}
}

func names(ps []corev1.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// In GPU mode the library's pod selection sees every pod of the node, but only GPU users are chosen, and the
// force/emptyDir rules apply to them alone.
func TestGPUModeSelectsGPUUsersOnly(t *testing.T) {
	objs := []runtime.Object{
		pod("train", limits("nvidia.com/gpu")),
		pod("mig-job", limits("nvidia.com/mig-3g.40gb")),
		pod("dra-gpu", claim("dra-gpu-claim")),
		pod("dra-nic", claim("dra-nic-claim")),
		pod("web", limits("cpu")),
		pod("bare-cpu", unmanaged),                   // unmanaged, but not ours to touch: must not block
		pod("cache-cpu", emptyDir),                   // emptyDir, not a GPU user: must not block
		pod("plugin", ownedByDaemonSet("plugin-ds")), // a live DaemonSet's pod: left in place
		allocated("dra-gpu-claim", gpupods.DRADriver),
		allocated("dra-nic-claim", "nic.example.com"),
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "plugin-ds", Namespace: "ml"}},
	}
	client := fake.NewClientset(objs...)
	o := Options{Client: client, Node: node, GPUOnly: true}
	o.Complete()
	list, errs := o.Helper(context.Background(), &strings.Builder{}).GetPodsForDeletion(node)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if got, want := names(list.Pods()), []string{"dra-gpu", "mig-job", "train"}; !slices.Equal(got, want) {
		t.Fatalf("selected %v, want %v", got, want)
	}
	// One claim list for the one namespace with claim-holding pods, however many such pods.
	claimLists := 0
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "resourceclaims" {
			claimLists++
		}
	}
	if claimLists != 1 {
		t.Fatalf("%d resource claim requests, want 1", claimLists)
	}
}

func TestGPUModeAppliesForceAndEmptyDirToGPUPods(t *testing.T) {
	for _, tc := range []struct {
		name               string
		pod                *corev1.Pod
		force, deleteEmpty bool
		wantErr            string
	}{
		{"unmanaged", pod("bare-gpu", limits("nvidia.com/gpu"), unmanaged), false, false, "not managed by a controller"},
		{"unmanaged forced", pod("bare-gpu", limits("nvidia.com/gpu"), unmanaged), true, false, ""},
		{"emptyDir", pod("scratch-gpu", limits("nvidia.com/gpu"), emptyDir), false, false, "emptyDir"},
		{"emptyDir allowed", pod("scratch-gpu", limits("nvidia.com/gpu"), emptyDir), false, true, ""},
		{"orphaned DaemonSet pod", pod("orphan-gpu", limits("nvidia.com/gpu"), ownedByDaemonSet("gone")), false, false, "DaemonSet that no longer exists"},
		{"orphaned DaemonSet pod forced", pod("orphan-gpu", limits("nvidia.com/gpu"), ownedByDaemonSet("gone")), true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Client: fake.NewClientset(tc.pod), Node: node, GPUOnly: true, Force: tc.force, DeleteEmptyDirData: tc.deleteEmpty}
			o.Complete()
			list, errs := o.Helper(context.Background(), &strings.Builder{}).GetPodsForDeletion(node)
			if tc.wantErr == "" {
				if len(errs) > 0 || len(list.Pods()) != 1 {
					t.Fatalf("errs %v, pods %v; want the pod selected", errs, names(list.Pods()))
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.wantErr) || !strings.Contains(errs[0].Error(), "ml/"+tc.pod.Name) {
				t.Fatalf("errs %v; want one naming ml/%s and %q", errs, tc.pod.Name, tc.wantErr)
			}
		})
	}
}

// Full-drain mode is kubectl drain --ignore-daemonsets: every pod, and the library's own refusals.
func TestFullDrainModeIsTheLibrarysSelection(t *testing.T) {
	client := fake.NewClientset(pod("train", limits("nvidia.com/gpu")), pod("web"), pod("bare", unmanaged))
	o := Options{Client: client, Node: node}
	o.Complete()
	_, errs := o.Helper(context.Background(), &strings.Builder{}).GetPodsForDeletion(node)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "ml/bare") {
		t.Fatalf("errs %v; want the library's refusal of the unmanaged pod", errs)
	}
	o.Force = true
	list, errs := o.Helper(context.Background(), &strings.Builder{}).GetPodsForDeletion(node)
	if len(errs) > 0 || !slices.Equal(names(list.Pods()), []string{"bare", "train", "web"}) {
		t.Fatalf("forced: errs %v pods %v", errs, names(list.Pods()))
	}
}

func TestValidate(t *testing.T) {
	o := Options{Client: fake.NewClientset(), Node: node, PodSelector: "a in (b"}
	if err := o.Validate(); err == nil {
		t.Fatal("bad selector accepted")
	}
	o = Options{Client: fake.NewClientset()}
	if err := o.Validate(); err == nil {
		t.Fatal("missing node accepted")
	}
	o = Options{}
	o.Complete()
	if o.Timeout != DefaultTimeout || o.EvictErrorRetryDelay != DefaultEvictErrorRetryDelay {
		t.Fatalf("defaults %+v", o)
	}
}
