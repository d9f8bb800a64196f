package tests

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/placement"
)

// operandDaemonSets decodes the rendered DaemonSets of one operand (app.kubernetes.io/component), by name.
func operandDaemonSets(t *testing.T, stream, component string) map[string]*appsv1.DaemonSet {
	t.Helper()
	out := map[string]*appsv1.DaemonSet{}
	for _, o := range objects(t, stream) {
		if o.kind() != "DaemonSet" {
			continue
		}
		ds := decode[appsv1.DaemonSet](t, o)
		if ds.Labels["app.kubernetes.io/component"] == component {
			out[ds.Name] = ds
		}
	}
	return out
}

// podDigests are the DRIVER_CONFIG_DIGEST values of a pod template's containers (init and main), by container.
func podDigests(spec corev1.PodSpec) map[string]string {
	out := map[string]string{}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, e := range c.Env {
			if e.Name == "DRIVER_CONFIG_DIGEST" {
				out[c.Name] = e.Value
			}
		}
	}
	return out
}

// neutral is a copy of node without its nvidia.com/gpu.deploy.* switches and taints: what is left decides whether a
// GPU operand may run there by role and by its own node selection.
func neutral(node *corev1.Node) *corev1.Node {
	n := node.DeepCopy()
	maps.DeleteFunc(n.Labels, func(k, _ string) bool { return strings.HasPrefix(k, "nvidia.com/gpu.deploy.") })
	n.Spec.Taints = nil
	return n
}

func selects(t *testing.T, terms []corev1.NodeSelectorTerm, node *corev1.Node, what string) bool {
	t.Helper()
	ok, err := schedule.Selects(&corev1.NodeSelector{NodeSelectorTerms: terms}, node)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return ok
}

