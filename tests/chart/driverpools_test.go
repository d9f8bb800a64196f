package chart

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// driver-pools: every GPU node is a container node; the host pool's nodes get everything but the driver.
func init() {
	m := sandboxOff(containerRole)
	m["pool-host"] = containerHostDriver
	roleMatrix["driver-pools"] = m
}

var driverPoolsProfile = filepath.Join(chartrender.RepoRoot(), "values", "driver-pools.yaml")

// driverTemplates returns the pod template of every driver DaemonSet in a rendered stream, as YAML, by name.
func driverTemplates(t *testing.T, stream string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objects(t, stream) {
		if o.kind() != "DaemonSet" || !strings.HasPrefix(o.Source, "kube-gpu-stack/charts/driver/") {
			continue
		}
		spec, _ := o.Raw["spec"].(map[string]any)
		b, err := yaml.Marshal(spec["template"])
		if err != nil {
			t.Fatal(err)
		}
		out[o.name()] = string(b)
	}
	if len(out) == 0 {
		t.Fatal("no driver DaemonSets rendered")
	}
	return out
}

// configDigest is the value of the DRIVER_CONFIG_DIGEST env entry of a driver pod template.
func configDigest(t *testing.T, template string) string {
	t.Helper()
	_, rest, ok := strings.Cut(template, "name: DRIVER_CONFIG_DIGEST")
	if !ok {
		t.Fatal("no DRIVER_CONFIG_DIGEST in the driver pod template")
	}
	for _, l := range strings.Split(rest, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "value: "); ok {
			return v
		}
	}
	return ""
}

// driverDaemonSet decodes the rendered DaemonSet called name.
func driverDaemonSet(t *testing.T, stream, name string) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() == "DaemonSet" && o.name() == name {
			b, err := yaml.Marshal(o.Raw)
			if err != nil {
				t.Fatal(err)
			}
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal(b, &ds); err != nil {
				t.Fatal(err)
			}
			return &ds
		}
	}
	t.Fatalf("no DaemonSet %s", name)
	return nil
}

func sameTemplates(t *testing.T, want, got map[string]string) {
	t.Helper()
	if a, b := slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)); !slices.Equal(a, b) {
		t.Fatalf("driver DaemonSets differ: %v vs %v", a, b)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("driver DaemonSet %s: pod template changed:\n%s", name, lineDiff(w, got[name]))
		}
	}
}

// A chart release that changes nothing about the driver renders byte-identical driver pod templates, so no
// driver pod restarts (and no workload is drained) on a chart-only upgrade.
func TestDriverPodTemplatesIgnoreChartVersion(t *testing.T) {
	t.Parallel()
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	chrt := umbrella(t)
	chrt.Metadata.Version, chrt.Metadata.AppVersion = "9.8.7", "9.8.7"
	for _, d := range chrt.Dependencies() {
		d.Metadata.Version, d.Metadata.AppVersion = "9.8.7", "9.8.7"
		for _, dd := range d.Dependencies() {
			dd.Metadata.Version, dd.Metadata.AppVersion = "9.8.7", "9.8.7"
		}
	}
	for _, d := range chrt.Metadata.Dependencies {
		d.Version = "9.8.7"
	}
	vals, err := chartrender.Values([]string{driverPoolsProfile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := chartrender.Render(t.Context(), chrt, vals, newestKube)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "helm.sh/chart: driver-9.8.7") {
		t.Fatal("the bumped chart version does not show in the render; the test would prove nothing")
	}
	sameTemplates(t, base, driverTemplates(t, out))
}

// Values of other operands are not part of the driver pod template.
func TestDriverPodTemplatesIgnoreOtherOperands(t *testing.T) {
	t.Parallel()
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	got := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile},
		"devicePlugin.args={--fail-on-init-error=false}", "toolkit.image.tag=v9.9.9", "dcgmExporter.enabled=false"))
	sameTemplates(t, base, got)
}

