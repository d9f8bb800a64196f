package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// The DESIGN.md role table: which operands each node role runs (columns are the nvidia.com/gpu.deploy.<operand>
// suffixes; mps-control-daemon is the device plugin's MPS daemon). dcgm is off in every profile, so it appears in
// no row; node-status-exporter runs only in the monitoring profile.
const (
	containerRole = "driver container-toolkit device-plugin dcgm-exporter gpu-feature-discovery operator-validator"
	// container nodes without the driver DaemonSet (host-installed driver)
	containerHostDriver = "container-toolkit device-plugin dcgm-exporter gpu-feature-discovery operator-validator"
	passthroughKubevirt = "vfio-manager sandbox-device-plugin sandbox-validator"
	passthroughKata     = "vfio-manager kata-sandbox-device-plugin sandbox-validator"
	passthroughCC       = "vfio-manager kata-sandbox-device-plugin sandbox-validator cc-manager"
	vgpuNoManager       = "vgpu-device-manager sandbox-device-plugin sandbox-validator"
	vgpuWithManager     = "vgpu-manager vgpu-device-manager sandbox-device-plugin sandbox-validator"
	vgpuCC              = "vgpu-device-manager sandbox-device-plugin sandbox-validator cc-manager"
	none                = ""
)

// matrix is the expected operand set per fixture node for one shape of profile.
type matrix map[string]string

// sandboxOff: every GPU node is a container node, whatever its role label says.
func sandboxOff(role string) matrix {
	m := matrix{
		"container-ubuntu2204":      role,
		"container-ubuntu2404":      role,
		"container-rhel9":           role,
		"container-labelled":        role,
		"mig-capable":               role + " mig-manager",
		"mps-capable":               role + " mps-control-daemon",
		"container-mig-capable":     role + " mig-manager",
		"container-mps-capable":     role + " mps-control-daemon",
		"device-plugin-off":         strings.Replace(role, "device-plugin ", "", 1),
		"device-plugin-empty":       role,
		"paused-for-driver-upgrade": onlyDriver(role),
		"operands-off":              none,
		"container-tainted":         role,
		"container-dedicated":       none, // a taint the chart does not tolerate
		"vm-passthrough":            role,
		"vm-vgpu":                   role,
		"vm-passthrough-cc-resumed": role,
		"role-unknown":              role,
		"cpu-only":                  none,
	}
	for _, n := range nodefixtures.DriverPools() {
		m[n.Name] = role
	}
	// outside the DRA profiles: ordinary GPU nodes; the DRA switch is no container operand's
	m["dra-legacy"] = role
	m["dra-legacy-mps-capable"] = role + " mps-control-daemon"
	m["dra-legacy-mig-capable"] = role + " mig-manager"
	m["dra-opted-out"] = role
	m["dra-paused"] = role
	return m
}

func onlyDriver(role string) string {
	if strings.HasPrefix(role, "driver ") {
		return "driver"
	}
	return none
}

// sandboxOn: roles come from nvidia.com/gpu.workload.config; unlabelled and unknown-role nodes take def.
func sandboxOn(def, container, passthrough, vgpu string) matrix {
	roles := map[string]string{"container": container, "vm-passthrough": passthrough, "vm-vgpu": vgpu}
	d := roles[def]
	m := matrix{
		"container-ubuntu2404":  container,
		"container-rhel9":       container,
		"container-labelled":    container,
		"container-mig-capable": container + " mig-manager",
		"container-mps-capable": container + " mps-control-daemon",
		"vm-passthrough":        passthrough,
		"vm-vgpu":               vgpu,
		// the CC manager's resumed switches ("") keep every sandbox operand
		"vm-passthrough-cc-resumed": passthrough,
		"role-unknown":              d,
		"operands-off":              none,
		"container-dedicated":       none,
		"cpu-only":                  none,
	}
	if def == "container" {
		for k, v := range sandboxOff(container) {
			if _, set := m[k]; !set {
				m[k] = v
			}
		}
		return m
	}
	// Unlabelled GPU nodes have the default VM role: container-only switches (MIG, MPS, pauses of container
	// operands) change nothing there.
	for _, n := range []string{"container-ubuntu2204", "mig-capable",
		"mps-capable", "device-plugin-off", "device-plugin-empty", "paused-for-driver-upgrade", "container-tainted"} {
		m[n] = d
	}
	for _, n := range slices.Concat(nodefixtures.DriverPools(), nodefixtures.DRA()) {
		m[n.Name] = d // unlabelled GPU nodes
	}
	return m
}

