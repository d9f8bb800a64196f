package chart

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/placement"
)

var vmVGPUProfile = filepath.Join(chartrender.RepoRoot(), "values", "vm-vgpu.yaml")

const vgpuPoolLabel = "nvidia.com/vgpu-manager.pool"

// vgpuPools: on top of the vm-vgpu profile (default pool: ubuntu22.04), an older vGPU manager on two OSes, a pool
// on ubuntu24.04 with its own driver manager tag, and nodes with a pre-installed vGPU manager.
const vgpuPools = `
vgpuManager:
  pools:
    - name: r570
      nodeSelector:
        matchLabels: {nvidia.com/vgpu-manager.pool: r570}
      image: {tag: "570.172.07"}
      os: [ubuntu22.04, rhel9]
    - name: noble
      nodeSelector:
        matchExpressions:
          - {key: nvidia.com/vgpu-manager.pool, operator: In, values: [noble]}
      os: [ubuntu24.04]
      manager:
        image: {tag: "0.2.0"}
    - name: preinstalled
      source: host
      nodeSelector:
        matchLabels: {nvidia.com/vgpu-manager.pool: host}
`

// vgpuNode is a vm-vgpu GPU node of an OS, in a vGPU manager pool when pool is not empty.
func vgpuNode(name string, o nodefixtures.OS, workload, pool string) *corev1.Node {
	l := o.Labels()
	maps.Copy(l, map[string]string{
		"feature.node.kubernetes.io/pci-10de.present": "true",
		"nvidia.com/gpu.present":                      "true",
		"nvidia.com/gpu.product":                      "NVIDIA-L40S",
		"nvidia.com/gpu.workload.config":              workload,
	})
	if pool != "" {
		l[vgpuPoolLabel] = pool
	}
	return nodefixtures.Node{Name: name, Labels: l, GPUs: 8}.Object()
}

func vgpuPoolsFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "vgpu-pools.yaml")
	if err := os.WriteFile(f, []byte(vgpuPools), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// Each container pool renders one vGPU manager DaemonSet per OS tag, and every vm-vgpu node gets exactly the
// DaemonSet of its pool and OS (none on host pools, none on other roles).
func TestVGPUManagerPools(t *testing.T) {
	stream := render(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)})
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		t.Fatal(err)
	}
	var vgpu []placement.DaemonSet
	for _, ds := range dss {
		if ds.Operand == "vgpu-manager" {
			vgpu = append(vgpu, ds)
		}
	}
	var names []string
	for _, ds := range vgpu {
		names = append(names, ds.Name)
	}
	slices.Sort(names)
	want := []string{
		"nvidia-vgpu-manager-daemonset-ubuntu2204",
		"nvidia-vgpu-manager-noble-ubuntu2404",
		"nvidia-vgpu-manager-r570-rhel9", "nvidia-vgpu-manager-r570-ubuntu2204",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("vGPU manager DaemonSets:\n got  %v\n want %v", names, want)
	}

	nodes := []*corev1.Node{
		vgpuNode("default-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", ""),
		vgpuNode("default-ubuntu2404", nodefixtures.Ubuntu2404, "vm-vgpu", ""), // the default pool lists ubuntu22.04 only
		vgpuNode("r570-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "r570"),
		vgpuNode("r570-rhel9", nodefixtures.RHEL96, "vm-vgpu", "r570"),
		vgpuNode("r570-ubuntu2404", nodefixtures.Ubuntu2404, "vm-vgpu", "r570"), // not an OS of the pool
		vgpuNode("noble-ubuntu2404", nodefixtures.Ubuntu2404, "vm-vgpu", "noble"),
		vgpuNode("host-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "host"),
		vgpuNode("unknown-pool-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "other"), // default pool
		vgpuNode("passthrough-r570", nodefixtures.Ubuntu2204, "vm-passthrough", "r570"),
	}
	p, err := placement.Place(vgpu, nodes)
	if err != nil {
		t.Fatal(err)
	}
	expect := map[string]string{
		"default-ubuntu2204":      "nvidia-vgpu-manager-daemonset-ubuntu2204",
		"r570-ubuntu2204":         "nvidia-vgpu-manager-r570-ubuntu2204",
		"r570-rhel9":              "nvidia-vgpu-manager-r570-rhel9",
		"noble-ubuntu2404":        "nvidia-vgpu-manager-noble-ubuntu2404",
		"unknown-pool-ubuntu2204": "nvidia-vgpu-manager-daemonset-ubuntu2204",
	}
	for _, n := range nodes {
		if got := p[n.Name]["vgpu-manager"]; got != expect[n.Name] {
			t.Errorf("node %s: vGPU manager DaemonSet %q, want %q", n.Name, got, expect[n.Name])
		}
	}

	// the pool's overrides reach its pods; unset fields inherit the top-level values
	for name, img := range map[string]string{
		"nvidia-vgpu-manager-r570-rhel9":           "nvcr.io/nvaie/vgpu-manager:570.172.07-rhel9",
		"nvidia-vgpu-manager-noble-ubuntu2404":     "nvcr.io/nvaie/vgpu-manager:595.91.07-ubuntu24.04",
		"nvidia-vgpu-manager-daemonset-ubuntu2204": "nvcr.io/nvaie/vgpu-manager:595.91.07-ubuntu22.04",
	} {
		ds := driverDaemonSet(t, stream, name)
		if got := ds.Spec.Template.Spec.Containers[0].Image; got != img {
			t.Errorf("%s: image %s, want %s", name, got, img)
		}
		manager := ds.Spec.Template.Spec.InitContainers[0].Image
		if strings.HasSuffix(manager, ":0.2.0") != strings.Contains(name, "-noble-") {
			t.Errorf("%s: driver manager image %s", name, manager)
		}
	}
}

// Two pools that can select one node fail at render, naming both pools and the label.
func TestVGPUManagerPoolsOverlap(t *testing.T) {
	_, err := renderErr(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)},
		"vgpuManager.pools[1].nodeSelector.matchExpressions[0].values={noble,r570}")
	want := `vgpuManager.pools: pools "r570" and "noble" can select the same node: label nvidia.com/vgpu-manager.pool does not separate them`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want an error containing %q, got %v", want, err)
	}
}
