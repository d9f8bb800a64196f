package dra

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/draplugin"
)

const (
	namespace = "gpu-operator"
	workloads = "ml"
	// trainers is how many single-GPU claim pods the workload runs: one more than the DRA pool's GPUs, so one waits
	// for a GPU rather than land on a device-plugin node, and gets one when that pool moves to DRA.
	trainers = 2*draplugin.GPUsPerNode + 1
)

var (
	// draNodes are the default pool's nodes (on DRA in dra-mixed); legacyNodes the pool kept on the device plugin.
	draNodes    = []string{"gpu-01", "gpu-02"}
	legacyNodes = []string{"dra-legacy", "dra-legacy-mps-capable", "dra-legacy-mig-capable"}
)

func target() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: "gpu", Namespace: namespace, Timeout: 2 * time.Minute}
}

// TestDRAMixedAllocationPoolSwitchUninstall: in values/dra-mixed.yaml, claims from a ResourceClaimTemplate are
// allocated by the scheduler on the DRA pool's nodes only (the one pod more than they have GPUs waits) while the
// device-plugin pool keeps its device plugin and gets no slice or claim; `helm upgrade` moving that pool to DRA
// swaps its device plugin for the DRA kubelet plugin, the waiting pod gets a GPU there, and on every other node only
// the DaemonSets carrying the allocation scope roll; uninstall leaves no DeviceClass, no slice and no node change,
// and keeps the ComputeDomain CRDs.
func TestDRAMixedAllocationPoolSwitchUninstall(t *testing.T) {
	start := time.Now()
	ctx := t.Context()
	profile := filepath.Join(chartrender.RepoRoot(), "values", "dra-mixed.yaml")
	before, err := cluster.SnapshotNodes(ctx, kube.Client)
	if err != nil {
		t.Fatal(err)
	}

	// every GPU node a fake kernel: the real driver managers run and label each node with its pool's allocation mode
	for _, n := range nodes {
		if n.Labels["nvidia.com/gpu.present"] == "true" {
			stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: kmodtest.New(t)})
		}
	}
	plugin, stopPlugin := context.WithCancel(ctx)
	defer stopPlugin()
	pluginErrs := make(chan error, 1)
	go draplugin.Play(plugin, kube.Client, namespace, pluginErrs)

	rel, err := target().Install(ctx, []string{profile})
	if err != nil {
		logHooks(t)
		t.Fatal(err)
	}
	uninstalled := false
	defer func() {
		if !uninstalled {
			_ = target().Uninstall()
		}
	}()
	waitForPlacement(t, expected(t, rel))
	waitForSlices(t, draNodes, pluginErrs)
	t.Logf("installed, rolled out and sliced in %s", time.Since(start).Round(time.Millisecond))

	// 1. allocation on DRA nodes only
	step := time.Now()
	startWorkload(t)
	claimNodes := waitForTrainers(t, len(draNodes)*draplugin.GPUsPerNode)
	for pod, node := range claimNodes {
		if !slices.Contains(draNodes, node) {
			t.Errorf("claim pod %s runs on %s, not a DRA node %v", pod, node, draNodes)
		}
	}
	checkClaims(t, claimNodes)
	running, err := target().Running(ctx, kube.Client, nodeNames())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range legacyNodes {
		if _, ok := running[n]["device-plugin"]; !ok {
			t.Errorf("device-plugin node %s runs no device plugin: %v", n, running.Operands(n))
		}
		if _, ok := running[n]["dra-driver"]; ok {
			t.Errorf("device-plugin node %s runs the DRA kubelet plugin", n)
		}
	}
	if got, _ := draplugin.SlicedNodes(ctx, kube.Client); !slices.Equal(got, draNodes) {
		t.Errorf("gpu.nvidia.com slices on %v, want exactly the DRA nodes %v", got, draNodes)
	}
	t.Logf("claims allocated and pods running on %v in %s", claimNodes, time.Since(step).Round(time.Millisecond))

	// 2. the legacy pool moves to DRA; a device-plugin GPU pod still runs there
	step = time.Now()
	holder := startLegacyHolder(t)
	untouched := operandPods(t, func(n string) bool { return !slices.Contains(legacyNodes, n) })
	upgradeStart := time.Now()
	rel, err = target().Upgrade(ctx, []string{profile}, "driver.pools[0].gpuAllocation=dra")
	if err != nil {
		logHooks(t)
		t.Fatal(err)
	}
	r, ok := stand.LastRun("pre-upgrade", upgradeStart)
	if !ok {
		t.Fatal("no pre-upgrade plan ran")
	}
	if want := "switches GPU allocation device-plugin -> dra (pool legacy); GPU pods to move first: " + holder; !strings.Contains(r.Output, want) {
		t.Errorf("the pre-upgrade plan does not say %q:\n%s", want, r.Output)
	}
	t.Logf("pre-upgrade plan:\n%s", r.Output)
	// the release passes once the pool's canary validated; the rest of the pool switches after it, within its bound
	waitForRollout(t, legacyNodes)
	want := expected(t, rel)
	for _, n := range legacyNodes {
		if _, ok := want[n]["dra-driver"]; !ok {
			t.Fatalf("after the switch the DRA kubelet plugin is not expected on %s: %v", n, want.Operands(n))
		}
		if _, ok := want[n]["device-plugin"]; ok {
			t.Fatalf("after the switch the device plugin is still expected on %s", n)
		}
	}
	waitForPlacement(t, want)
	waitForSlices(t, append(slices.Clone(draNodes), legacyNodes...), pluginErrs)
	// Outside the switching pool no operand pod changes: placement follows each node's allocation label, which only
	// the switching pool's driver managers rewrite.
	moved := operandPods(t, func(n string) bool { return !slices.Contains(legacyNodes, n) })
	if d := podDiff(untouched, moved); d != "" {
		t.Errorf("the switch replaced operand pods outside the switching pool:\n%s", d)
	}
	// the trainer left waiting now gets a GPU of the switched pool; the others stay where they were
	again := waitForTrainers(t, trainers)
	checkClaims(t, again)
	for pod, node := range again {
		if was, ok := claimNodes[pod]; ok && was != node {
			t.Errorf("claim pod %s moved from %s to %s during the switch", pod, was, node)
		} else if !ok && !slices.Contains(legacyNodes, node) {
			t.Errorf("the waiting claim pod %s runs on %s, not on the switched pool %v", pod, node, legacyNodes)
		}
	}
	// the driver manager evicted the nvidia.com/gpu pod before it labelled the node dra
	if p, err := kube.Client.CoreV1().Pods(workloads).Get(ctx, strings.TrimPrefix(holder, workloads+"/"), metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Errorf("the nvidia.com/gpu pod %s still runs on %s after its node switched to DRA", holder, p.Spec.NodeName)
	}
	t.Logf("pool switched in %s", time.Since(step).Round(time.Millisecond))

	// 3. uninstall
	step = time.Now()
	if err := kube.Client.CoreV1().Namespaces().Delete(ctx, workloads, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "workload namespace "+workloads, func(ctx context.Context) (bool, error) {
		_, err := kube.Client.CoreV1().Namespaces().Get(ctx, workloads, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err := target().Uninstall(); err != nil {
		t.Fatal(err)
	}
	uninstalled = true
	waitForSlices(t, nil, pluginErrs)
	classes, err := kube.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes.Items {
		t.Errorf("uninstall left DeviceClass %s", c.Name)
	}
	after, err := cluster.SnapshotNodes(ctx, kube.Client)
	if err != nil {
		t.Fatal(err)
	}
	if changes := cluster.NodeChanges(before, after); changes != "" {
		t.Errorf("uninstall left nodes changed:\n%s", changes)
	}
	for _, crd := range []string{"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"} {
		if err := crdExists(ctx, crd); err != nil {
			t.Errorf("CRD %s not kept on uninstall: %v", crd, err)
		}
	}
	t.Logf("uninstalled in %s; whole proof %s", time.Since(step).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

func nodeNames() []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

func logHooks(t *testing.T) {
	for _, r := range stand.Runs() {
		t.Logf("%s hook %s (exit %d):\n%s", r.Component, r.Pod, r.ExitCode, r.Output)
	}
}

func expected(t *testing.T, rel *release.Release) placement.Placement {
	t.Helper()
	p, err := install.Expected(t.Context(), kube.Client, rel)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitForPlacement waits until the running operand pods are exactly want on every node.
func waitForPlacement(t *testing.T, want placement.Placement) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := target().Running(ctx, kube.Client, nodeNames())
		if err != nil {
			return false, err
		}
		var b strings.Builder
		for _, n := range nodeNames() {
			if g, w := got.Operands(n), want.Operands(n); !slices.Equal(g, w) {
				fmt.Fprintf(&b, "node %s:\n  running  %v\n  expected %v\n", n, g, w)
			}
		}
		last = b.String()
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("operand pods never matched the expected placement:\n%s", last)
	}
}

// waitForRollout waits until every node named ended its change: upgrade-done, no operand switch left paused.
func waitForRollout(t *testing.T, names []string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var b strings.Builder
		for _, name := range names {
			n, err := kube.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if s := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]); s != nodestate.UpgradeDone {
				fmt.Fprintf(&b, "node %s: %s\n", name, s)
			} else if p, ok := n.Annotations[nodestate.PausedLabelsAnnotation]; ok {
				fmt.Fprintf(&b, "node %s: operands still paused %s\n", name, p)
			}
		}
		last = b.String()
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("the driver change never ended on %v:\n%s", names, last)
	}
}

