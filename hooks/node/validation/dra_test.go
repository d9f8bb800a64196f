package validation

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// gpuSlice is a ResourceSlice as the DRA kubelet plugin publishes it for node.
func gpuSlice(name, node, driver string, devices int) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: driver, NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "gpu-" + string(rune('0'+i))})
	}
	return s
}

func (e *env) addSlice(s *resourcev1.ResourceSlice) {
	e.t.Helper()
	if _, err := e.client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func draOptions(e *env) *Options {
	o := e.options("dra")
	o.DRANodes = draPool("a100")
	o.Timeout = 300 * time.Millisecond
	return o
}

// TestDRACheckSkipsDevicePluginNodes: a node outside DRA_NODE_SELECTOR (or with none set) has no DRA driver to
// check: skipped, dra-ready written, nothing listed or created.
func TestDRACheckSkipsDevicePluginNodes(t *testing.T) {
	for _, sel := range []bool{false, true} {
		e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "legacy"}, nil))
		o := draOptions(e)
		if !sel {
			o.DRANodes = nil
		}
		if err := e.run(o); err != nil {
			t.Fatal(err)
		}
		want := "skipped: node " + testNode + " allocates GPUs through the device plugin (its driver pool's gpuAllocation): no DRA driver to check"
		if _, ok := e.status("dra-ready"); !ok || e.annotation("dra") != want {
			t.Fatalf("dra-ready %v, annotation %q", ok, e.annotation("dra"))
		}
		for _, a := range e.client.Actions() {
			if r := a.GetResource().Resource; r == "resourceslices" || r == "resourceclaims" || r == "pods" {
				t.Fatalf("%s %s on a device-plugin node", a.GetVerb(), r)
			}
		}
	}
}

// TestDRACheckWaitsForTheNodesSlices: the check passes once the DRA driver publishes a slice with devices for
// this node; another node's slice, another driver's, and an empty one do not count.
func TestDRACheckWaitsForTheNodesSlices(t *testing.T) {
	e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "a100"}, nil))
	e.addSlice(gpuSlice("other-node", "gpu-node-2", "gpu.nvidia.com", 2))
	e.addSlice(gpuSlice("other-driver", testNode, "compute-domain.nvidia.com", 1))
	e.addSlice(gpuSlice("empty", testNode, "gpu.nvidia.com", 0))
	o := draOptions(e)
	o.Timeout = 2 * time.Second
	go func() {
		time.Sleep(150 * time.Millisecond)
		_, _ = e.client.ResourceV1().ResourceSlices().Create(context.Background(), gpuSlice("mine", testNode, "gpu.nvidia.com", 8), metav1.CreateOptions{})
	}()
	if err := e.run(o); err != nil {
		t.Fatalf("%v\n%s", err, e.log.String())
	}
	if _, ok := e.status("dra-ready"); !ok || e.annotation("dra") != "ready" {
		t.Fatalf("dra-ready %v, annotation %q", ok, e.annotation("dra"))
	}
	for _, a := range e.client.Actions() {
		if l, ok := a.(k8stesting.ListAction); ok && a.GetResource().Resource == "resourceslices" {
			if got := l.GetListRestrictions().Fields.String(); got != "spec.driver=gpu.nvidia.com,spec.nodeName="+testNode {
				t.Fatalf("slices listed with field selector %q", got)
			}
		}
	}
}

// TestDRACheckFailures: no slice in time leaves the check unpassed with the reason; a refused list fails at once.
func TestDRACheckFailures(t *testing.T) {
	t.Run("no-slices", func(t *testing.T) {
		e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "a100"}, nil))
		e.addSlice(gpuSlice("other-node", "gpu-node-2", "gpu.nvidia.com", 2))
		if err := e.run(draOptions(e)); err == nil {
			t.Fatal("passed without a slice")
		}
		want := "failed: node " + testNode + " has no gpu.nvidia.com ResourceSlice with devices after 300ms (none published): is the DRA kubelet plugin running on it?"
		if _, ok := e.status("dra-ready"); ok || e.annotation("dra") != want {
			t.Fatalf("dra-ready written %v, annotation\n got %q\nwant %q", ok, e.annotation("dra"), want)
		}
	})
	t.Run("forbidden", func(t *testing.T) {
		e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "a100"}, nil))
		e.client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil)
		})
		o := draOptions(e)
		o.WithWait = true
		start := time.Now()
		if err := e.run(o); err == nil || time.Since(start) > 2*time.Second {
			t.Fatalf("err %v after %s; want a failure at once", err, time.Since(start))
		}
		if got := e.annotation("dra"); !strings.HasPrefix(got, "failed: list ResourceSlices") {
			t.Fatalf("annotation %q", got)
		}
	})
}

