package releasecheck

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

const poolLabel = "nvidia.com/driver.pool"

// allocationSet is a cluster with one node per allocation case: dp (device plugin), dra (slices published),
// bare (DRA, no slice yet) and off (its DRA switch is off: neither plugin targets it), under one of two placements
// of the allocation DaemonSets.
type allocationSet struct {
	devicePlugin, draPlugin, validator *appsv1.DaemonSet
	dp, dra, bare, off                 *corev1.Node
}

func in(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
}

func notIn(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpNotIn, Values: values}
}

// withContainers names the DaemonSet's pod containers.
func withContainers(ds *appsv1.DaemonSet, names ...string) *appsv1.DaemonSet {
	for _, n := range names {
		ds.Spec.Template.Spec.Containers = append(ds.Spec.Template.Spec.Containers, corev1.Container{Name: n})
	}
	return ds
}

// newAllocationSet places the plugins by the pools' selectors (the legacy pool on the device plugin, every other
// GPU node on DRA), or, with byLabel, by a node label naming each node's mode.
func newAllocationSet(byLabel bool) allocationSet {
	draSwitch := notIn("nvidia.com/gpu.deploy.dra-driver", "false", "paused-for-driver-upgrade")
	var s allocationSet
	const modeLabel = "nvidia.com/gpu.allocation"
	if byLabel {
		s.devicePlugin = daemonSet("nvidia-device-plugin-daemonset", "device-plugin", in(modeLabel, "device-plugin"))
		s.draPlugin = daemonSet("nvidia-dra-driver-kubelet-plugin", "dra-driver", in(modeLabel, "dra"), draSwitch)
		s.dp = gpuNode("dp", map[string]string{modeLabel: "device-plugin"})
		s.dra = gpuNode("dra", map[string]string{modeLabel: "dra"})
		s.bare = gpuNode("bare", map[string]string{modeLabel: "dra"})
		s.off = gpuNode("off", map[string]string{modeLabel: "dra", "nvidia.com/gpu.deploy.dra-driver": "false"})
	} else {
		s.devicePlugin = daemonSet("nvidia-device-plugin-daemonset", "device-plugin", in(poolLabel, "legacy"))
		s.draPlugin = daemonSet("nvidia-dra-driver-kubelet-plugin", "dra-driver", notIn(poolLabel, "legacy"), draSwitch)
		s.dp = gpuNode("dp", map[string]string{poolLabel: "legacy"})
		s.dra = gpuNode("dra", nil)
		s.bare = gpuNode("bare", nil)
		s.off = gpuNode("off", map[string]string{"nvidia.com/gpu.deploy.dra-driver": "false"})
	}
	withContainers(s.draPlugin, "gpus", "compute-domains")
	s.validator = daemonSet("nvidia-operator-validator", "operator-validator")
	return s
}

func (s allocationSet) snapshot(slices ...*resourcev1.ResourceSlice) Snapshot {
	var pods []*corev1.Pod
	for _, n := range []string{"dp", "dra", "bare", "off"} {
		pods = append(pods, pod(s.validator, n, "r1", true))
	}
	pods = append(pods, pod(s.devicePlugin, "dp", "r1", true), pod(s.draPlugin, "dra", "r1", true), pod(s.draPlugin, "bare", "r1", true))
	return Snapshot{
		Nodes:       []*corev1.Node{s.dp, s.dra, s.bare, s.off},
		DaemonSets:  []*appsv1.DaemonSet{s.devicePlugin, s.draPlugin, s.validator},
		Pods:        pods,
		Revisions:   map[types.UID]string{s.devicePlugin.UID: "r1", s.draPlugin.UID: "r1", s.validator.UID: "r1"},
		WatchSlices: true, ResourceSlices: slices,
	}
}

func slice(name, driver, node string, devices int) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "gpu-" + string(rune('0'+i))})
	}
	return s
}

func rowOf(t *testing.T, r *Report, node string) NodeRow {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Name == node {
			return n
		}
	}
	t.Fatalf("no row for node %s:\n%s", node, r.Table())
	return NodeRow{}
}

