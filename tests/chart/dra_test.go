package chart

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// draRole is the container role on a node whose pool allocates GPUs through DRA: the DRA kubelet plugin instead of
// the device plugin (and never the MPS control daemon, nor the MIG manager, which would change the MIG layout under
// a DRA kubelet plugin that lists it once, at its start); GFD, the DCGM exporter and the validator as everywhere.
const draRole = "driver container-toolkit dra-driver dcgm-exporter gpu-feature-discovery operator-validator"

// dra: every pool on DRA. The device-plugin switch means nothing there; the DRA switch, off or paused, keeps the
// plugin off (and the device plugin does not come back). The driver manager does not pause the DRA switch yet.
// dra-mixed: the same, but the legacy pool stays on the device plugin.
func init() {
	dra := sandboxOff(draRole)
	for _, n := range []string{"mps-capable", "container-mps-capable", "mig-capable", "container-mig-capable", "device-plugin-off",
		"device-plugin-empty", "dra-legacy", "dra-legacy-mps-capable", "dra-legacy-mig-capable"} {
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
	mixed["dra-legacy-mig-capable"] = containerRole + " mig-manager"
	roleMatrix["dra-mixed"] = mixed
}

// TestGPUAllocationNeverBoth: in every profile, alone and with the DRA driver turned on for the default pool or for
// one pool only (the legacy fixtures; in VM-default profiles those are VM nodes), no fixture node is selected by both the device plugin (or its MPS daemon) and the DRA kubelet
// plugin.
func TestGPUAllocationNeverBoth(t *testing.T) {
	t.Parallel()
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
			// driver-pools: its pools select on the same label, pool names would clash; host-driver: no driver
			// manager to move a pool (TestGPUAllocationNeedsADriverManagerToMoveAPool)
			if p.name != "driver-pools" && p.name != "host-driver" {
				sets["one-pool-dra"] = onePool
			}
		}
		for name, set := range sets {
			t.Run(p.name+"/"+name, func(t *testing.T) {
				dss, err := placement.DaemonSets(render(t, newestKube, p.files, set...))
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
// (and its MPS daemon), and from the MIG manager.
func TestGPUAllocationOnePoolMoves(t *testing.T) {
	t.Parallel()
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
			if plugin || slices.Contains(ops, "mig-manager") || !slices.Contains(ops, "dra-driver") {
				t.Errorf("node %s of the moved pool: %v; want the DRA driver and no device plugin or MIG manager", n.Name, ops)
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
	if moved != 3 || stayed == 0 {
		t.Errorf("%d nodes moved (want the 3 legacy fixtures), %d kept the device plugin (want some)", moved, stayed)
	}
}

// TestGPUAllocationNeverBothWhateverTheLabel: whatever a node's allocation label says (absent, either mode, a value
// an admin mistyped), no node is selected by both the device plugin (or its MPS daemon) and the DRA kubelet plugin,
// with either default.
func TestGPUAllocationNeverBothWhateverTheLabel(t *testing.T) {
	t.Parallel()
	for _, def := range []string{nodestate.AllocationDevicePlugin, nodestate.AllocationDRA} {
		other := nodestate.AllocationDRA
		if def == other {
			other = nodestate.AllocationDevicePlugin
		}
		dss, err := placement.DaemonSets(render(t, newestKube, nil, "draDriver.enabled=true", "driver.gpuAllocation="+def,
			"driver.pools[0].name=moved", "driver.pools[0].nodeSelector.matchLabels.nvidia\\.com/driver\\.pool="+nodefixtures.DRALegacyPool,
			"driver.pools[0].gpuAllocation="+other))
		if err != nil {
			t.Fatal(err)
		}
		for _, label := range []string{"", nodestate.AllocationDevicePlugin, nodestate.AllocationDRA, "DRA"} {
			runs := map[string]int{}
			for _, fixture := range nodefixtures.RoleMatrix() {
				n := fixture.Object()
				if label != "" {
					n.Labels[nodestate.AllocationLabel] = label
				}
				var on []string
				for _, ds := range dss {
					if ds.Operand != "device-plugin" && ds.Operand != "mps-control-daemon" && ds.Operand != "dra-driver" {
						continue
					}
					ok, err := ds.Schedules(n)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						on = append(on, ds.Operand)
						runs[ds.Operand]++
					}
				}
				if slices.Contains(on, "dra-driver") && len(on) > 1 {
					t.Errorf("default %s, node %s labelled %q: %v", def, n.Name, label, on)
				}
			}
			// the label decides: a node labelled with a mode gets that mode's plugin; an unlabelled one the default's
			want := map[string]string{"": def, nodestate.AllocationDevicePlugin: "device-plugin", nodestate.AllocationDRA: "dra-driver"}[label]
			if want == nodestate.AllocationDRA {
				want = "dra-driver"
			}
			if want != "" && runs[want] == 0 {
				t.Errorf("default %s, nodes labelled %q: no node runs %s (%v)", def, label, want, runs)
			}
		}
	}
}

// TestGPUAllocationPoolSwitchChangesOnlyItsDriverDaemonSets: moving one pool between the device plugin and DRA, either
// way, changes that pool's driver DaemonSets (its GPU_ALLOCATION) and no other DaemonSet: the device plugin, its MPS
// daemon, the DRA kubelet plugin, the validator and every other pool's driver keep their pod templates, so nothing
// rolls outside the pool. (The last pool leaving the device plugin takes its DaemonSets away; the DRA kubelet
// plugin stays while draDriver.enabled.)
func TestGPUAllocationPoolSwitchChangesOnlyItsDriverDaemonSets(t *testing.T) {
	t.Parallel()
	daemonSets := func(mode string) map[string]string {
		stream := render(t, newestKube, nil, "draDriver.enabled=true", "driver.gpuAllocation=dra",
			"driver.pools[0].name=moving", "driver.pools[0].nodeSelector.matchLabels.pool=moving", "driver.pools[0].gpuAllocation="+mode,
			"driver.pools[1].name=stays", "driver.pools[1].nodeSelector.matchLabels.pool=stays", "driver.pools[1].gpuAllocation=device-plugin")
		out := map[string]string{}
		for _, doc := range strings.Split(stream, "\n---\n") {
			if strings.Contains(doc, "\nkind: DaemonSet\n") {
				name := doc[strings.Index(doc, "\n  name: ")+len("\n  name: "):]
				out[name[:strings.Index(name, "\n")]] = doc
			}
		}
		return out
	}
	before, after := daemonSets("device-plugin"), daemonSets("dra")
	var changed []string
	for name, doc := range before {
		if after[name] != doc {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	if len(before) != len(after) || len(changed) == 0 {
		t.Fatalf("DaemonSets before %d, after %d, changed %v", len(before), len(after), changed)
	}
	for _, name := range changed {
		if !strings.HasPrefix(name, "nvidia-driver-moving-") {
			t.Errorf("DaemonSet %s changed with the moving pool's allocation: want only the pool's own driver DaemonSets", name)
		}
	}
}

// TestGPUAllocationNeedsADriverManagerToMoveAPool: a pool whose nodes no driver manager labels (host or no driver
// source, or the driver off) cannot differ from the default mode: the render fails naming the pool.
func TestGPUAllocationNeedsADriverManagerToMoveAPool(t *testing.T) {
	t.Parallel()
	pool := []string{"draDriver.enabled=true", "driver.pools[0].name=gpus", "driver.pools[0].nodeSelector.matchLabels.a=b",
		"driver.pools[0].gpuAllocation=dra"}
	for name, set := range map[string][]string{
		"host":       append(slices.Clone(pool), "driver.pools[0].source=host"),
		"none":       append(slices.Clone(pool), "driver.pools[0].source=none"),
		"driver-off": append(slices.Clone(pool), "driver.enabled=false"),
	} {
		_, err := renderErr(t, newestKube, nil, set...)
		if err == nil || !strings.Contains(err.Error(), "driver.pools[0] (gpus): gpuAllocation=dra") {
			t.Errorf("%s: %v; want the pool named", name, err)
		}
	}
	if _, err := renderErr(t, newestKube, nil, slices.Concat(pool, []string{"driver.pools[0].source=container"})...); err != nil {
		t.Errorf("a container pool on DRA: %v", err)
	}
}

// TestGateReadsResourceSlicesOnlyWithDRA: with the DRA driver the post-install gate and `helm test` run `check
// --resource-slices` and may read ResourceSlices (to hold DRA nodes until theirs are published); without it they
// neither pass the flag nor get the right, so a cluster without resource.k8s.io/v1 is never asked for it.
func TestGateReadsResourceSlicesOnlyWithDRA(t *testing.T) {
	t.Parallel()
	slicesRead := rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch"}}
	for _, tc := range []struct {
		profile string
		dra     bool
	}{{"dra.yaml", true}, {"dra-mixed.yaml", true}, {"container-only.yaml", false}} {
		t.Run(tc.profile, func(t *testing.T) {
			stream := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", tc.profile)})
			for _, name := range []string{gateName, testName} {
				role := decodeNamed[rbacv1.ClusterRole](t, stream, "ClusterRole", name+"-"+chartrender.Namespace)
				if got := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return equalJSON(r, slicesRead) }); got != tc.dra {
					t.Errorf("ClusterRole of %s reads resourceslices: %v, want %v: %s", name, got, tc.dra, mustJSON(role.Rules))
				}
			}
			gate := decodeNamed[batchv1.Job](t, stream, "Job", gateName).Spec.Template.Spec.Containers[0]
			test := decodeNamed[corev1.Pod](t, stream, "Pod", testName).Spec.Containers[0]
			for _, c := range []corev1.Container{gate, test} {
				if got := slices.Contains(c.Args, "--resource-slices"); got != tc.dra {
					t.Errorf("%s args %v: --resource-slices %v, want %v", c.Name, c.Args, got, tc.dra)
				}
			}
		})
	}
}
