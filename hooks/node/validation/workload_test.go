package validation

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// kubelet plays this node's kubelet for the check's workload pod: once the check watches pods, it gives the pod
// the status act returns. It returns the pod as created.
func (e *env) kubelet(act func(*corev1.Pod) corev1.PodStatus) func() *corev1.Pod {
	var mu sync.Mutex
	var created *corev1.Pod
	go func() {
		for res := range e.watches {
			if res != "pods" {
				continue
			}
			pods, err := e.client.CoreV1().Pods("gpu-stack").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return
			}
			for i := range pods.Items {
				pod := &pods.Items[i]
				if pod.Labels["app.kubernetes.io/managed-by"] != "kube-gpu-stack-validator" {
					continue
				}
				mu.Lock()
				created = pod.DeepCopy()
				mu.Unlock()
				pod.Status = act(pod)
				_, _ = e.client.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
			}
			return
		}
	}()
	return func() *corev1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return created
	}
}

func succeeded(*corev1.Pod) corev1.PodStatus { return corev1.PodStatus{Phase: corev1.PodSucceeded} }

func workloadPodOf(name, node, app string, gpus int64) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-stack", Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if gpus > 0 {
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	return pod
}

func TestCUDACheckRunsTheSampleOnThisNode(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	// an earlier run's pod on this node goes; another node's stays, and so does one of another account on this node
	// (a GPU Operator validator's, left before a takeover: the admission policy lets the validator delete only its
	// workload account's pods)
	old := workloadPodOf("nvidia-cuda-validator-old", testNode, CUDAWorkloadApp, 0)
	old.Spec.ServiceAccountName = "nvidia-validator-workload"
	operators := workloadPodOf("nvidia-cuda-validator-operators", testNode, CUDAWorkloadApp, 0)
	operators.Spec.ServiceAccountName = "nvidia-operator-validator"
	for _, p := range []*corev1.Pod{old, operators, workloadPodOf("nvidia-cuda-validator-other", "gpu-node-2", CUDAWorkloadApp, 0)} {
		if _, err := e.client.CoreV1().Pods("gpu-stack").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	o := e.options("cuda")
	o.RuntimeClass, o.PullSecrets, o.PullPolicy = "nvidia", []string{"regcred", "mirror"}, "IfNotPresent"
	o.WorkloadImage, o.WorkloadCommand = "registry.local/cuda-sample:vectoradd", []string{"/vectorAdd", "-quiet"}
	o.WorkloadServiceAccount = "nvidia-validator-workload"
	created := e.kubelet(succeeded)
	if err := e.run(o); err != nil {
		t.Fatalf("%v\n%s", err, e.log.String())
	}
	if _, ok := e.status("cuda-ready"); !ok || e.annotation("cuda") != "ready" {
		t.Fatalf("cuda-ready %v, annotation %q", ok, e.annotation("cuda"))
	}
	pod := created()
	if pod == nil {
		t.Fatal("no pod was created")
	}
	s, c := pod.Spec, pod.Spec.Containers[0]
	switch {
	case s.NodeName != testNode || s.RestartPolicy != corev1.RestartPolicyNever || ptr.Deref(s.RuntimeClassName, "") != "nvidia":
		t.Fatalf("pod spec %+v", s)
	case s.ServiceAccountName != "nvidia-validator-workload" || ptr.Deref(s.AutomountServiceAccountToken, true):
		t.Fatalf("the workload pod runs as %q (token mounted: %v), want the no-rights workload account without a token", s.ServiceAccountName, ptr.Deref(s.AutomountServiceAccountToken, true))
	case !slices.Equal(s.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}):
		t.Fatalf("pull secrets %v", s.ImagePullSecrets)
	case len(s.Tolerations) != 1 || s.Tolerations[0].Operator != corev1.TolerationOpExists || s.Tolerations[0].Key != "":
		t.Fatalf("tolerations %v", s.Tolerations)
	case pod.Labels["app"] != CUDAWorkloadApp || pod.Namespace != "gpu-stack":
		t.Fatalf("pod %s/%s labels %v", pod.Namespace, pod.Name, pod.Labels)
	case c.Image != "registry.local/cuda-sample:vectoradd" || !slices.Equal(c.Command, []string{"/vectorAdd", "-quiet"}) || c.ImagePullPolicy != corev1.PullIfNotPresent:
		t.Fatalf("container %+v", c)
	case !slices.Equal(c.Env, []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}):
		t.Fatalf("env %v", c.Env)
	case len(c.Resources.Limits) != 0 || len(c.Resources.Requests) != 0:
		t.Fatalf("the CUDA pod requests resources: %v", c.Resources)
	}
	left, _ := e.client.CoreV1().Pods("gpu-stack").List(ctx, metav1.ListOptions{})
	var names []string
	for _, p := range left.Items {
		names = append(names, p.Name)
	}
	if slices.Sort(names); !slices.Equal(names, []string{"nvidia-cuda-validator-operators", "nvidia-cuda-validator-other"}) {
		t.Fatalf("pods left: %v (the old and the new pod of this node must be gone, the other node's and account's stay)", names)
	}
}

func TestCUDACheckFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  func(*corev1.Pod) corev1.PodStatus
		timeout time.Duration
		want    []string // the node's records, in order; "@pod" is the pod's name
	}{{
		name: "the sample fails",
		status: func(*corev1.Pod) corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
				Name: "cuda-validation",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
					Message: "[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code CUDA driver version is insufficient for CUDA runtime version)!\n"}},
			}}}
		},
		want: []string{"waiting: pod @pod is Pending", "failed: pod @pod: container cuda-validation exited 1 (Error): Failed to allocate device vector A (error code CUDA driver version is insufficient for CUDA runtime version)!"},
	}, {
		name: "the image cannot be pulled: the node says so while waiting, then the check gives up at its bound",
		status: func(*corev1.Pod) corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
				Name: "cuda-validation",
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
					Message: `Back-off pulling image "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"`}},
			}}}
		},
		timeout: 300 * time.Millisecond,
		want: []string{
			"waiting: pod @pod is Pending",
			`waiting: pod @pod: container cuda-validation waiting: ImagePullBackOff: Back-off pulling image "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"`,
			`failed: pod @pod did not finish within 300ms: pod @pod: container cuda-validation waiting: ImagePullBackOff: Back-off pulling image "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"`,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			o := e.options("cuda")
			if tc.timeout > 0 {
				o.Timeout = tc.timeout
			}
			created := e.kubelet(tc.status)
			err := e.run(o)
			if err == nil {
				t.Fatal("the check passed")
			}
			pod := created()
			var want []string
			for _, w := range tc.want {
				want = append(want, strings.ReplaceAll(w, "@pod", pod.Name))
			}
			if got := e.recorded(); !slices.Equal(got, want) {
				t.Fatalf("recorded:\n%q\nwant:\n%q", got, want)
			}
			if _, ok := e.status("cuda-ready"); ok {
				t.Fatal("cuda-ready written")
			}
			if _, err := e.client.CoreV1().Pods("gpu-stack").Get(context.Background(), pod.Name, metav1.GetOptions{}); err == nil {
				t.Fatal("the workload pod was left behind")
			}
		})
	}
}