// TestDriverPoolsListTheDriverDaemonSets: in every profile, the driver DaemonSets that DRIVER_POOLS lists (what the
// pre-upgrade plan compares digests with) are exactly the rendered driver DaemonSets, each with the
// DRIVER_CONFIG_DIGEST its pod template carries, in the pool whose selection covers its nodes; and on the fixture
// nodes each DaemonSet's nodeSelectorTerms select exactly the GPU container nodes the DaemonSet is placed on (with
// the scheduler's evaluator). "GPU container nodes" are those the operator validator, a container-role operand with
// no node selection of its own, runs on once the gpu.deploy.* switches and taints are set aside; the driver is
// placed by the same rule on the same neutralized nodes, so the comparison holds for paused, switched-off and
// tainted nodes too, and on the nodes as they are a placed DaemonSet is always one its terms select. So the plan's
// DaemonSetFor names, for a node, the DaemonSet whose pod runs there.
func TestDriverPoolsListTheDriverDaemonSets(t *testing.T) {
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
			stream := render(t, newestKube, []string{p.file})
			pools := gatePools(t, stream)
			rendered := operandDaemonSets(t, stream, "driver")

			listed := map[string]driverPool{} // DaemonSet -> its pool
			for _, pool := range pools {
				if pool.Source != "container" && len(pool.DaemonSets) > 0 {
					t.Errorf("pool %s (source %s) lists driver DaemonSets %v", pool.Name, pool.Source, pool.DaemonSets)
				}
				if pool.MaxUnavailable == nil || pool.AutoUpgrade == nil || pool.Canary == nil || pool.MaxFailures == nil {
					t.Errorf("pool %s: maxUnavailable %v, autoUpgrade %v, canary %v, maxFailures %v; want the pool's upgradePolicy",
						pool.Name, pool.MaxUnavailable, pool.AutoUpgrade, pool.Canary, pool.MaxFailures)
				}
				for _, ds := range pool.DaemonSets {
					if _, dup := listed[ds.Name]; dup {
						t.Errorf("driver DaemonSet %s listed twice", ds.Name)
					}
					listed[ds.Name] = pool
				}
			}
			if got, want := slices.Sorted(maps.Keys(listed)), slices.Sorted(maps.Keys(rendered)); !slices.Equal(got, want) {
				t.Fatalf("DRIVER_POOLS lists driver DaemonSets\n %v\nthe chart renders\n %v", got, want)
			}
			if len(rendered) == 0 {
				return // no containerized driver (host-driver): nothing to place
			}

			var validators []placement.DaemonSet
			var drivers []placement.DaemonSet
			dss, err := placement.DaemonSets(stream)
			if err != nil {
				t.Fatal(err)
			}
			for _, ds := range dss {
				switch ds.Operand {
				case "operator-validator":
					validators = append(validators, ds)
				case "driver":
					drivers = append(drivers, ds)
				}
			}
			if len(validators) != 1 || len(drivers) != len(rendered) {
				t.Fatalf("%d validator and %d of %d driver DaemonSets found for placement", len(validators), len(drivers), len(rendered))
			}
			containerNode := map[string]bool{}
			for _, n := range nodes {
				ok, err := validators[0].Schedules(neutral(n))
				if err != nil {
					t.Fatal(err)
				}
				containerNode[n.Name] = ok
			}

			selectedSome, skippedSome := false, false
			for _, pool := range pools {
				for _, entry := range pool.DaemonSets {
					ds := rendered[entry.Name]
					digests := podDigests(ds.Spec.Template.Spec)
					if len(digests) < 2 {
						t.Errorf("%s: DRIVER_CONFIG_DIGEST in %d containers, want the driver manager's and the driver's", ds.Name, len(digests))
					}
					for c, d := range digests {
						if d != entry.Digest {
							t.Errorf("%s: container %s has DRIVER_CONFIG_DIGEST %s, DRIVER_POOLS says %s", ds.Name, c, d, entry.Digest)
						}
					}
					if entry.Digest == "" {
						t.Errorf("%s: no digest in DRIVER_POOLS", ds.Name)
					}
					var pds placement.DaemonSet
					for _, d := range drivers {
						if d.Name == ds.Name {
							pds = d
						}
					}
					for _, n := range nodes {
						if n.Labels["nvidia.com/gpu.present"] != "true" {
							continue
						}
						sel := selects(t, entry.NodeSelectorTerms, n, ds.Name)
						placed, err := pds.Schedules(n)
						if err != nil {
							t.Fatal(err)
						}
						placedNeutral, err := pds.Schedules(neutral(n))
						if err != nil {
							t.Fatal(err)
						}
						if placed && (!sel || !containerNode[n.Name]) {
							t.Errorf("%s runs on %s (a container node: %v), but its DRIVER_POOLS terms select it: %v", ds.Name, n.Name, containerNode[n.Name], sel)
						}
						if containerNode[n.Name] && sel != placedNeutral {
							t.Errorf("GPU container node %s: %s is placed there: %v, its DRIVER_POOLS terms select it: %v", n.Name, ds.Name, placedNeutral, sel)
						}
						if sel && !selects(t, pool.NodeSelectorTerms, n, "pool "+pool.Name) {
							t.Errorf("%s selects %s, which its pool %s does not", ds.Name, n.Name, pool.Name)
						}
						if containerNode[n.Name] {
							selectedSome = selectedSome || sel
							skippedSome = skippedSome || !sel
						}
					}
				}
			}
			if !selectedSome || !skippedSome {
				t.Fatalf("on the fixtures the driver terms selected some container node: %v, left some out: %v; the comparison proved little",
					selectedSome, skippedSome)
			}
		})
	}
}

// rulesFor returns the ClusterRole rules bound to a ServiceAccount of the release namespace.
func rulesFor(t *testing.T, stream, sa string) []rbacv1.PolicyRule {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{}
	var bound []string
	for _, o := range objects(t, stream) {
		switch o.kind() {
		case "ClusterRole":
			roles[o.name()] = decode[rbacv1.ClusterRole](t, o).Rules
		case "ClusterRoleBinding":
			b := decode[rbacv1.ClusterRoleBinding](t, o)
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == chartrender.Namespace {
					bound = append(bound, b.RoleRef.Name)
				}
			}
		}
	}
	var out []rbacv1.PolicyRule
	for _, r := range bound {
		out = append(out, roles[r]...)
	}
	return out
}

