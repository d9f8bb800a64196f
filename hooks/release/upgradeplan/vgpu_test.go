package upgradeplan

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const vgpuPoolLabel = "nvidia.com/vgpu-manager.pool"

// vgpuManagerPod is the release's vGPU manager pod on node: its driver manager carries the config digest.
func vgpuManagerPod(node, digest string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vgpu-manager-" + node, Namespace: "gpu", Labels: map[string]string{
			"app.kubernetes.io/instance": "rel", "app.kubernetes.io/component": "vgpu-manager"}},
		Spec: corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: "k8s-driver-manager", Env: []corev1.EnvVar{{Name: DigestEnv, Value: digest}}}},
			Containers:     []corev1.Container{{Name: "nvidia-vgpu-manager-ctr", Image: "nvcr.io/nvaie/vgpu-manager:570.172.07-ubuntu22.04"}}},
	}
}

func vgpuNode(name, pool string) *corev1.Node {
	l := map[string]string{"nvidia.com/gpu.workload.config": "vm-vgpu"}
	if pool != "" {
		l[vgpuPoolLabel] = pool
	}
	return readyNode(name, l)
}

func terms(reqs ...corev1.NodeSelectorRequirement) []corev1.NodeSelectorTerm {
	return []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}
}

// vgpuPools are the vGPU manager pools as the vgpu-manager chart exports them: the default pool (every node no
// other pool selects) and r570 on nvidia.com/vgpu-manager.pool=r570, one DaemonSet each, no canary and no failure
// threshold (the vGPU manager has no upgrade policy), paced by maxUnavailable 1.
func vgpuPools(defaultDigest, r570Digest string) []driverpools.Pool {
	one, zero := intstr.FromInt32(1), 0
	inR570 := corev1.NodeSelectorRequirement{Key: vgpuPoolLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"r570"}}
	notR570 := corev1.NodeSelectorRequirement{Key: vgpuPoolLabel, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"r570"}}
	return []driverpools.Pool{
		{Name: "default", Source: "container", NodeSelectorTerms: terms(notR570), MaxUnavailable: &one, Canary: &zero, MaxFailures: &zero,
			DaemonSets: []driverpools.DaemonSet{{Name: "nvidia-vgpu-manager-daemonset-ubuntu2204", NodeSelectorTerms: terms(notR570), Digest: defaultDigest}}},
		{Name: "r570", Source: "container", NodeSelectorTerms: terms(inR570), MaxUnavailable: &one, Canary: &zero, MaxFailures: &zero,
			DaemonSets: []driverpools.DaemonSet{{Name: "nvidia-vgpu-manager-r570-ubuntu2204", NodeSelectorTerms: terms(inR570), Digest: r570Digest}}},
	}
}

func runKinds(t *testing.T, drivers, vgpu []driverpools.Pool, objs ...runtime.Object) (*Plan, string, error, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(objs...)
	var out bytes.Buffer
	plan, err := Run(t.Context(), Options{Client: client, Namespace: "gpu", Release: "rel", Pools: drivers, VGPUPools: vgpu, Evict: true,
		Now: func() time.Time { return time.Unix(0, 0) }}, &out)
	return plan, out.String(), err, client
}

// vgpuCluster: two container nodes with the driver (unchanged), three vm-vgpu nodes: v1 and v2 in pool r570, v3 in
// the default vGPU manager pool. A GPU workload under a budget that never allows an eviction runs on v1.
func vgpuCluster(r570Running, defaultRunning string) []runtime.Object {
	blocked := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, ExpectedPods: 1, DesiredHealthy: 1, CurrentHealthy: 1}}
	return []runtime.Object{
		readyNode("c1", nil), readyNode("c2", nil), driverPod("c1", "d1"), driverPod("c2", "d1"),
		vgpuNode("v1", "r570"), vgpuNode("v2", "r570"), vgpuNode("v3", ""),
		vgpuManagerPod("v1", r570Running), vgpuManagerPod("v2", r570Running), vgpuManagerPod("v3", defaultRunning),
		gpuWorkload("v1"), blocked,
	}
}