var roleMatrix = map[string]matrix{
	"container-only":   sandboxOff(containerRole),
	"private-registry": sandboxOff(containerRole),
	"nfd-external":     sandboxOff(containerRole),
	"monitoring":       sandboxOff(containerRole + " node-status-exporter"),
	"host-driver":      sandboxOff(containerHostDriver),
	"vm-passthrough":   sandboxOn("vm-passthrough", containerRole, passthroughKubevirt, vgpuNoManager),
	// its vGPU manager serves ubuntu22.04 only: unlabelled GPU nodes of other OSes get none
	"vm-vgpu": withRows(sandboxOn("vm-vgpu", containerRole, passthroughKubevirt, vgpuWithManager),
		matrix{"pool-r570-ubuntu2404": vgpuNoManager, "pool-r570-rhel9": vgpuNoManager}),
	"mixed":        sandboxOn("container", containerRole, passthroughKubevirt, vgpuWithManager),
	"kata":         sandboxOn("vm-passthrough", containerRole, passthroughKata, vgpuNoManager),
	"confidential": sandboxOn("vm-passthrough", containerRole, passthroughCC, vgpuCC),
}

// TestRoleMatrix matches every profile's operand DaemonSets against the fixture nodes with the real node-affinity
// evaluator and compares the operands each node gets with the table above. Placement fails when a node gets two
// DaemonSets of one operand (e.g. two driver OS variants); every DaemonSet must select some fixture node.
func TestRoleMatrix(t *testing.T) {
	t.Parallel()
	var base []*corev1.Node
	for _, n := range nodefixtures.RoleMatrix() {
		base = append(base, n.Object())
	}
	for _, p := range profiles(t) {
		t.Run(p.name, func(t *testing.T) {
			nodes := slices.Clone(base)
			for _, n := range extraNodes[p.name] {
				nodes = append(nodes, n.Object())
			}
			want, ok := roleMatrix[p.name]
			if !ok {
				t.Fatalf("profile %s has no row in the role matrix: add one", p.name)
			}
			dss, err := placement.DaemonSets(render(t, newestKube, p.files))
			if err != nil {
				t.Fatal(err)
			}
			got, err := placement.Place(dss, nodes)
			if err != nil {
				t.Fatal(err)
			}
			used := map[string]bool{}
			for _, n := range nodes {
				for _, ds := range got[n.Name] {
					used[ds] = true
				}
				expected, ok := want[n.Name]
				if !ok {
					t.Fatalf("node %s has no expected row", n.Name)
				}
				if g, w := fmt.Sprint(got.Operands(n.Name)), sortedFields(expected); g != w {
					t.Errorf("node %s:\n got  %s\n want %s", n.Name, g, w)
				}
			}
			for _, ds := range dss {
				if !used[ds.Name] {
					t.Errorf("DaemonSet %s selects none of the fixture nodes", ds.Name)
				}
			}
		})
	}
}

// extraNodes are fixture nodes that only some profiles are matched against, besides nodefixtures.RoleMatrix (an OS
// that only that profile serves).
var extraNodes = map[string][]nodefixtures.Node{}

// withRows returns m with the rows of over replacing its own.
func withRows(m, over matrix) matrix {
	for k, v := range over {
		m[k] = v
	}
	return m
}

func sortedFields(s string) string {
	f := strings.Fields(s)
	slices.Sort(f)
	return fmt.Sprint(f)
}