// TestDRACheckRunsAClaimWorkload: with WithWorkload the check runs the CUDA sample in a pod that takes one GPU
// through a ResourceClaim of class gpu.nvidia.com, owned by the pod and placed by node affinity (the scheduler
// allocates the claim); the pod and the claim are gone afterwards, and an earlier run's pod on this node too.
func TestDRACheckRunsAClaimWorkload(t *testing.T) {
	e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "a100"}, nil))
	e.addSlice(gpuSlice("mine", testNode, "gpu.nvidia.com", 1))
	ctx := context.Background()
	old := workloadPodOf("nvidia-dra-validator-old", "", DRAWorkloadApp, 0)
	old.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{testNode}}}}}}}}
	if _, err := e.client.CoreV1().Pods("gpu-stack").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var claim *resourcev1.ResourceClaim
	e.client.PrependReactor("create", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		claim = a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceClaim).DeepCopy()
		return false, nil, nil
	})
	o := draOptions(e)
	o.WithWorkload, o.Timeout = true, 2*time.Second
	created := e.kubelet(succeeded)
	if err := e.run(o); err != nil {
		t.Fatalf("%v\n%s", err, e.log.String())
	}
	if _, ok := e.status("dra-ready"); !ok || e.annotation("dra") != "ready" {
		t.Fatalf("dra-ready %v, annotation %q", ok, e.annotation("dra"))
	}
	pod := created()
	mu.Lock()
	defer mu.Unlock()
	if pod == nil || claim == nil {
		t.Fatalf("pod %v claim %v; want both created", pod, claim)
	}
	s, c := pod.Spec, pod.Spec.Containers[0]
	switch {
	case s.NodeName != "" || targetNode(pod) != testNode:
		t.Fatalf("pod placed by nodeName %q / affinity %v; want node affinity on %s only", s.NodeName, s.Affinity, testNode)
	case len(s.ResourceClaims) != 1 || ptr.Deref(s.ResourceClaims[0].ResourceClaimName, "") != claim.Name:
		t.Fatalf("pod claims %v, want the claim %s", s.ResourceClaims, claim.Name)
	case len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != s.ResourceClaims[0].Name || len(c.Resources.Limits) != 0 || len(c.Env) != 0:
		t.Fatalf("container resources %+v env %v", c.Resources, c.Env)
	case pod.Labels["app"] != DRAWorkloadApp:
		t.Fatalf("labels %v", pod.Labels)
	}
	r := claim.Spec.Devices.Requests
	if len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.DeviceClassName != "gpu.nvidia.com" || r[0].Exactly.Count != 1 {
		t.Fatalf("claim requests %+v", r)
	}
	if refs := claim.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].Name != pod.Name {
		t.Fatalf("claim owners %v, want the workload pod", refs)
	}
	if left, _ := e.client.CoreV1().Pods("gpu-stack").List(ctx, metav1.ListOptions{}); len(left.Items) != 0 {
		t.Fatalf("pods left: %v", left.Items)
	}
	if left, _ := e.client.ResourceV1().ResourceClaims("gpu-stack").List(ctx, metav1.ListOptions{}); len(left.Items) != 0 {
		t.Fatalf("claims left: %v", left.Items)
	}
}

// TestDRACheckSkipsANodeWhoseDRAPluginIsSwitchedOff: a DRA node whose nvidia.com/gpu.deploy.dra-driver switch is
// off (opted out by the admin, or paused for a driver change) runs no DRA kubelet plugin, so no slice will come:
// the check skips it, naming the switch, rather than wait for slices to its deadline.
func TestDRACheckSkipsANodeWhoseDRAPluginIsSwitchedOff(t *testing.T) {
	for _, v := range []string{"false", "paused-for-driver-upgrade"} {
		e := newEnv(t, nodeWith(map[string]string{"nvidia.com/driver.pool": "a100", "nvidia.com/gpu.deploy.dra-driver": v}, nil))
		if err := e.run(draOptions(e)); err != nil {
			t.Fatalf("switch %s: %v", v, err)
		}
		if _, ok := e.status("dra-ready"); !ok || !strings.Contains(e.annotation("dra"), "skipped") ||
			!strings.Contains(e.annotation("dra"), "nvidia.com/gpu.deploy.dra-driver="+v) {
			t.Fatalf("switch %s: dra-ready %v, annotation %q", v, ok, e.annotation("dra"))
		}
	}
}