// Changing one pool's driver version moves exactly that pool's DRIVER_CONFIG_DIGEST.
func TestDriverConfigDigestPerPool(t *testing.T) {
	t.Parallel()
	base := driverTemplates(t, render(t, newestKube, []string{driverPoolsProfile}))
	for _, tc := range []struct{ set, prefix string }{
		{"driver.pools[0].image.tag=570.200.01", "nvidia-driver-r570-"},
		{"driver.pools[1].image.tag=575", "nvidia-driver-precompiled-"},
		{"driver.image.tag=595.100.01", "nvidia-driver-daemonset-"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			// --set-string: a driver branch such as 575 is a tag, not a number
			vals, err := (&values.Options{ValueFiles: []string{driverPoolsProfile}, StringValues: []string{tc.set}}).MergeValues(getter.Providers{})
			if err != nil {
				t.Fatal(err)
			}
			out, err := chartrender.Render(t.Context(), umbrella(t), vals, newestKube)
			if err != nil {
				t.Fatal(err)
			}
			got := driverTemplates(t, out)
			moved := 0
			for name, tmpl := range base {
				changed := configDigest(t, tmpl) != configDigest(t, got[name])
				if changed != strings.HasPrefix(name, tc.prefix) {
					t.Errorf("%s: digest changed=%v after %s", name, changed, tc.set)
				}
				if changed {
					moved++
				}
			}
			if moved == 0 {
				t.Errorf("%s moved no digest", tc.set)
			}
		})
	}
}

// The profile renders one DaemonSet per pool x OS (x kernel), with names within 63 characters, and precompiled
// images tagged <branch>-<kernel>-<os tag>.
func TestDriverPoolsFanOut(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{driverPoolsProfile})
	got := slices.Sorted(maps.Keys(driverTemplates(t, stream)))
	want := []string{
		"nvidia-driver-daemonset-rhel9", "nvidia-driver-daemonset-ubuntu2204", "nvidia-driver-daemonset-ubuntu2404",
		"nvidia-driver-precompiled-ubuntu2204-5-15-0-140-generic", "nvidia-driver-precompiled-ubuntu2204-6-8-0-60-generic",
		"nvidia-driver-r570-rhel9", "nvidia-driver-r570-ubuntu2404",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("driver DaemonSets:\n got  %v\n want %v", got, want)
	}
	ds := driverDaemonSet(t, stream, "nvidia-driver-precompiled-ubuntu2204-5-15-0-140-generic")
	if img := ds.Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/driver:580-5.15.0-140-generic-ubuntu22.04" {
		t.Errorf("precompiled image %s", img)
	}
	if ds.Spec.Template.Labels["nvidia.com/precompiled"] != "true" {
		t.Errorf("precompiled pod without nvidia.com/precompiled=true: %v", ds.Spec.Template.Labels)
	}

	// a long pool name and kernel: cut to 63 characters with a hash, still distinct per kernel
	long := render(t, newestKube, []string{driverPoolsProfile}, "driver.pools[1].name=precompiled-a100-xl",
		"driver.pools[1].kernels={5.14.0-570.12.1.el9_6.x86_64-long-suffix-one,5.14.0-570.12.1.el9_6.x86_64-long-suffix-two}")
	names := slices.Sorted(maps.Keys(driverTemplates(t, long)))
	seen := 0
	for _, n := range names {
		if len(n) > 63 {
			t.Errorf("%s is longer than 63 characters", n)
		}
		if strings.HasPrefix(n, "nvidia-driver-precompiled-a100-xl-") {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("want two distinct precompiled DaemonSets, got %v", names)
	}
}

// driverPool is one DRIVER_POOLS entry, as the hooks read it.
type driverPool = driverpools.Pool