func TestPluginCheck(t *testing.T) {
	gpus := func(n int64) corev1.ResourceList {
		return corev1.ResourceList{GPUResource: *resource.NewQuantity(n, resource.DecimalSI)}
	}
	for _, tc := range []struct {
		name         string
		allocatable  corev1.ResourceList
		withWorkload bool
		strategy     string
		pods         []*corev1.Pod
		arrive       corev1.ResourceList // allocatable the device plugin registers while the check watches
		kubelet      func(*corev1.Pod) corev1.PodStatus
		want         string
		resource     corev1.ResourceName // requested by the workload pod; "" when none may run
		labels       map[string]string
		draNodes     *corev1.NodeSelector // the nodes whose pool allocates GPUs through DRA
	}{{
		name:        "capacity only",
		allocatable: gpus(4),
		want:        "ready",
	}, {
		name:   "capacity registered while the check watches the node",
		arrive: gpus(2),
		want:   "ready",
	}, {
		name: "no capacity within the bound",
		want: "failed: node " + testNode + " advertises no allocatable nvidia.com/gpu or nvidia.com/mig-* after 300ms: is the device plugin running on it?",
	}, {
		name:         "workload gets one free GPU",
		allocatable:  gpus(2),
		withWorkload: true,
		pods:         []*corev1.Pod{workloadPodOf("train", testNode, "train", 1), workloadPodOf("elsewhere", "gpu-node-2", "x", 8)},
		kubelet:      succeeded,
		want:         "ready",
		resource:     GPUResource,
	}, {
		name:         "every GPU allocated: workload skipped, never waits for one",
		allocatable:  gpus(2),
		withWorkload: true,
		pods: []*corev1.Pod{
			workloadPodOf("train-a", testNode, "train", 1), workloadPodOf("train-b", testNode, "train", 1),
			func() *corev1.Pod {
				p := workloadPodOf("done", testNode, "batch", 2)
				p.Status.Phase = corev1.PodSucceeded
				return p
			}(),
		},
		want: "skipped: all 2 nvidia.com/gpu allocated; workload check skipped",
	}, {
		name:         "the kubelet refuses the pod: no free GPU after all",
		allocatable:  gpus(1),
		withWorkload: true,
		kubelet: func(*corev1.Pod) corev1.PodStatus {
			return corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfnvidia.com/gpu",
				Message: "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 1, capacity: 1"}
		},
		want:     "skipped: no free nvidia.com/gpu (pod @pod failed: OutOfnvidia.com/gpu: Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 1, capacity: 1); workload check skipped",
		resource: GPUResource,
	}, {
		name: "MIG strategy mixed: a MIG device is requested",
		allocatable: corev1.ResourceList{"nvidia.com/mig-3g.40gb": resource.MustParse("2"), "nvidia.com/mig-1g.10gb": resource.MustParse("4"),
			"nvidia.com/mig-2g.20gb": resource.MustParse("0")},
		withWorkload: true,
		strategy:     "mixed",
		kubelet:      succeeded,
		want:         "ready",
		resource:     "nvidia.com/mig-1g.10gb",
	}, {
		name:         "DRA node: no device plugin there, nothing to wait for",
		labels:       map[string]string{"nvidia.com/driver.pool": "moved"},
		draNodes:     draPool("moved"),
		withWorkload: true,
		want:         "skipped: node " + testNode + " allocates GPUs through DRA (its driver pool's gpuAllocation): no device plugin to check",
	}, {
		name:        "device-plugin node of a cluster with DRA pools: checked as before",
		labels:      map[string]string{"nvidia.com/driver.pool": "legacy"},
		draNodes:    draPool("moved"),
		allocatable: gpus(1),
		want:        "ready",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nodeWith(tc.labels, tc.allocatable))
			for _, p := range tc.pods {
				if _, err := e.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			o := e.options("plugin")
			o.WithWorkload, o.Timeout = tc.withWorkload, 300*time.Millisecond
			o.DRANodes = tc.draNodes
			if tc.strategy != "" {
				o.MIGStrategy = tc.strategy
			}
			if tc.arrive != nil {
				go func() {
					for res := range e.watches {
						if res == "nodes" {
							node, _ := e.client.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{})
							node.Status.Allocatable = tc.arrive
							_, _ = e.client.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{})
							return
						}
					}
				}()
			}
			created := func() *corev1.Pod { return nil }
			if tc.kubelet != nil {
				created = e.kubelet(tc.kubelet)
			}
			var creates int
			e.client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				creates++
				return false, nil, nil
			})
			err := e.run(o)
			want := tc.want
			if pod := created(); pod != nil {
				want = strings.ReplaceAll(want, "@pod", pod.Name)
			}
			if got := e.annotation("plugin"); got != want {
				t.Fatalf("annotation\n got %q\nwant %q\nlog: %s", got, want, e.log.String())
			}
			passed := !strings.HasPrefix(want, "failed")
			if (err == nil) != passed {
				t.Fatalf("err %v", err)
			}
			if _, ok := e.status("plugin-ready"); ok != passed {
				t.Fatalf("plugin-ready written: %v", ok)
			}
			if tc.resource == "" {
				if creates != 0 {
					t.Fatalf("%d workload pods created, want none", creates)
				}
				return
			}
			pod := created()
			if pod == nil {
				t.Fatal("no workload pod")
			}
			c := pod.Spec.Containers[0]
			q := c.Resources.Limits[tc.resource]
			if len(c.Resources.Limits) != 1 || q.Value() != 1 || pod.Labels["app"] != PluginWorkloadApp || len(c.Env) != 0 {
				t.Fatalf("workload pod: limits %v, labels %v, env %v", c.Resources.Limits, pod.Labels, c.Env)
			}
		})
	}
}

