package nodefixtures

import "testing"

func TestScaleMix(t *testing.T) {
	nodes := Scale(1000)
	if len(nodes) != 1000 || nodes[0].Name != "scale-0001" || nodes[999].Name != "scale-1000" {
		t.Fatalf("got %d nodes, %s … %s", len(nodes), nodes[0].Name, nodes[len(nodes)-1].Name)
	}
	count := map[string]int{}
	for _, n := range nodes {
		count["os="+n.Labels["feature.node.kubernetes.io/system-os_release.ID"]+n.Labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"]]++
		count["role="+n.Labels["nvidia.com/gpu.workload.config"]]++
		count["pool="+n.Labels[DriverPoolLabel]]++
		if n.Labels["nvidia.com/mig.capable"] == "true" {
			count["mig"]++
		}
	}
	want := map[string]int{
		"os=ubuntu22.04": 600, "os=ubuntu24.04": 200, "os=rhel9.6": 200,
		"role=": 850, "role=vm-passthrough": 100, "role=vm-vgpu": 50,
		"pool=": 750, "pool=r570": 100, "pool=precompiled": 100, "pool=host": 50, "mig": 150,
	}
	for k, v := range want {
		if count[k] != v {
			t.Errorf("%s: %d nodes, want %d (all: %v)", k, count[k], v, count)
		}
	}
	// the mix's label maps are not shared between nodes
	nodes[4].Labels["x"] = "y"
	if _, ok := nodes[24].Labels["x"]; ok {
		t.Error("nodes share a label map")
	}
}