// waitForSlices waits until exactly the given nodes have a gpu.nvidia.com slice.
func waitForSlices(t *testing.T, want []string, errs <-chan error) {
	t.Helper()
	slices.Sort(want)
	var got []string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-errs:
			return false, fmt.Errorf("kubelet plugin stand-in: %w", err)
		default:
		}
		var err error
		got, err = draplugin.SlicedNodes(ctx, kube.Client)
		return err == nil && slices.Equal(got, want), err
	})
	if err != nil {
		t.Fatalf("gpu.nvidia.com slices on %v, want %v: %v", got, want, err)
	}
}

func waitGone(t *testing.T, what string, gone wait.ConditionWithContextFunc) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, gone); err != nil {
		t.Fatalf("%s never went: %v", what, err)
	}
}

// startWorkload creates the workload namespace, a ResourceClaimTemplate for one GPU of class gpu.nvidia.com, and
// trainers pods each claiming one from it.
func startWorkload(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	c := kube.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workloads}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: workloads},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: draplugin.GPUDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			}}},
		}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(workloads).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range trainers {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("train-%d", i), Namespace: workloads, Labels: map[string]string{"app": "train"}},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
				Containers: []corev1.Container{{Name: "train", Image: "busybox", Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: "gpu"}},
				}}},
			},
		}
		if _, err := c.CoreV1().Pods(workloads).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// startLegacyHolder runs a pod holding nvidia.com/gpu from the device plugin on the legacy pool and returns its