// gatePools decodes the gate Job's DRIVER_POOLS with the hooks' own parser and checks the test Pod and the
// pre-upgrade Job carry the same.
func gatePools(t *testing.T, stream string) []driverPool {
	t.Helper()
	raw := map[string]string{}
	for _, h := range hookObjects(t, stream) {
		if h.name() == gateName && h.kind() == "Job" || h.name() == testName && h.kind() == "Pod" || h.name() == preUpgradeName && h.kind() == "Job" {
			v, ok := podOf(t, h).env("DRIVER_POOLS")
			if !ok {
				t.Fatalf("%s has no DRIVER_POOLS", h.key())
			}
			raw[h.name()] = v
		}
	}
	if raw[gateName] == "" || raw[gateName] != raw[testName] || raw[gateName] != raw[preUpgradeName] {
		t.Fatalf("DRIVER_POOLS of the gate, the test and the pre-upgrade plan differ or are missing: %q vs %q vs %q",
			raw[gateName], raw[testName], raw[preUpgradeName])
	}
	pools, err := driverpools.Parse(raw[gateName])
	if err != nil {
		t.Fatalf("DRIVER_POOLS %s: %v", raw[gateName], err)
	}
	return pools
}

// TestDriverPoolsEnvMatchesDriverDaemonSets: the DRIVER_POOLS the gate gets describe the driver DaemonSets that
// are rendered: matched with the same selector evaluator the gate uses, every GPU node is selected by exactly
// one pool, and a node a driver DaemonSet schedules on is selected by that DaemonSet's pool; host pools have no
// DaemonSet. Covered: the default pool alone, pools on one label, and pools whose selectors need several terms
// to exclude (the default pool's OR'ed alternatives). Without the driver chart the list is empty.
func TestDriverPoolsEnvMatchesDriverDaemonSets(t *testing.T) {
	t.Parallel()
	multiTerm := writeTemp(t, "pools.yaml", `driver:
  pools:
    - name: r570
      nodeSelector:
        matchLabels: {nvidia.com/driver.pool: r570}
      image: {tag: "570.195.03"}
    - name: old-kernel
      nodeSelector:
        matchExpressions:
          - {key: nvidia.com/driver.pool, operator: In, values: [precompiled]}
          - {key: feature.node.kubernetes.io/kernel-version.full, operator: In, values: [5.15.0-140-generic]}
      os: [ubuntu22.04]
    - name: host
      nodeSelector:
        matchExpressions:
          - {key: nvidia.com/driver.pool, operator: Exists}
          - {key: nvidia.com/driver.pool, operator: NotIn, values: [r570, precompiled]}
      source: host
`)
	// the shorthand: a pool without nodeSelector selects nvidia.com/driver.pool=<its name>, next to a selector pool
	shorthand := writeTemp(t, "shorthand.yaml", `driver:
  pools:
    - name: r570
      image: {tag: "570.195.03"}
      os: [ubuntu24.04, rhel9]
    - name: old-kernel
      nodeSelector:
        matchExpressions:
          - {key: nvidia.com/driver.pool, operator: In, values: [precompiled]}
          - {key: feature.node.kubernetes.io/kernel-version.full, operator: In, values: [5.15.0-140-generic]}
      os: [ubuntu22.04]
    - name: host
      source: host
`)
	values := func(name string) string { return filepath.Join(chartrender.RepoRoot(), "values", name+".yaml") }
	for _, tc := range []struct {
		name  string
		files []string
		pools []string
		// node -> pool, for nodes whose pool is the point of the case
		want map[string]string
	}{
		{"default-only", []string{values("container-only")}, []string{"default"},
			map[string]string{"pool-r570-rhel9": "default", "container-ubuntu2204": "default"}},
		{"driver-pools", []string{values("driver-pools")}, []string{"default", "r570", "precompiled", "host"},
			map[string]string{"pool-r570-rhel9": "r570", "pool-precompiled-k6-8": "precompiled", "pool-host": "host", "container-rhel9": "default"}},
		{"multi-term", []string{multiTerm}, []string{"default", "r570", "old-kernel", "host"},
			map[string]string{"pool-precompiled-k5-15": "old-kernel", "pool-precompiled-k6-8": "default", "pool-host": "host", "pool-r570-ubuntu2404": "r570"}},
		{"shorthand", []string{shorthand}, []string{"default", "r570", "old-kernel", "host"},
			map[string]string{"pool-r570-rhel9": "r570", "pool-r570-ubuntu2404": "r570", "pool-precompiled-k5-15": "old-kernel",
				"pool-precompiled-k6-8": "default", "pool-host": "host", "container-rhel9": "default"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := render(t, newestKube, tc.files)
			pools := gatePools(t, stream)
			var names []string
			for _, p := range pools {
				names = append(names, p.Name)
			}
			if !slices.Equal(names, tc.pools) {
				t.Fatalf("DRIVER_POOLS pools %v, want %v (the default pool first, then as listed)", names, tc.pools)
			}
			if tc.name == "shorthand" {
				for _, p := range pools[1:] {
					if p.Name == "old-kernel" {
						continue
					}
					want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: nodefixtures.DriverPoolLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{p.Name}}}}}
					if !equality.Semantic.DeepEqual(p.NodeSelectorTerms, want) {
						t.Errorf("pool %s without nodeSelector selects %+v, want %s=%s", p.Name, p.NodeSelectorTerms, nodefixtures.DriverPoolLabel, p.Name)
					}
				}
			}
			if tc.name == "multi-term" && len(pools[0].NodeSelectorTerms) < 2 {
				t.Fatalf("the default pool has %d terms; the case needs several", len(pools[0].NodeSelectorTerms))
			}
			drivers := operandPlacements(t, stream, "driver")
			poolOfDS := func(ds string) string {
				best := ""
				for _, p := range pools {
					prefix := "nvidia-driver-" + p.Name + "-"
					if p.Name == "default" {
						prefix = "nvidia-driver-daemonset-"
					}
					if strings.HasPrefix(ds, prefix) && len(p.Name) > len(best) {
						best = p.Name
					}
				}
				return best
			}
			var nodes []*corev1.Node
			for _, n := range nodefixtures.RoleMatrix() {
				nodes = append(nodes, n.Object())
			}
			place, err := placement.Place(drivers, nodes)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, n := range nodes {
				if n.Labels["nvidia.com/gpu.present"] != "true" {
					continue
				}
				var selected []driverPool
				for _, p := range pools {
					ok, err := schedule.Selects(&corev1.NodeSelector{NodeSelectorTerms: p.NodeSelectorTerms}, n)
					if err != nil {
						t.Fatalf("pool %s: %v", p.Name, err)
					}
					if ok {
						selected = append(selected, p)
					}
				}
				if len(selected) != 1 {
					t.Errorf("GPU node %s is selected by %d pools %v", n.Name, len(selected), selected)
					continue
				}
				got[n.Name] = selected[0].Name
				if ds, ok := place[n.Name]["driver"]; ok && poolOfDS(ds) != selected[0].Name {
					t.Errorf("node %s: driver DaemonSet %s (pool %s), but DRIVER_POOLS selects pool %s", n.Name, ds, poolOfDS(ds), selected[0].Name)
				}
				if _, ok := place[n.Name]["driver"]; ok && selected[0].Source != "container" {
					t.Errorf("node %s gets a driver DaemonSet, but its pool %s has source %s", n.Name, selected[0].Name, selected[0].Source)
				}
			}
			for node, pool := range tc.want {
				if got[node] != pool {
					t.Errorf("node %s: DRIVER_POOLS selects pool %q, want %q", node, got[node], pool)
				}
			}
			placed := 0
			for _, n := range nodes {
				if _, ok := place[n.Name]["driver"]; ok {
					placed++
				}
			}
			if placed == 0 {
				t.Fatal("no driver DaemonSet placed on any fixture; the comparison proved nothing")
			}
		})
	}

	t.Run("no-driver", func(t *testing.T) {
		if pools := gatePools(t, render(t, newestKube, []string{values("host-driver")})); len(pools) != 0 {
			t.Errorf("driver.enabled=false renders DRIVER_POOLS %v, want []", pools)
		}
	})
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
			stream := render(t, newestKube, p.files)
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

