// Package nodefixtures describes simulated nodes with the labels NFD and GPU feature discovery put on real ones.
// The same fixtures drive the role-matrix test (matched against rendered DaemonSets) and the simulated GPU nodes
// of the local control plane.
package nodefixtures

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OS is a node's operating system as NFD reports it.
type OS struct{ ID, VersionID string }

// Operating systems of the fixtures.
var (
	Ubuntu2204 = OS{"ubuntu", "22.04"}
	Ubuntu2404 = OS{"ubuntu", "24.04"}
	RHEL96     = OS{"rhel", "9.6"}
)

// Labels NFD puts on every node.
func (o OS) Labels() map[string]string {
	major := o.VersionID
	for i, c := range o.VersionID {
		if c == '.' {
			major = o.VersionID[:i]
			break
		}
	}
	return map[string]string{
		"kubernetes.io/os":                                              "linux",
		"beta.kubernetes.io/os":                                         "linux", // the kubelet sets both; the node controller would add it otherwise
		"feature.node.kubernetes.io/system-os_release.ID":               o.ID,
		"feature.node.kubernetes.io/system-os_release.VERSION_ID":       o.VersionID,
		"feature.node.kubernetes.io/system-os_release.VERSION_ID.major": major,
		"feature.node.kubernetes.io/kernel-version.full":                "6.8.0-60-generic",
	}
}

// GPU labels: what the NodeFeatureRule (gpu.present) and GFD put on a node with an NVIDIA GPU.
func gpuLabels(product string) map[string]string {
	return map[string]string{
		"feature.node.kubernetes.io/pci-10de.present": "true",
		"nvidia.com/gpu.present":                      "true",
		"nvidia.com/gpu.product":                      product,
		"nvidia.com/gpu.count":                        "8",
	}
}

// Node is one fixture: a name, its labels and taints, and how many GPUs it advertises.
type Node struct {
	Name   string
	Labels map[string]string
	Taints []corev1.Taint
	GPUs   int64
}

// GPUTaint is the taint GPU node pools commonly carry; every operand tolerates it.
var GPUTaint = corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}

func gpuNode(name string, os OS, product string, extra map[string]string) Node {
	l := os.Labels()
	maps.Copy(l, gpuLabels(product))
	maps.Copy(l, extra)
	return Node{Name: name, Labels: l, GPUs: 8}
}