// name once it runs.
func startLegacyHolder(t *testing.T) string {
	t.Helper()
	const name = "legacy-train"
	one := int32(1)
	labels := map[string]string{"app": name}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads},
		Spec: appsv1.ReplicaSetSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				NodeSelector: map[string]string{nodefixtures.DriverPoolLabel: nodefixtures.DRALegacyPool},
				Containers: []corev1.Container{{Name: "train", Image: "busybox", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
				}}},
			}}},
	}
	if _, err := kube.Client.AppsV1().ReplicaSets(workloads).Create(t.Context(), rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.Client.CoreV1().Pods(workloads).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				pod = p.Name
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("device-plugin pod of %s never ran: %v", name, err)
	}
	return workloads + "/" + pod
}

// waitForTrainers waits until running claim pods run and every other one is unschedulable (pending, on no node),
// and returns the running ones: pod -> node.
func waitForTrainers(t *testing.T, running int) map[string]string {
	t.Helper()
	var out map[string]string
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.Client.CoreV1().Pods(workloads).List(ctx, metav1.ListOptions{LabelSelector: "app=train"})
		if err != nil {
			return false, err
		}
		out, last = map[string]string{}, ""
		unschedulable := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				out[p.Name] = p.Spec.NodeName
				continue
			}
			last += fmt.Sprintf("%s on %q: %s %v\n", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
			for _, c := range p.Status.Conditions {
				if p.Spec.NodeName == "" && c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					unschedulable++
				}
			}
		}
		return len(out) == running && unschedulable == trainers-running, nil
	})
	if err != nil {
		t.Fatalf("want %d of %d claim pods running and the rest unschedulable; running: %v\n%s", running, trainers, out, last)
	}
	return out
}

// checkClaims: each running claim pod's claim is allocated one gpu.nvidia.com device from its node's pool and
// reserved for that pod, no device twice, and the claims of the other (unschedulable) pods are not allocated.
func checkClaims(t *testing.T, podNodes map[string]string) {
	t.Helper()
	ctx := t.Context()
	claims, err := kube.Client.ResourceV1().ResourceClaims(workloads).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != trainers {
		t.Errorf("%d claims, want one per claim pod (%d)", len(claims.Items), trainers)
	}
	used := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0 {
			continue // a waiting pod's claim; counted below
		}
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) != 1 {
			t.Errorf("claim %s: allocation %v, reserved for %v", c.Name, c.Status.Allocation, c.Status.ReservedFor)
			continue
		}
		pod := c.Status.ReservedFor[0].Name
		results := c.Status.Allocation.Devices.Results
		if len(results) != 1 {
			t.Errorf("claim %s of %s: %d devices, want 1", c.Name, pod, len(results))
			continue
		}
		r := results[0]
		if r.Driver != draplugin.GPUDriver || r.Pool != podNodes[pod] {
			t.Errorf("claim %s of %s (on %s): device %s/%s/%s, want a gpu.nvidia.com device of pool %s",
				c.Name, pod, podNodes[pod], r.Driver, r.Pool, r.Device, podNodes[pod])
		}
		id := r.Pool + "/" + r.Device
		if used[id] {
			t.Errorf("device %s allocated twice", id)
		}
		used[id] = true
	}
	if len(used) != len(podNodes) {
		t.Errorf("%d claims allocated, want one per running claim pod (%d)", len(used), len(podNodes))
	}
}

// operandPods are the stack's running pods on the nodes keep selects: node/component/name -> uid.
func operandPods(t *testing.T, keep func(node string) bool) map[string]string {
	t.Helper()
	pods, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && keep(p.Spec.NodeName) && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.Spec.NodeName+"/"+p.Labels["app.kubernetes.io/component"]+"/"+p.Name] = string(p.UID)
		}
	}
	return out
}

func podDiff(a, b map[string]string) string {
	var out strings.Builder
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if b[k] != a[k] {
			fmt.Fprintf(&out, "  gone or replaced: %s\n", k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			fmt.Fprintf(&out, "  new: %s\n", k)
		}
	}
	return out.String()
}

func crdExists(ctx context.Context, name string) error {
	return kube.Client.Discovery().RESTClient().Get().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", name).Do(ctx).Error()
}