// A vGPU manager version change in one pool plans exactly that pool's vm-vgpu nodes, in batches of its
// maxUnavailable, and marks them upgrade-required; the container nodes (driver unchanged) and the other vGPU
// manager pool's node are left alone. The vGPU manager never evicts, so a budget on its node does not refuse it,
// and it gets no canary (nothing could hand the canary its turn): no plan mark.
func TestVGPUManagerChangePlansOnlyItsPoolsNodes(t *testing.T) {
	plan, out, err, client := runKinds(t, pool("d1", intstr.FromInt32(1)), vgpuPools("vd1", "vr-new"), vgpuCluster("vr-old", "vd1")...)
	if err != nil {
		t.Fatalf("err %v\n%s", err, out)
	}
	var planned []string
	for _, np := range plan.Nodes {
		planned = append(planned, np.Node)
		if np.Pool != "r570" || np.Kind != KindVGPUManager || np.DaemonSet != "nvidia-vgpu-manager-r570-ubuntu2204" || np.From != "vr-old" || np.To != "vr-new" {
			t.Errorf("planned %+v", np)
		}
	}
	if !slices.Equal(planned, []string{"v1", "v2"}) {
		t.Fatalf("planned nodes %v, want v1 and v2 (pool r570's); out:\n%s", planned, out)
	}
	if b := plan.Batches["nvidia-vgpu-manager-r570-ubuntu2204"]; len(b) != 2 || len(b[0]) != 1 || len(b[1]) != 1 {
		t.Errorf("batches %+v, want two of one node (maxUnavailable 1)", plan.Batches)
	}
	if _, ok := plan.Marks["r570"]; ok || len(plan.Canary) != 0 {
		t.Errorf("canary %+v, marks %+v: a vGPU manager pool has neither", plan.Canary, plan.Marks)
	}
	if !strings.Contains(out, "nvidia-vgpu-manager-r570-ubuntu2204 (vGPU manager pool r570) batch 1: v1") {
		t.Errorf("plan output does not name the vGPU manager pool's batch:\n%s", out)
	}
	for _, name := range []string{"c1", "c2", "v1", "v2", "v3"} {
		n, err := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		state := n.Labels[nodestate.UpgradeStateLabel]
		if want := name == "v1" || name == "v2"; want != (state == string(nodestate.UpgradeRequired)) {
			t.Errorf("node %s: upgrade state %q", name, state)
		}
		if _, ok := n.Annotations[canary.MarkAnnotation]; ok {
			t.Errorf("node %s has a plan mark %s", name, n.Annotations[canary.MarkAnnotation])
		}
		if r := n.Annotations[nodestate.UpgradeReasonAnnotation]; state != "" && !strings.Contains(r, "vGPU manager pool r570") {
			t.Errorf("node %s: reason %q does not name the vGPU manager pool", name, r)
		}
	}
}

// A chart-only change (every vGPU manager pod already carries its DaemonSet's digest) plans nothing; a vm-vgpu
// node left upgrade-required by an earlier, reverted plan is set back to upgrade-done, as a driver node is.
func TestVGPUManagerChartOnlyChangePlansNothing(t *testing.T) {
	objs := vgpuCluster("vr1", "vd1")
	objs[6] = readyNode("v3", map[string]string{"nvidia.com/gpu.workload.config": "vm-vgpu", nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
	plan, out, err, client := runKinds(t, pool("d1", intstr.FromInt32(1)), vgpuPools("vd1", "vr1"), objs...)
	if err != nil || len(plan.Nodes) != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("err %v, nodes %+v, out:\n%s", err, plan.Nodes, out)
	}
	if !slices.Equal(plan.CalledOff, []string{"v3"}) {
		t.Errorf("called off %v, want v3 (its vGPU manager pod has this release's config already)", plan.CalledOff)
	}
	n, err := client.CoreV1().Nodes().Get(t.Context(), "v3", metav1.GetOptions{})
	if err != nil || n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeDone) {
		t.Errorf("v3: %v, state %q, want upgrade-done", err, n.Labels[nodestate.UpgradeStateLabel])
	}
}

// Two vGPU manager pools that both select a node running a vGPU manager are refused, naming the node and both
// pools; nothing is marked.
func TestOverlappingVGPUManagerPoolsAreRefused(t *testing.T) {
	pools := vgpuPools("vd1", "vr-new")
	any := corev1.NodeSelectorRequirement{Key: vgpuPoolLabel, Operator: corev1.NodeSelectorOpExists}
	pools = append(pools, driverpools.Pool{Name: "labelled", Source: "container", NodeSelectorTerms: terms(any),
		DaemonSets: []driverpools.DaemonSet{{Name: "nvidia-vgpu-manager-labelled-ubuntu2204", NodeSelectorTerms: terms(any), Digest: "vl"}}})
	plan, out, err, client := runKinds(t, pool("d1", intstr.FromInt32(1)), pools, vgpuCluster("vr-old", "vd1")...)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "node v1 is selected by vGPU manager pools r570 and labelled") {
		t.Fatalf("err %v, plan %+v\n%s", err, plan, out)
	}
	assertUnmarked(t, client, "v1", "v2", "v3")
}