// TestValidationTimeoutReachesEachPoolsGate: driver.upgradePolicy.validationTimeoutSeconds is the --timeout of the
// driver-upgrade-gate sidecar of every driver DaemonSet, and a pool's own upgradePolicy overrides it for that pool's
// DaemonSets only.
func TestValidationTimeoutReachesEachPoolsGate(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	stream := render(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)})
	vgpu := operandPlacements(t, stream, "vgpu-manager")
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
	t.Parallel()
	_, err := renderErr(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)},
		"vgpuManager.pools[1].nodeSelector.matchExpressions[0].values={noble,r570}")
	want := `vgpuManager.pools: pools "r570" and "noble" can select the same node: label nvidia.com/vgpu-manager.pool does not separate them`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want an error containing %q, got %v", want, err)
	}
}

// A vGPU manager pool without nodeSelector is exactly a pool selecting nvidia.com/vgpu-manager.pool=<its name>: the
// same render, byte for byte, hook contract included, and the same overlap check against a selector pool.
func TestVGPUManagerPoolShorthand(t *testing.T) {
	t.Parallel()
	shorthand := strings.Replace(vgpuPools, "      nodeSelector:\n        matchLabels: {nvidia.com/vgpu-manager.pool: r570}\n", "", 1)
	if shorthand == vgpuPools {
		t.Fatal("the r570 pool's selector was not found to leave out")
	}
	if got, want := render(t, newestKube, []string{vmVGPUProfile, writeTemp(t, "vgpu-pools.yaml", shorthand)}),
		render(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)}); got != want {
		t.Error("a vGPU manager pool without nodeSelector renders differently from its nodeSelector spelled out")
	}
	_, err := renderErr(t, newestKube, []string{vmVGPUProfile, writeTemp(t, "vgpu-pools.yaml", shorthand)},
		"vgpuManager.pools[1].nodeSelector.matchExpressions[0].values={noble,r570}")
	want := `vgpuManager.pools: pools "r570" and "noble" can select the same node: label nvidia.com/vgpu-manager.pool does not separate them`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want an error containing %q, got %v", want, err)
	}
}

