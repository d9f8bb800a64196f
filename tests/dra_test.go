package tests

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/placement"
)

// draRole is the container role on a node whose pool allocates GPUs through DRA: the DRA kubelet plugin instead of
// the device plugin (and never the MPS control daemon); GFD, the DCGM exporter and the validator as everywhere.
const draRole = "driver container-toolkit dra-driver dcgm-exporter gpu-feature-discovery operator-validator"

// dra: every pool on DRA. The device-plugin switch means nothing there; the DRA switch, off or paused, keeps the
// plugin off (and the device plugin does not come back). The driver manager does not pause the DRA switch yet.
// dra-mixed: the same, but the legacy pool stays on the device plugin.
func init() {
	dra := sandboxOff(draRole)
	for _, n := range []string{"mps-capable", "container-mps-capable", "device-plugin-off", "device-plugin-empty", "dra-legacy", "dra-legacy-mps-capable"} {
		dra[n] = draRole
	}
	dra["paused-for-driver-upgrade"] = "driver dra-driver"
	dra["dra-opted-out"] = strings.Replace(draRole, "dra-driver ", "", 1)
	dra["dra-paused"] = strings.Replace(draRole, "dra-driver ", "", 1)
	roleMatrix["dra"] = dra

	mixed := matrix{}
	for k, v := range dra {
		mixed[k] = v
	}
	mixed["dra-legacy"] = containerRole
	mixed["dra-legacy-mps-capable"] = containerRole + " mps-control-daemon"
	roleMatrix["dra-mixed"] = mixed
}

// TestGPUAllocationNeverBoth: in every profile, alone and with the DRA driver turned on for the default pool or for
// one pool only (the legacy fixtures; in VM-default profiles those are VM nodes), no fixture node is selected by both the device plugin (or its MPS daemon) and the DRA kubelet
// plugin.
func TestGPUAllocationNeverBoth(t *testing.T) {
	var nodes []*corev1.Node
	for _, n := range nodefixtures.RoleMatrix() {
		nodes = append(nodes, n.Object())
	}
	onePool := []string{"draDriver.enabled=true",
		"driver.pools[0].name=moved", "driver.pools[0].nodeSelector.matchLabels.nvidia\\.com/driver\\.pool=" + nodefixtures.DRALegacyPool,
		"driver.pools[0].gpuAllocation=dra"}
	for _, p := range profiles(t) {
		sets := map[string][]string{"alone": nil}
		if !strings.Contains(p.name, "dra") {
			sets["all-dra"] = []string{"draDriver.enabled=true", "driver.gpuAllocation=dra"}
			if p.name != "driver-pools" { // its pools select on the same label; pool names would clash
				sets["one-pool-dra"] = onePool
			}
		}
		for name, set := range sets {
			t.Run(p.name+"/"+name, func(t *testing.T) {
				dss, err := placement.DaemonSets(render(t, newestKube, []string{p.file}, set...))
				if err != nil {
					t.Fatal(err)
				}
				got, err := placement.Place(dss, nodes)
				if err != nil {
					t.Fatal(err)
				}
				dra := 0
				for _, n := range nodes {
					ops := got.Operands(n.Name)
					plugin := slices.Contains(ops, "device-plugin") || slices.Contains(ops, "mps-control-daemon")
					if plugin && slices.Contains(ops, "dra-driver") {
						t.Errorf("node %s runs the device plugin and the DRA driver: %v", n.Name, ops)
					}
					if slices.Contains(ops, "dra-driver") {
						dra++
					}
				}
				if (name == "all-dra" || strings.Contains(p.name, "dra")) && dra == 0 {
					t.Errorf("the DRA driver runs on no fixture node")
				}
			})
		}
	}
}

// TestGPUAllocationOnePoolMoves: a pool moved to DRA takes its nodes, and only its nodes, from the device plugin
// (and its MPS daemon).
func TestGPUAllocationOnePoolMoves(t *testing.T) {
	stream := render(t, newestKube, nil, "draDriver.enabled=true",
		"driver.pools[0].name=moved", "driver.pools[0].nodeSelector.matchLabels.nvidia\\.com/driver\\.pool="+nodefixtures.DRALegacyPool,
		"driver.pools[0].gpuAllocation=dra")
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*corev1.Node
	for _, n := range nodefixtures.RoleMatrix() {
		nodes = append(nodes, n.Object())
	}
	got, err := placement.Place(dss, nodes)
	if err != nil {
		t.Fatal(err)
	}
	moved, stayed := 0, 0
	for _, n := range nodes {
		ops := got.Operands(n.Name)
		plugin := slices.Contains(ops, "device-plugin") || slices.Contains(ops, "mps-control-daemon")
		if n.Labels[nodefixtures.DriverPoolLabel] == nodefixtures.DRALegacyPool {
			moved++
			if plugin || !slices.Contains(ops, "dra-driver") {
				t.Errorf("node %s of the moved pool: %v; want the DRA driver and no device plugin", n.Name, ops)
			}
			continue
		}
		if slices.Contains(ops, "dra-driver") {
			t.Errorf("node %s outside the moved pool runs the DRA driver: %v", n.Name, ops)
		}
		if plugin {
			stayed++
		}
	}
	if moved != 2 || stayed == 0 {
		t.Errorf("%d nodes moved (want the 2 legacy fixtures), %d kept the device plugin (want some)", moved, stayed)
	}
}

// TestProfileKubeFloor: a profile that needs a newer Kubernetes than the oldest supported one fails to render on
// the older ones, saying which version it needs.
func TestProfileKubeFloor(t *testing.T) {
	checked := 0
	for _, p := range profiles(t) {
		for _, kv := range chartrender.KubeVersions {
			if slices.Contains(p.kubeVersions(), kv) {
				continue
			}
			checked++
			_, err := renderErr(t, kv, []string{p.file})
			if err == nil || !strings.Contains(err.Error(), "Kubernetes >= "+p.minKube) {
				t.Errorf("%s on %s: got %v, want an error naming Kubernetes >= %s", p.name, kv, err, p.minKube)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no profile needs a newer Kubernetes than the oldest supported: the DRA profiles lost their floor")
	}
}