// draPool selects the GPU nodes of one driver pool, as the chart renders DRA_NODE_SELECTOR.
func draPool(name string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nvidia.com/driver.pool", Operator: corev1.NodeSelectorOpIn, Values: []string{name}},
	}}}}
}

func TestPodRequestCountsLikeTheScheduler(t *testing.T) {
	one := corev1.ResourceList{GPUResource: resource.MustParse("1")}
	three := corev1.ResourceList{GPUResource: resource.MustParse("3")}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: three}}},
		Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Requests: one, Limits: one}},
			{Resources: corev1.ResourceRequirements{Limits: one}},
		},
	}}
	if got := podRequest(pod, GPUResource); got != 3 {
		t.Fatalf("podRequest = %d, want 3 (the init container's)", got)
	}
	pod.Spec.InitContainers = nil
	if got := podRequest(pod, GPUResource); got != 2 {
		t.Fatalf("podRequest = %d, want 2", got)
	}
}

// A watch the API server refuses (forbidden) fails the check at once, naming the resource and the refusal,
// instead of waiting out the timeout and saying only that the deadline passed.
func TestWorkloadChecksNameARefusedWatchAtOnce(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "x"}, "", errors.New("RBAC says no"))
	for _, tc := range []struct {
		name, check, want string
		refuse            func(k8stesting.ListAction) bool
	}{{
		name:  "node watch",
		check: "plugin",
		refuse: func(a k8stesting.ListAction) bool {
			return a.GetResource().Resource == "nodes"
		},
		want: `watch nodes (metadata.name=` + testNode + `): `,
	}, {
		name:  "workload pod watch",
		check: "cuda",
		refuse: func(a k8stesting.ListAction) bool {
			return a.GetResource().Resource == "pods" && strings.Contains(a.GetListRestrictions().Fields.String(), "metadata.name")
		},
		want: `watch pods in namespace "gpu-stack" (metadata.name=`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nodeWith(nil, nil))
			e.client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if tc.refuse(a.(k8stesting.ListAction)) {
					return true, nil, forbidden
				}
				return false, nil, nil
			})
			o := e.options(tc.check)
			o.WithWait, o.Timeout = true, time.Minute
			start := time.Now()
			err := e.run(o)
			if err == nil {
				t.Fatal("the check passed although its watch was refused")
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("the refusal was reported after %s, want at once", took)
			}
			got := e.annotation(tc.check)
			if !strings.HasPrefix(got, "failed: "+tc.want) || !strings.Contains(got, "x is forbidden: RBAC says no") {
				t.Fatalf("annotation %q, want it to start with %q and name the refusal", got, "failed: "+tc.want)
			}
		})
	}
}