// RoleMatrix is the set of nodes the role-matrix test matches every profile against: each role, each opt-out and
// pause, MIG and MPS capability, mixed OS, taints, and a node without a GPU.
func RoleMatrix() []Node {
	paused := map[string]string{}
	for _, op := range []string{"container-toolkit", "device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery",
		"operator-validator", "node-status-exporter", "mig-manager"} {
		paused["nvidia.com/gpu.deploy."+op] = "paused-for-driver-upgrade"
	}
	// what the CC manager leaves after a mode change on a node whose sandbox switches were absent: it pauses them by
	// rewriting each one, writes "" for the absent ones, and "" stays after it resumes them
	ccResumed := map[string]string{"nvidia.com/gpu.workload.config": "vm-passthrough"}
	for _, op := range CCManagerSwitches {
		ccResumed["nvidia.com/gpu.deploy."+op] = ""
	}
	tainted := gpuNode("container-tainted", Ubuntu2204, "NVIDIA-L40S", nil)
	tainted.Taints = []corev1.Taint{GPUTaint}
	dedicated := gpuNode("container-dedicated", Ubuntu2204, "NVIDIA-L40S", nil)
	dedicated.Taints = []corev1.Taint{{Key: "dedicated", Value: "training", Effect: corev1.TaintEffectNoSchedule}}
	noGPU := Node{Name: "cpu-only", Labels: Ubuntu2204.Labels()}
	return append([]Node{
		gpuNode("container-ubuntu2204", Ubuntu2204, "NVIDIA-L40S", nil),
		// labelled, so VM-default profiles still have a container node of each OS
		gpuNode("container-ubuntu2404", Ubuntu2404, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.workload.config": "container"}),
		gpuNode("container-rhel9", RHEL96, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.workload.config": "container"}),
		gpuNode("container-labelled", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.workload.config": "container"}),
		gpuNode("mig-capable", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{"nvidia.com/mig.capable": "true"}),
		gpuNode("mps-capable", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/mps.capable": "true"}),
		gpuNode("container-mig-capable", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{
			"nvidia.com/mig.capable": "true", "nvidia.com/gpu.workload.config": "container"}),
		gpuNode("container-mps-capable", Ubuntu2204, "NVIDIA-L40S", map[string]string{
			"nvidia.com/mps.capable": "true", "nvidia.com/gpu.workload.config": "container"}),
		gpuNode("device-plugin-off", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.deploy.device-plugin": "false"}),
		// an empty switch counts as absent (the GPU Operator's rule)
		gpuNode("device-plugin-empty", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.deploy.device-plugin": ""}),
		gpuNode("paused-for-driver-upgrade", Ubuntu2204, "NVIDIA-L40S", paused),
		gpuNode("operands-off", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.deploy.operands": "false"}),
		tainted,
		dedicated,
		gpuNode("vm-passthrough", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{"nvidia.com/gpu.workload.config": "vm-passthrough"}),
		gpuNode("vm-vgpu", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.workload.config": "vm-vgpu"}),
		gpuNode("vm-passthrough-cc-resumed", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", ccResumed),
		gpuNode("role-unknown", Ubuntu2204, "NVIDIA-L40S", map[string]string{"nvidia.com/gpu.workload.config": "bogus"}),
		noGPU,
	}, slices.Concat(DriverPools(), DRA())...)
}

// OpenShift are RHCOS GPU workers as NFD labels them on OpenShift 4.16 to 4.18 (ID rhcos, VERSION_ID the OpenShift
// minor, OSTREE_VERSION the RHCOS build), one of them MIG-capable. Only the openshift profile is matched against them.
func OpenShift() []Node {
	node := func(name, minor, build string, extra map[string]string) Node {
		n := gpuNode(name, OS{"rhcos", "4." + minor}, "NVIDIA-H100-80GB-HBM3", extra)
		n.Labels["feature.node.kubernetes.io/system-os_release.OSTREE_VERSION"] = build
		n.Labels["feature.node.kubernetes.io/system-os_release.RHEL_VERSION"] = "9.4"
		n.Labels["feature.node.kubernetes.io/kernel-version.full"] = "5.14.0-427.50.1.el9_4.x86_64"
		return n
	}
	return []Node{
		node("rhcos416", "16", "416.94.202501270445-0", nil),
		node("rhcos417-mig-capable", "17", "417.94.202501071621-0", map[string]string{"nvidia.com/mig.capable": "true"}),
		node("rhcos418", "18", "418.94.202502251302-0", nil),
	}
}

// CCManagerSwitches are the gpu.deploy.* switches (suffixes) the CC manager (k8s-cc-manager v0.4.3,
// gpu_operator_eviction.py COMPONENT_LABELS) pauses around a CC mode change.
var CCManagerSwitches = []string{"vfio-manager", "vgpu-manager", "sandbox-validator", "sandbox-device-plugin", "vgpu-device-manager"}

// DriverPoolLabel is the label the driver-pools profile selects its pools on.
const DriverPoolLabel = "nvidia.com/driver.pool"

// DriverPools are GPU nodes in the driver pools of values/driver-pools.yaml: an older driver branch on two OSes,
// precompiled drivers for two kernels, and pre-installed host drivers. In every other profile they are ordinary
// unlabelled (default-role) GPU nodes.
func DriverPools() []Node {
	pool := func(name string, os OS, kernel, p string) Node {
		return gpuNode(name, os, "NVIDIA-A100-SXM4-80GB", map[string]string{
			DriverPoolLabel: p,
			"feature.node.kubernetes.io/kernel-version.full": kernel,
		})
	}
	return []Node{
		pool("pool-r570-ubuntu2404", Ubuntu2404, "6.8.0-60-generic", "r570"),
		pool("pool-r570-rhel9", RHEL96, "5.14.0-570.12.1.el9_6.x86_64", "r570"),
		pool("pool-precompiled-k5-15", Ubuntu2204, "5.15.0-140-generic", "precompiled"),
		pool("pool-precompiled-k6-8", Ubuntu2204, "6.8.0-60-generic", "precompiled"),
		pool("pool-host", Ubuntu2204, "6.8.0-60-generic", "host"),
	}
}

// DRALegacyPool is the pool of values/dra-mixed.yaml that stays on the device plugin (nvidia.com/driver.pool value).
const DRALegacyPool = "legacy"

// DRA are GPU nodes for the DRA profiles: two nodes of the pool values/dra-mixed.yaml keeps on the device plugin
// (one MPS-capable, one MIG-capable), and two nodes whose DRA switch nvidia.com/gpu.deploy.dra-driver is off: opted out by the admin,
// and paused as the reference driver manager pauses it. In every other profile they are ordinary unlabelled
// (default-role) GPU nodes, the legacy ones MPS-capable or not.
func DRA() []Node {
	legacy := map[string]string{DriverPoolLabel: DRALegacyPool}
	return []Node{
		gpuNode("dra-legacy", Ubuntu2204, "NVIDIA-L40S", legacy),
		gpuNode("dra-legacy-mps-capable", Ubuntu2204, "NVIDIA-L40S", map[string]string{DriverPoolLabel: DRALegacyPool, "nvidia.com/mps.capable": "true"}),
		gpuNode("dra-legacy-mig-capable", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{DriverPoolLabel: DRALegacyPool, "nvidia.com/mig.capable": "true"}),
		gpuNode("dra-opted-out", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{"nvidia.com/gpu.deploy.dra-driver": "false"}),
		gpuNode("dra-paused", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", map[string]string{"nvidia.com/gpu.deploy.dra-driver": "paused-for-driver-upgrade"}),
	}
}

// Object returns the fixture as a Node object, with capacity for pods, CPU, memory and its GPUs (a node with
// only GPU capacity fits no pod).
func (n Node) Object() *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
	}
	if n.GPUs > 0 {
		capacity["nvidia.com/gpu"] = *resource.NewQuantity(n.GPUs, resource.DecimalSI)
	}
	labels := maps.Clone(n.Labels)
	labels["kubernetes.io/hostname"] = n.Name
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: n.Taints},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

// Demo is the small mixed cluster of the demo: container nodes on two OSes (one MIG-capable), a vm-passthrough
// node, a vm-vgpu node, and a node without a GPU.
func Demo() []Node {
	role := func(r string) map[string]string { return map[string]string{"nvidia.com/gpu.workload.config": r} }
	return []Node{
		gpuNode("gpu-ubuntu2204", Ubuntu2204, "NVIDIA-L40S", nil),
		gpuNode("gpu-rhel9", RHEL96, "NVIDIA-L40S", nil),
		gpuNode("gpu-h100-mig", Ubuntu2404, "NVIDIA-H100-80GB-HBM3", map[string]string{"nvidia.com/mig.capable": "true"}),
		gpuNode("vm-passthrough", Ubuntu2204, "NVIDIA-H100-80GB-HBM3", role("vm-passthrough")),
		gpuNode("vm-vgpu", Ubuntu2204, "NVIDIA-L40S", role("vm-vgpu")),
		{Name: "cpu-only", Labels: Ubuntu2204.Labels()},
	}
}

// Rollout is one driver DaemonSet's worth of identical container GPU nodes (gpu-01 … gpu-NN, Ubuntu 22.04, 8 GPUs
// each) and a node without a GPU, for driver rollouts.
func Rollout(n int) []Node {
	out := make([]Node, 0, n+1)
	for i := 1; i <= n; i++ {
		out = append(out, gpuNode(fmt.Sprintf("gpu-%02d", i), Ubuntu2204, "NVIDIA-L40S", nil))
	}
	return append(out, Node{Name: "cpu-only", Labels: Ubuntu2204.Labels()})
}

// Soak is n identical container GPU nodes (soak-001 … soak-NNN, Ubuntu 22.04, 8 GPUs each) spread over driver
// pools: every node whose index modulo len(pools) is i carries DriverPoolLabel=pools[i], "" leaving it in the
// default pool; and a node without a GPU.
func Soak(n int, pools []string) []Node {
	out := make([]Node, 0, n+1)
	for i := 1; i <= n; i++ {
		var extra map[string]string
		if p := pools[i%len(pools)]; p != "" {
			extra = map[string]string{DriverPoolLabel: p}
		}
		out = append(out, gpuNode(fmt.Sprintf("soak-%03d", i), Ubuntu2204, "NVIDIA-L40S", extra))
	}
	return append(out, Node{Name: "cpu-only", Labels: Ubuntu2204.Labels()})
}

// Scale is n GPU nodes (scale-0001 …) for the 1,000-node benchmark, cycling through a mix of 20: the default driver
// pool on Ubuntu 22.04 (two of them MIG-capable H100s), Ubuntu 24.04 and RHEL 9; the r570 pool of
// values/driver-pools.yaml on Ubuntu 24.04 and RHEL 9, its precompiled pool on both kernels and its host-driver
// pool; vm-passthrough and vm-vgpu nodes (Ubuntu 22.04, the vGPU manager's OS in values/mixed.yaml).
func Scale(n int) []Node {
	role := func(r string) map[string]string { return map[string]string{"nvidia.com/gpu.workload.config": r} }
	pool := func(p, kernel string) map[string]string {
		return map[string]string{DriverPoolLabel: p, "feature.node.kubernetes.io/kernel-version.full": kernel}
	}
	mig := map[string]string{"nvidia.com/mig.capable": "true"}
	type kind struct {
		os      OS
		product string
		extra   map[string]string
	}
	mix := []kind{
		{Ubuntu2204, "NVIDIA-L40S", nil}, {Ubuntu2204, "NVIDIA-L40S", nil}, {Ubuntu2204, "NVIDIA-L40S", nil},
		{Ubuntu2204, "NVIDIA-L40S", nil},
		{Ubuntu2204, "NVIDIA-H100-80GB-HBM3", mig}, {Ubuntu2204, "NVIDIA-H100-80GB-HBM3", mig},
		{Ubuntu2404, "NVIDIA-L40S", nil}, {Ubuntu2404, "NVIDIA-L40S", nil}, {Ubuntu2404, "NVIDIA-H100-80GB-HBM3", mig},
		{RHEL96, "NVIDIA-L40S", nil}, {RHEL96, "NVIDIA-L40S", nil}, {RHEL96, "NVIDIA-L40S", nil},
		{Ubuntu2404, "NVIDIA-A100-SXM4-80GB", pool("r570", "6.8.0-60-generic")},
		{RHEL96, "NVIDIA-A100-SXM4-80GB", pool("r570", "5.14.0-570.12.1.el9_6.x86_64")},
		{Ubuntu2204, "NVIDIA-A100-SXM4-80GB", pool("precompiled", "5.15.0-140-generic")},
		{Ubuntu2204, "NVIDIA-A100-SXM4-80GB", pool("precompiled", "6.8.0-60-generic")},
		{Ubuntu2204, "NVIDIA-A100-SXM4-80GB", pool("host", "6.8.0-60-generic")},
		{Ubuntu2204, "NVIDIA-H100-80GB-HBM3", role("vm-passthrough")}, {Ubuntu2204, "NVIDIA-H100-80GB-HBM3", role("vm-passthrough")},
		{Ubuntu2204, "NVIDIA-L40S", role("vm-vgpu")},
	}
	out := make([]Node, 0, n)
	for i := range n {
		k := mix[i%len(mix)]
		out = append(out, gpuNode(fmt.Sprintf("scale-%04d", i+1), k.os, k.product, maps.Clone(k.extra)))
	}
	return out
}