// allows reports whether rules grant verb on a core-group resource.
func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0
	})
}

// TestDriverUpgradeGateSidecar: every driver and vGPU manager pod has the driver-upgrade-gate sidecar: it runs the
// image of the pod's driver-manager init container (pinned, never the chart's appVersion, so a chart-only release
// changes no driver pod template), lifts the upgrade's cordon once the node's validator (the sandbox validator on
// vGPU manager nodes) is Ready with the new driver, and is Ready only once its ready file exists, on an emptyDir the
// readiness probe reads; it runs unprivileged with a read-only root, and its ServiceAccount may do what it does
// (nodes get/patch, pods list/watch).
func TestDriverUpgradeGateSidecar(t *testing.T) {
	const dir = "/run/kube-gpu-stack"
	seen := map[string]int{}
	for _, p := range profiles(t) {
		stream := render(t, newestKube, []string{p.file}, everythingOn...)
		for _, component := range []string{"driver", "vgpu-manager"} {
			for name, ds := range operandDaemonSets(t, stream, component) {
				seen[component]++
				spec := ds.Spec.Template.Spec
				where := p.name + ": " + name
				var gate, manager *corev1.Container
				for i, c := range spec.Containers {
					if c.Name == "driver-upgrade-gate" {
						gate = &spec.Containers[i]
					}
				}
				for i, c := range spec.InitContainers {
					if c.Name == "driver-manager" {
						manager = &spec.InitContainers[i]
					}
				}
				if gate == nil || manager == nil {
					t.Errorf("%s: driver-upgrade-gate sidecar %v, driver-manager init container %v", where, gate != nil, manager != nil)
					continue
				}
				if gate.Image != manager.Image || gate.ImagePullPolicy != manager.ImagePullPolicy {
					t.Errorf("%s: the sidecar runs %s (%s), the driver manager %s (%s)", where, gate.Image, gate.ImagePullPolicy, manager.Image, manager.ImagePullPolicy)
				}
				if strings.HasSuffix(gate.Image, ":"+chartrender.ChartVersion) {
					t.Errorf("%s: the sidecar's image %s follows the chart version", where, gate.Image)
				}
				want := []string{"driver-manager", "uncordon-when-valid", "--hold", "--ready-file", dir + "/driver-validated"}
				if component == "vgpu-manager" {
					want = append(want, "--validator-component", "sandbox-validator")
				} else {
					want = append(want, "--timeout", "600s") // driver.upgradePolicy.validationTimeoutSeconds
				}
				if got := append(slices.Clone(gate.Command), gate.Args...); !slices.Equal(got, want) {
					t.Errorf("%s: the sidecar runs %v, want %v", where, got, want)
				}
				fields := map[string]string{}
				for _, e := range gate.Env {
					if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
						fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
					}
				}
				if fields["NODE_NAME"] != "spec.nodeName" || fields["OPERATOR_NAMESPACE"] != "metadata.namespace" {
					t.Errorf("%s: the sidecar's field env %v", where, fields)
				}
				// its ready file's directory, and the pod's API token (the pod automounts none: gpu-stack-lib.apiAccessMount)
				if len(gate.VolumeMounts) != 2 || gate.VolumeMounts[0].MountPath != dir ||
					gate.VolumeMounts[1].Name != "kube-api-access" || gate.VolumeMounts[1].MountPath != contracts.TokenDir {
					t.Errorf("%s: the sidecar mounts %v, want one volume at %s and the API token at %s", where, gate.VolumeMounts, dir, contracts.TokenDir)
				} else {
					vol := gate.VolumeMounts[0].Name
					if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol && v.EmptyDir != nil }) {
						t.Errorf("%s: the sidecar's volume %s is not an emptyDir of the pod", where, vol)
					}
				}
				probe := gate.ReadinessProbe
				wantProbe := []string{"validator", "wait", "--dir", dir, "--interval", "200ms", "--timeout", "2s", "driver-validated"}
				if probe == nil || probe.Exec == nil || !slices.Equal(probe.Exec.Command, wantProbe) || probe.PeriodSeconds != 10 || probe.TimeoutSeconds != 5 {
					t.Errorf("%s: the sidecar's readiness probe %+v, want exec %v every 10s, timeout 5s", where, probe, wantProbe)
				}
				if gate.Resources.Requests.Memory().IsZero() || gate.Resources.Limits.Memory().IsZero() || gate.Resources.Requests.Cpu().IsZero() {
					t.Errorf("%s: the sidecar's resources %v", where, gate.Resources)
				}
				sc := gate.SecurityContext
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
					!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.ReadOnlyRootFilesystem == nil ||
					!*sc.ReadOnlyRootFilesystem || (sc.Privileged != nil && *sc.Privileged) {
					t.Errorf("%s: the sidecar's securityContext %+v", where, sc)
				}
				rules := rulesFor(t, stream, spec.ServiceAccountName)
				for _, need := range []struct{ resource, verb string }{{"nodes", "get"}, {"nodes", "patch"}, {"pods", "list"}, {"pods", "watch"}} {
					if !allows(rules, "", need.resource, need.verb) {
						t.Errorf("%s: ServiceAccount %s may not %s %s", where, spec.ServiceAccountName, need.verb, need.resource)
					}
				}
			}
		}
	}
	if seen["driver"] == 0 || seen["vgpu-manager"] == 0 {
		t.Fatalf("checked %v DaemonSets; want both driver and vgpu-manager ones", seen)
	}
}