// A node has one role, so it runs a driver pod or a vGPU manager pod. One that runs both (a role change under
// way, a stuck pod) could be planned by a driver pool and a vGPU manager pool at once, each with its own state and
// pace: the plan refuses, naming both pools, and marks nothing.
func TestNodeOfBothKindsIsRefused(t *testing.T) {
	objs := append(vgpuCluster("vr-old", "vd1"), driverPod("v2", "d0"))
	plan, out, err, client := runKinds(t, pool("d1", intstr.FromInt32(1)), vgpuPools("vd1", "vr-new"), objs...)
	want := "node v2 runs a driver pod (driver pool default) and a vGPU manager pod (vGPU manager pool r570)"
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want %q\nplan %+v\n%s", err, want, plan, out)
	}
	assertUnmarked(t, client, "c1", "c2", "v1", "v2", "v3")
}

// A driver pool and a vGPU manager pool may share a name (both have a default pool): each node's plan, canary and
// mark stay with its own kind's pool.
func TestDriverAndVGPUManagerPoolsOfOneName(t *testing.T) {
	plan, out, err, client := runKinds(t, pool("d2", intstr.FromInt32(1)), vgpuPools("vd2", "vr1"), vgpuCluster("vr1", "vd1")...)
	if err != nil {
		t.Fatalf("err %v\n%s", err, out)
	}
	var canaries []string
	for _, np := range plan.Canary["default"] {
		canaries = append(canaries, np.Node)
	}
	if !slices.Equal(canaries, []string{"c1"}) {
		t.Errorf("canary of driver pool default %v, want [c1] only", canaries)
	}
	kinds := map[string]string{}
	for _, np := range plan.Nodes {
		kinds[np.Node] = np.Kind
	}
	if kinds["c1"] != KindDriver || kinds["c2"] != KindDriver || kinds["v3"] != KindVGPUManager || len(kinds) != 3 {
		t.Errorf("planned %v", kinds)
	}
	v3, _ := client.CoreV1().Nodes().Get(t.Context(), "v3", metav1.GetOptions{})
	c2, _ := client.CoreV1().Nodes().Get(t.Context(), "c2", metav1.GetOptions{})
	if _, ok := v3.Annotations[canary.MarkAnnotation]; ok {
		t.Errorf("v3 (vGPU manager pool default) got the driver pool's mark %s", v3.Annotations[canary.MarkAnnotation])
	}
	if m, err := canary.Read(c2); err != nil || m == nil || !m.IsCanary("c1") || m.IsCanary("v3") {
		t.Errorf("c2's mark %+v, %v: want driver pool default's, canary c1", m, err)
	}
}

func assertUnmarked(t *testing.T, client *fake.Clientset, names ...string) {
	t.Helper()
	for _, name := range names {
		n, err := client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s := n.Labels[nodestate.UpgradeStateLabel]; s != "" {
			t.Errorf("node %s marked %s after a refusal", name, s)
		}
	}
}

// `upgrade retry` of a failed vm-vgpu node restarts its vGPU manager pod, as it restarts a driver pod, and `upgrade
// status` shows the vGPU manager's version there.
func TestRetryAndStatusOfAVGPUManagerNode(t *testing.T) {
	failed := readyNode("v1", map[string]string{"nvidia.com/gpu.workload.config": "vm-vgpu", nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	client := fake.NewClientset(failed, vgpuManagerPod("v1", "vr-new"))
	var out bytes.Buffer
	if err := Retry(t.Context(), client, "gpu", "rel", "v1", time.Unix(0, 0), &out); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("gpu").Get(t.Context(), "vgpu-manager-v1", metav1.GetOptions{}); err == nil {
		t.Errorf("the vGPU manager pod of v1 was not deleted: %s", out.String())
	}
	client = fake.NewClientset(failed, vgpuManagerPod("v1", "vr-new"))
	out.Reset()
	if err := WriteStatus(t.Context(), client, "gpu", "rel", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "570.172.07-ubuntu22.04") {
		t.Errorf("status does not show the vGPU manager's version on v1:\n%s", out.String())
	}
}