// TestAllocationModeAndSlices: each GPU node's mode is the allocation DaemonSet whose affinity selects it, under
// either placement; a DRA node waits in the slices column until a gpu.nvidia.com ResourceSlice names it (one of
// another driver, or another node's, does not count), its reason naming the node, and fails at the deadline.
func TestAllocationModeAndSlices(t *testing.T) {
	for _, placement := range []struct {
		name    string
		byLabel bool
	}{{"pool selectors", false}, {"node label", true}} {
		t.Run(placement.name, func(t *testing.T) {
			s := newAllocationSet(placement.byLabel)
			published := slice("dra-gpu", "gpu.nvidia.com", "dra", 4)
			noise := []*resourcev1.ResourceSlice{published,
				slice("bare-cd", "compute-domain.nvidia.com", "bare", 1), // another driver
				slice("dp-gpu", "gpu.nvidia.com", "dp", 4)}               // another node
			r, err := Evaluate("gpu", "ns", nil, s.snapshot(noise...))
			if err != nil {
				t.Fatal(err)
			}
			for node, want := range map[string]string{"dp": AllocationDevicePlugin, "dra": AllocationDRA, "bare": AllocationDRA, "off": ""} {
				if got := rowOf(t, r, node).Allocation; got != want {
					t.Errorf("node %s allocation %q, want %q:\n%s", node, got, want, r.Table())
				}
			}
			if c := rowOf(t, r, "dra").Cells[SlicesColumn]; c.State != Ready {
				t.Errorf("node dra with its slice published: %v", c)
			}
			for _, node := range []string{"dp", "off"} {
				if c, ok := rowOf(t, r, node).Cells[SlicesColumn]; ok {
					t.Errorf("node %s is not on DRA but has a slices cell %v", node, c)
				}
			}
			table := r.Table()
			if r.Passed() || r.Settled() || r.Summary[Waiting] != 1 ||
				!strings.Contains(table, "bare resourceslices waiting: node bare: no ResourceSlice of driver gpu.nvidia.com published for it") {
				t.Fatalf("want only node bare waiting for its slices:\n%s", table)
			}
			for _, want := range []string{"allocation", "dp    device-plugin", "bare  dra", "off   -"} {
				if !strings.Contains(table, want) {
					t.Errorf("table lacks %q:\n%s", want, table)
				}
			}
			r.Expire(4 * time.Minute)
			if r.Verdict() != "failed" || !strings.Contains(r.Table(), "bare resourceslices failed: timed out after 4m0s: node bare:") {
				t.Errorf("expired:\n%s", r.Table())
			}

			r, _ = Evaluate("gpu", "ns", nil, s.snapshot(append(noise, slice("bare-gpu", "gpu.nvidia.com", "bare", 2))...))
			if !r.Passed() {
				t.Errorf("every DRA node's slices published, want passed:\n%s", r.Table())
			}
		})
	}
}

// TestSlicesWithoutDevicesWait: a slice that lists no device gives the scheduler no GPU: the node still waits.
func TestSlicesWithoutDevicesWait(t *testing.T) {
	s := newAllocationSet(false)
	r, _ := Evaluate("gpu", "ns", nil, s.snapshot(slice("dra-gpu", "gpu.nvidia.com", "dra", 2), slice("bare-gpu", "gpu.nvidia.com", "bare", 0)))
	if r.Passed() || !strings.Contains(r.Table(), "bare resourceslices waiting: node bare: its gpu.nvidia.com ResourceSlices list no device") {
		t.Errorf("want node bare waiting on its empty slice:\n%s", r.Table())
	}
}

// TestSlicesNotWaitedFor: a DRA kubelet plugin without its gpus container publishes no gpu.nvidia.com slice, and a
// gate that does not watch slices cannot see them: neither waits, and the mode is still shown.
func TestSlicesNotWaitedFor(t *testing.T) {
	t.Run("no gpus container", func(t *testing.T) {
		s := newAllocationSet(false)
		s.draPlugin.Spec.Template.Spec.Containers = []corev1.Container{{Name: "compute-domains"}}
		r, _ := Evaluate("gpu", "ns", nil, s.snapshot())
		if !r.Passed() || rowOf(t, r, "bare").Allocation != AllocationDRA {
			t.Errorf("want passed with bare on dra:\n%s", r.Table())
		}
	})
	t.Run("slices not watched", func(t *testing.T) {
		s := newAllocationSet(false)
		snap := s.snapshot()
		snap.WatchSlices = false
		r, _ := Evaluate("gpu", "ns", nil, snap)
		if !r.Passed() || strings.Contains(r.Table(), SlicesColumn) || rowOf(t, r, "bare").Allocation != AllocationDRA {
			t.Errorf("want passed, no slices column, bare on dra:\n%s", r.Table())
		}
	})
}

// TestBothAllocationPluginsOnANodeFail: a node both plugins target would hand out its GPUs twice: the check fails
// naming the node and both DaemonSets.
func TestBothAllocationPluginsOnANodeFail(t *testing.T) {
	s := newAllocationSet(false)
	s.devicePlugin = daemonSet("nvidia-device-plugin-daemonset", "device-plugin") // every GPU node
	snap := s.snapshot(slice("dra-gpu", "gpu.nvidia.com", "dra", 4), slice("bare-gpu", "gpu.nvidia.com", "bare", 4))
	snap.DaemonSets[0] = s.devicePlugin
	r, _ := Evaluate("gpu", "ns", nil, snap)
	want := "GPU node bare: targeted by device-plugin (nvidia-device-plugin-daemonset) and dra (nvidia-dra-driver-kubelet-plugin)"
	if r.Passed() || rowOf(t, r, "bare").Allocation != AllocationConflict || !strings.Contains(r.Table(), "cluster failed: "+want) {
		t.Errorf("want the check failed with %q:\n%s", want, r.Table())
	}
}