// preUpgradeVGPUPools decodes the pre-upgrade Job's VGPU_MANAGER_POOLS with the hooks' parser; the gate and the test,
// which do not plan, do not get it.
func preUpgradeVGPUPools(t *testing.T, stream string) []driverPool {
	t.Helper()
	raw, found := "", false
	for _, h := range hookObjects(t, stream) {
		if h.kind() != "Job" && h.kind() != "Pod" {
			continue
		}
		v, ok := podOf(t, h).env("VGPU_MANAGER_POOLS")
		if ok != (h.name() == preUpgradeName) {
			t.Errorf("%s: VGPU_MANAGER_POOLS set=%v; only the pre-upgrade plan takes it", h.key(), ok)
		}
		if h.name() == preUpgradeName {
			raw, found = v, ok
		}
	}
	if !found {
		t.Fatal("the pre-upgrade Job has no VGPU_MANAGER_POOLS")
	}
	pools, err := driverpools.Parse(raw)
	if err != nil {
		t.Fatalf("VGPU_MANAGER_POOLS %s: %v", raw, err)
	}
	return pools
}

// The pre-upgrade plan gets the vGPU manager pools (VGPU_MANAGER_POOLS, DRIVER_POOLS' shape): exactly the rendered
// vGPU manager DaemonSets, each with the DRIVER_CONFIG_DIGEST its pods carry, in the pool whose selection covers
// its nodes; on vm-vgpu fixture nodes every node is selected by exactly one pool, and a DaemonSet's terms select a
// node exactly where that DaemonSet runs. The pace is the DaemonSets' updateStrategy (global's maxUnavailable 1
// here), without canary or failure threshold; a pool's own updateStrategy paces that pool.
func TestVGPUManagerPoolsEnv(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{vmVGPUProfile, vgpuPoolsFile(t)}, "vgpuManager.pools[1].updateStrategy.type=OnDelete",
		"vgpuManager.pools[0].updateStrategy.rollingUpdate.maxUnavailable=25%")
	pools := preUpgradeVGPUPools(t, stream)
	var names []string
	for _, p := range pools {
		names = append(names, p.Name)
		if p.Canary == nil || *p.Canary != 0 || p.MaxFailures == nil || *p.MaxFailures != 0 || p.Allocation != "" {
			t.Errorf("pool %s: canary %v, maxFailures %v, allocation %q; want 0, 0 and none", p.Name, p.Canary, p.MaxFailures, p.Allocation)
		}
	}
	if want := []string{"default", "r570", "noble", "preinstalled"}; !slices.Equal(names, want) {
		t.Fatalf("VGPU_MANAGER_POOLS pools %v, want %v", names, want)
	}
	pace := func(p driverPool) string {
		n := "unset"
		if p.MaxUnavailable != nil {
			n = p.MaxUnavailable.String()
		}
		return n + map[bool]string{true: " rolling", false: " on-delete"}[*p.AutoUpgrade]
	}
	// noble: an OnDelete strategy has no rollingUpdate; the plan batches one node at a time
	for i, want := range []string{"1 rolling", "25% rolling", "unset on-delete"} {
		if pools[i].AutoUpgrade == nil {
			t.Fatalf("pool %s: no autoUpgrade", pools[i].Name)
		}
		if got := pace(pools[i]); got != want {
			t.Errorf("pool %s paced %q, want %q (its DaemonSets' updateStrategy)", pools[i].Name, got, want)
		}
	}

	rendered := operandDaemonSets(t, stream, "vgpu-manager")
	listed := map[string]driverpools.DaemonSet{}
	poolOf := map[string]string{}
	for _, p := range pools {
		if p.Source != "container" && len(p.DaemonSets) > 0 {
			t.Errorf("pool %s (source %s) lists DaemonSets", p.Name, p.Source)
		}
		for _, ds := range p.DaemonSets {
			listed[ds.Name], poolOf[ds.Name] = ds, p.Name
		}
	}
	if got, want := slices.Sorted(maps.Keys(listed)), slices.Sorted(maps.Keys(rendered)); !slices.Equal(got, want) || len(got) == 0 {
		t.Fatalf("VGPU_MANAGER_POOLS lists\n %v\nthe chart renders\n %v", got, want)
	}
	for name, ds := range rendered {
		digests := podDigests(ds.Spec.Template.Spec)
		if len(digests) < 2 {
			t.Errorf("%s: DRIVER_CONFIG_DIGEST in %d containers, want the driver manager's and the vGPU manager's", name, len(digests))
		}
		for c, d := range digests {
			if d != listed[name].Digest || d == "" {
				t.Errorf("%s: container %s has DRIVER_CONFIG_DIGEST %s, VGPU_MANAGER_POOLS says %q", name, c, d, listed[name].Digest)
			}
		}
	}
	if listed["nvidia-vgpu-manager-r570-ubuntu2204"].Digest == listed["nvidia-vgpu-manager-daemonset-ubuntu2204"].Digest {
		t.Error("pools r570 and default have one digest although their vGPU manager versions differ")
	}

	vgpu := operandPlacements(t, stream, "vgpu-manager")
	nodes := []*corev1.Node{
		vgpuNode("default-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", ""),
		vgpuNode("r570-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "r570"),
		vgpuNode("r570-rhel9", nodefixtures.RHEL96, "vm-vgpu", "r570"),
		vgpuNode("r570-ubuntu2404", nodefixtures.Ubuntu2404, "vm-vgpu", "r570"),
		vgpuNode("noble-ubuntu2404", nodefixtures.Ubuntu2404, "vm-vgpu", "noble"),
		vgpuNode("host-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "host"),
		vgpuNode("unknown-pool-ubuntu2204", nodefixtures.Ubuntu2204, "vm-vgpu", "other"),
	}
	place, err := placement.Place(vgpu, nodes)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"default-ubuntu2204": "default", "r570-ubuntu2204": "r570", "r570-rhel9": "r570", "r570-ubuntu2404": "r570",
		"noble-ubuntu2404": "noble", "host-ubuntu2204": "preinstalled", "unknown-pool-ubuntu2204": "default"}
	for _, n := range nodes {
		matched, err := driverpools.Matching(pools, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(matched) != 1 || matched[0].Name != want[n.Name] {
			t.Errorf("node %s is selected by pools %v, want only %s", n.Name, driverpools.Names(matched), want[n.Name])
			continue
		}
		ds, err := matched[0].DaemonSetFor(n)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if ds != nil {
			got = ds.Name
		}
		if got != place[n.Name]["vgpu-manager"] {
			t.Errorf("node %s: the plan reads DaemonSet %q, the scheduler places %q", n.Name, got, place[n.Name]["vgpu-manager"])
		}
	}

	// without the vGPU manager the plan gets no vGPU manager pool
	for _, set := range [][]string{{"vgpuManager.enabled=false"}, {"global.sandboxWorkloads.enabled=false", "global.sandboxWorkloads.defaultWorkload=container"}} {
		if pools := preUpgradeVGPUPools(t, render(t, newestKube, []string{vmVGPUProfile}, set...)); len(pools) != 0 {
			t.Errorf("%v: VGPU_MANAGER_POOLS %v, want []", set, pools)
		}
	}
}

// A pool without nodeSelector is exactly a pool selecting nvidia.com/driver.pool=<its name> (the same render, byte
// for byte), so the overlap check treats it as it treats that selector: a selector pool that can select the same
// node is refused, whichever comes first, naming both pools; one kept apart on that label is accepted. An empty
// nodeSelector is refused, pointing at the shorthand.
func TestDriverPoolShorthand(t *testing.T) {
	t.Parallel()
	explicit := render(t, newestKube, []string{driverPoolsProfile}, "driver.pools[0].nodeSelector.matchLabels.nvidia\\.com/driver\\.pool=r570",
		"driver.pools[1].nodeSelector.matchLabels.nvidia\\.com/driver\\.pool=precompiled")
	if got := render(t, newestKube, []string{driverPoolsProfile}); got != explicit {
		t.Error("values/driver-pools.yaml's shorthand pools render differently from their nodeSelector spelled out")
	}

	pools := func(first, second string) string {
		return "driver:\n  pools:\n" + first + second
	}
	const a100 = "    - name: a100\n"
	for _, tc := range []struct {
		name, other string
		// the refusal, or "" for pools kept apart
		want string
	}{
		{"same label, a common value", "    - name: mixed\n      nodeSelector:\n        matchExpressions: [{key: nvidia.com/driver.pool, operator: In, values: [a100, h100]}]\n",
			`label nvidia.com/driver.pool does not separate them`},
		{"same label, any value", "    - name: labelled\n      nodeSelector:\n        matchExpressions: [{key: nvidia.com/driver.pool, operator: Exists}]\n",
			`label nvidia.com/driver.pool does not separate them`},
		{"another label", "    - name: h100\n      nodeSelector:\n        matchLabels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}\n",
			`they select on different labels`},
		{"apart by value", "    - name: rest\n      nodeSelector:\n        matchExpressions: [{key: nvidia.com/driver.pool, operator: NotIn, values: [a100]}, {key: nvidia.com/driver.pool, operator: Exists}]\n", ""},
		{"apart by absence", "    - name: unlabelled-h100\n      nodeSelector:\n        matchExpressions: [{key: nvidia.com/driver.pool, operator: DoesNotExist}, {key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3]}]\n", ""},
		{"another shorthand", "    - name: h100\n", ""},
	} {
		other := strings.TrimPrefix(strings.SplitN(tc.other, "\n", 2)[0], "    - name: ")
		for _, order := range [][2]string{{a100, tc.other}, {tc.other, a100}} {
			_, err := renderErr(t, newestKube, []string{writeTemp(t, "pools.yaml", pools(order[0], order[1]))})
			first, second := "a100", other
			if order[0] != a100 {
				first, second = other, "a100"
			}
			switch want := fmt.Sprintf(`driver.pools: pools %q and %q can select the same node: %s`, first, second, tc.want); {
			case tc.want == "" && err != nil:
				t.Errorf("%s (%s first): refused: %v", tc.name, first, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("%s (%s first): want an error containing %q, got %v", tc.name, first, want, err)
			}
		}
	}

	// kept apart, the pools split the labelled nodes as their selectors say; unlabelled nodes stay in the default pool
	stream := render(t, newestKube, []string{writeTemp(t, "pools.yaml", pools(a100, "    - name: rest\n      nodeSelector:\n        matchExpressions: [{key: nvidia.com/driver.pool, operator: NotIn, values: [a100]}, {key: nvidia.com/driver.pool, operator: Exists}]\n"))})
	hook := gatePools(t, stream)
	node := func(pool string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-" + pool, Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
		if pool != "" {
			n.Labels[nodefixtures.DriverPoolLabel] = pool
		}
		return n
	}
	for label, want := range map[string]string{"a100": "a100", "h100": "rest", "": "default"} {
		matched, err := driverpools.Matching(hook, node(label))
		if err != nil {
			t.Fatal(err)
		}
		if names := driverpools.Names(matched); !slices.Equal(names, []string{want}) {
			t.Errorf("node labelled %s=%q is selected by pools %v, want only %s", nodefixtures.DriverPoolLabel, label, names, want)
		}
	}

	_, err := renderErr(t, newestKube, []string{writeTemp(t, "pools.yaml", "driver:\n  pools:\n    - name: a100\n      nodeSelector: {matchLabels: {}, matchExpressions: []}\n")})
	_, err2 := renderErr(t, newestKube, []string{writeTemp(t, "pools.yaml", "driver:\n  pools:\n    - name: a100\n      nodeSelector: {}\n")})
	for _, e := range []error{err, err2} {
		if e == nil || !strings.Contains(e.Error(), "leave nodeSelector out to select the nodes labelled nvidia.com/driver.pool=") {
			t.Errorf("an empty nodeSelector: %v; want a refusal pointing at the shorthand", e)
		}
	}
}

// operandPlacements returns the placement view of one operand's DaemonSets in a rendered stream.
func operandPlacements(t *testing.T, stream, operand string) []placement.DaemonSet {
	t.Helper()
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []placement.DaemonSet
	for _, ds := range dss {
		if ds.Operand == operand {
			out = append(out, ds)
		}
	}
	return out
}

// upgradePolicy.hold reaches the hooks' DRIVER_POOLS per pool: driver.upgradePolicy.hold in every pool without a list
// of its own, a pool's own list in place of it, and no "hold" at all where nothing is held (the JSON, and so every
// profile's render, unchanged). A node listed twice is a schema error.
func TestHoldReachesEachPoolsPlan(t *testing.T) {
	t.Parallel()
	file := filepath.Join(chartrender.RepoRoot(), "values", "driver-pools.yaml")
	pools := gatePools(t, render(t, newestKube, []string{file}, "driver.upgradePolicy.hold={gpu-7,gpu-9}",
		"driver.pools[0].upgradePolicy.hold={gpu-3}"))
	got := map[string][]string{}
	for _, p := range pools {
		got[p.Name] = p.Hold
	}
	if !slices.Equal(got["default"], []string{"gpu-7", "gpu-9"}) || !slices.Equal(got["r570"], []string{"gpu-3"}) {
		t.Fatalf("hold per pool %v, want default [gpu-7 gpu-9] and r570 [gpu-3]", got)
	}
	if !slices.Equal(got["precompiled"], got["default"]) {
		t.Errorf("hold per pool %v: a pool without its own list takes driver.upgradePolicy.hold", got)
	}
	for _, p := range gatePools(t, render(t, newestKube, []string{file})) {
		if p.Hold != nil {
			t.Errorf("pool %s holds %v with no hold in values", p.Name, p.Hold)
		}
	}
	if _, err := renderErr(t, newestKube, []string{file}, "driver.upgradePolicy.hold={gpu-7,gpu-7}"); err == nil ||
		!strings.Contains(err.Error(), "hold") {
		t.Errorf("a node held twice rendered (%v), want a schema error naming hold", err)
	}
}