// TestValidatorRBAC: the validators may do what their checks do on the cluster: the operator validator lists pods
// in every namespace (the plugin check sums the GPU requests of its node's pods) and patches its Node; the sandbox
// validator records its checks' outcomes on its Node.
func TestValidatorRBAC(t *testing.T) {
	stream := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml")})
	for _, tc := range []struct {
		sa   string
		need [][2]string
	}{
		{"nvidia-operator-validator", [][2]string{{"nodes", "get"}, {"nodes", "patch"}, {"pods", "list"}}},
		{"nvidia-sandbox-validator", [][2]string{{"nodes", "get"}, {"nodes", "list"}, {"nodes", "watch"}, {"nodes", "patch"}}},
	} {
		rules := rulesFor(t, stream, tc.sa)
		if len(rules) == 0 {
			t.Errorf("%s: no ClusterRole bound", tc.sa)
		}
		for _, n := range tc.need {
			if !allows(rules, "", n[0], n[1]) {
				t.Errorf("%s may not %s %s cluster-wide", tc.sa, n[1], n[0])
			}
		}
	}
}

// TestValidationTimeoutReachesEachPoolsGate: driver.upgradePolicy.validationTimeoutSeconds is the --timeout of the
// driver-upgrade-gate sidecar of every driver DaemonSet, and a pool's own upgradePolicy overrides it for that pool's
// DaemonSets only.
func TestValidationTimeoutReachesEachPoolsGate(t *testing.T) {
	file := filepath.Join(chartrender.RepoRoot(), "values", "driver-pools.yaml")
	stream := render(t, newestKube, []string{file}, "driver.upgradePolicy.validationTimeoutSeconds=300",
		"driver.pools[0].upgradePolicy.validationTimeoutSeconds=45")
	dss := operandDaemonSets(t, stream, "driver")
	if len(dss) == 0 {
		t.Fatal("no driver DaemonSet rendered")
	}
	for name, ds := range dss {
		want := "300s"
		if strings.HasPrefix(name, "nvidia-driver-r570-") { // pools[0]
			want = "45s"
		}
		var args []string
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name == "driver-upgrade-gate" {
				args = c.Args
			}
		}
		if i := slices.Index(args, "--timeout"); i < 0 || i+1 >= len(args) || args[i+1] != want {
			t.Errorf("%s: the upgrade gate's args %v, want --timeout %s", name, args, want)
		}
	}
}