// TestRunWatchesSlices: Run with ResourceSlices waits on a DRA node until its slice is created, and saves the modes
// in the report ConfigMap.
func TestRunWatchesSlices(t *testing.T) {
	s := newAllocationSet(false)
	snap := s.snapshot(slice("dra-gpu", "gpu.nvidia.com", "dra", 4))
	client := seededClient(t, snap)
	ctx := context.Background()
	go func() {
		time.Sleep(300 * time.Millisecond) // the kubelet plugin registers a little later
		_, _ = client.ResourceV1().ResourceSlices().Create(ctx, slice("bare-gpu", "gpu.nvidia.com", "bare", 4), metav1.CreateOptions{})
	}()
	var out strings.Builder
	r, err := Run(ctx, Options{Client: client, Namespace: "ns", Release: "gpu", Timeout: 10 * time.Second, ResourceSlices: true, ReportConfigMap: "report"}, &out)
	if err != nil || !r.Passed() || rowOf(t, r, "bare").Cells[SlicesColumn].State != Ready {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	saved, _, err := LoadConfigMap(ctx, client, "ns", "report")
	if err != nil {
		t.Fatal(err)
	}
	if got := rowOf(t, saved, "bare").Allocation; got != AllocationDRA {
		t.Errorf("saved report: node bare allocation %q, want dra", got)
	}
	if !strings.Contains(saved.Table(), "bare  dra") {
		t.Errorf("saved table:\n%s", saved.Table())
	}
}

// seededClient is a fake clientset holding snap's nodes, and its DaemonSets, pods (in namespace ns, DaemonSets of
// release gpu) and ResourceSlices, as Run reads them.
func seededClient(t *testing.T, snap Snapshot) *fake.Clientset {
	t.Helper()
	client := fake.NewClientset()
	ctx := context.Background()
	for _, n := range snap.Nodes {
		mustCreate(t, func() error { _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); return err })
	}
	for _, ds := range snap.DaemonSets {
		ds = ds.DeepCopy()
		ds.Namespace, ds.Labels["app.kubernetes.io/instance"] = "ns", "gpu"
		mustCreate(t, func() error {
			_, err := client.AppsV1().DaemonSets("ns").Create(ctx, ds, metav1.CreateOptions{})
			return err
		})
	}
	for _, p := range snap.Pods {
		p = p.DeepCopy()
		p.Namespace = "ns"
		mustCreate(t, func() error { _, err := client.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); return err })
	}
	for _, sl := range snap.ResourceSlices {
		mustCreate(t, func() error {
			_, err := client.ResourceV1().ResourceSlices().Create(ctx, sl, metav1.CreateOptions{})
			return err
		})
	}
	return client
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// TestRunEvaluatesABurstOfChangesOncePerInterval: the node changes of a rollout's batch arrive many a second; Run
// takes them in one evaluation per EvaluateEvery instead of walking every node and pod again for each, and still
// sees the change it waits for.
func TestRunEvaluatesABurstOfChangesOncePerInterval(t *testing.T) {
	var evaluations atomic.Int32
	evaluate = func(release, namespace string, pools []driverpools.Pool, s Snapshot) (*Report, error) {
		evaluations.Add(1)
		return Evaluate(release, namespace, pools, s)
	}
	t.Cleanup(func() { evaluate = Evaluate })
	s := newAllocationSet(false)
	snap := s.snapshot(slice("dra-gpu", "gpu.nvidia.com", "dra", 4))
	client := seededClient(t, snap)
	ctx := t.Context()
	const changes = 200
	go func() {
		// a burst of node writes, as a batch's cordons, state labels and taints are, then the slice the run waits for
		for i := range changes {
			node, err := client.CoreV1().Nodes().Get(ctx, "bare", metav1.GetOptions{})
			if err != nil {
				return
			}
			node.Annotations = map[string]string{"burst": fmt.Sprint(i)}
			if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
		_, _ = client.ResourceV1().ResourceSlices().Create(ctx, slice("bare-gpu", "gpu.nvidia.com", "bare", 4), metav1.CreateOptions{})
	}()
	var out strings.Builder
	r, err := Run(ctx, Options{Client: client, Namespace: "ns", Release: "gpu", Timeout: 20 * time.Second, ResourceSlices: true, EvaluateEvery: 300 * time.Millisecond}, &out)
	if err != nil || !r.Passed() {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	// the burst lasts at least 200 ms (a millisecond's pause per write; longer on a loaded machine): one evaluation
	// per 300 ms, the first and the one that passes; on each change it would be one per write taken in
	n := evaluations.Load()
	if n > changes/10 {
		t.Errorf("%d evaluations for %d changes: not paced", n, changes)
	}
	t.Logf("%d evaluations for %d node changes and the slice", n, changes)
}
