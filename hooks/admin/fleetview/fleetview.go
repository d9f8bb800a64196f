// Package fleetview is the read-only view of several clusters at once (`kube-gpu-stack status --context a
// --context b`, or --all-contexts): for each cluster its chart version, the drivers each driver pool runs, the GPU
// nodes not validated, the GPU health reasons, the nodes waiting for a driver change and, given a values file, where
// the release's values drift from it. It only reads: nodes, the release's pods, DaemonSets, revisions, events and
// its validation report ConfigMap, as `status --live` does.
package fleetview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecheck"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// DefaultHealthCondition is the GPU health node condition's type when the release's values do not say
// (global.health.nodeCondition.type).
const DefaultHealthCondition = "nvidia.com/GPUHealthy"

// Source is one cluster to read.
type Source struct {
	// Context names the cluster in the view: its kubeconfig context.
	Context string
	Client  kubernetes.Interface
	// Namespace and Release are the release's; an empty Release is the namespace's one release of the chart.
	Namespace, Release string
	// ReadRelease reads the release as Helm recorded it (the caller links the helm SDK): the chart's version, the
	// values the user gave and those with the chart's defaults. Nil: the chart version comes from the DaemonSets'
	// labels, the health condition is the chart's default, and there is no drift check.
	ReadRelease func(ctx context.Context, release string) (Recorded, error)
	// Want are the values the cluster should run (a values file); nil: no drift check.
	Want map[string]any
	// ReportConfigMap is where the post-install hook saved its report and the driver pools.
	ReportConfigMap string
}

// Recorded is a release as Helm recorded it.
type Recorded struct {
	ChartVersion string
	// UserValues are the values the user gave (helm get values); ComputedValues add the chart's defaults.
	UserValues, ComputedValues map[string]any
}

// Cluster is one cluster's part of the view.
type Cluster struct {
	Context   string `json:"context"`
	Namespace string `json:"namespace"`
	Release   string `json:"release,omitempty"`
	Chart     string `json:"chartVersion,omitempty"`
	GPUNodes  int    `json:"gpuNodes"`
	// Pools are the drivers each driver pool's nodes run, by version.
	Pools []PoolDrivers `json:"pools,omitempty"`
	// NotValidated are the GPU nodes with an operand not ready, and why (the first such operand).
	NotValidated []NodeNote `json:"notValidated,omitempty"`
	// Health are the GPU nodes whose health condition is not True, with its reason.
	Health []NodeNote `json:"health,omitempty"`
	// Upgrading are the nodes whose driver change has not ended (upgrade-required to uncordon-required, and
	// upgrade-failed), with their state.
	Upgrading []NodeNote `json:"upgrading,omitempty"`
	// Drift are the values where the release differs from the values file; DriftChecked says one was given.
	Drift        []Drift `json:"drift,omitempty"`
	DriftChecked bool    `json:"driftChecked,omitempty"`
	// Error is why the cluster could not be read; the other fields are then empty.
	Error string `json:"error,omitempty"`
}

// PoolDrivers is one pool's nodes by the driver they run.
type PoolDrivers struct {
	Pool    string        `json:"pool"`
	Drivers []DriverNodes `json:"drivers"`
}

// DriverNodes is how many of a pool's nodes run a driver version.
type DriverNodes struct {
	Version string `json:"version"`
	Nodes   int    `json:"nodes"`
}

// NodeNote is a node and what the view says of it.
type NodeNote struct {
	Node string `json:"node"`
	Note string `json:"note"`
}

// Collect reads one cluster. A cluster it cannot read is a Cluster with Error set, not an error: the view of the
// others goes on.
func Collect(ctx context.Context, s Source) Cluster {
	c := Cluster{Context: s.Context, Namespace: s.Namespace, Release: s.Release}
	if err := collect(ctx, s, &c); err != nil {
		return Cluster{Context: s.Context, Namespace: s.Namespace, Release: s.Release, Error: err.Error()}
	}
	return c
}

func collect(ctx context.Context, s Source, c *Cluster) error {
	release, version, err := findRelease(ctx, s.Client, s.Namespace, s.Release)
	if err != nil {
		return err
	}
	var rec Recorded
	if s.ReadRelease != nil {
		if rec, err = s.ReadRelease(ctx, release); err != nil {
			return fmt.Errorf("read release %s as Helm recorded it: %w", release, err)
		}
	}
	c.Release, c.Chart = release, cmp.Or(rec.ChartVersion, version)
	// the saved report names the driver pools (the live check needs them for its coverage cells)
	var pools []driverpools.Pool
	watchSlices := false
	if s.ReportConfigMap != "" {
		if saved, p, err := releasecheck.LoadConfigMap(ctx, s.Client, s.Namespace, s.ReportConfigMap); err == nil {
			pools = p
			// the saved report had DRA nodes: their slices are checked live too, as status --live does
			watchSlices = hasDRA(saved)
		}
	}
	// the nodes and the driver pods come from the check's own caches: listed again, 1,000 nodes' and their pods'
	// objects would be decoded twice
	var seen releasecheck.Snapshot
	o := releasecheck.Options{Client: s.Client, Namespace: s.Namespace, Release: release, Pools: pools, Once: true, ResourceSlices: watchSlices,
		Seen: func(snap releasecheck.Snapshot) { seen = snap }}
	o.Complete()
	report, err := releasecheck.Run(ctx, o, io.Discard)
	if err != nil && !errors.Is(err, releasecheck.ErrFailed) { // a failed check is what the view shows
		return fmt.Errorf("evaluate the release: %w", err)
	}
	gpu := map[string]bool{}
	for _, row := range report.Nodes {
		if row.GPU {
			gpu[row.Name] = true
			if op, cell, ok := firstNotReady(report.Operands, row); ok {
				c.NotValidated = append(c.NotValidated, NodeNote{row.Name, fmt.Sprintf("%s %s: %s", op, cell.State, cell.Reason)})
			}
		}
	}
	c.GPUNodes = len(gpu)
	c.Pools = poolDrivers(pools, driverPods(seen.Pods, release))
	condition := healthCondition(rec.ComputedValues)
	for _, n := range seen.Nodes {
		if !gpu[n.Name] {
			continue
		}
		for _, cond := range n.Status.Conditions {
			if string(cond.Type) == condition && cond.Status != corev1.ConditionTrue {
				c.Health = append(c.Health, NodeNote{n.Name, fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)})
			}
		}
		switch st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]); st {
		case "", nodestate.UpgradeDone:
		default:
			note := string(st)
			if why := n.Annotations[nodestate.UpgradeReasonAnnotation]; why != "" {
				note += ": " + why
			}
			c.Upgrading = append(c.Upgrading, NodeNote{n.Name, note})
		}
	}
	for _, notes := range [][]NodeNote{c.NotValidated, c.Health, c.Upgrading} {
		slices.SortFunc(notes, func(a, b NodeNote) int { return strings.Compare(a.Node, b.Node) })
	}
	if s.Want != nil {
		if s.ReadRelease == nil {
			return fmt.Errorf("a values file to compare with, but no way to read the release's values")
		}
		c.DriftChecked = true
		c.Drift = Diff(s.Want, rec.UserValues)
	}
	return nil
}

// findRelease names the namespace's release of the chart (release, when given) from its DaemonSets' labels, and
// the chart version they carry (helm.sh/chart: kube-gpu-stack-VERSION).
func findRelease(ctx context.Context, client kubernetes.Interface, namespace, release string) (string, string, error) {
	dss, err := apiretry.Value(ctx, func(ctx context.Context) ([]string, error) {
		list, err := client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=kube-gpu-stack"})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, ds := range list.Items {
			out = append(out, ds.Labels["app.kubernetes.io/instance"]+"\x00"+ds.Labels["helm.sh/chart"])
		}
		return out, nil
	})
	if err != nil {
		return "", "", fmt.Errorf("look for the release's DaemonSets in namespace %q: %w", namespace, err)
	}
	charts := map[string]string{}
	for _, d := range dss {
		name, chart, _ := strings.Cut(d, "\x00")
		charts[name] = strings.TrimPrefix(chart, "kube-gpu-stack-")
	}
	names := slices.Sorted(maps.Keys(charts))
	switch {
	case release != "" && slices.Contains(names, release):
		return release, charts[release], nil
	case release == "" && len(names) == 1:
		return names[0], charts[names[0]], nil
	case len(names) == 0:
		return "", "", fmt.Errorf("no kube-gpu-stack release in namespace %q (no DaemonSet there carries app.kubernetes.io/part-of=kube-gpu-stack)", namespace)
	case release == "":
		return "", "", fmt.Errorf("releases %s in namespace %q: name one with --release", strings.Join(names, ", "), namespace)
	}
	return "", "", fmt.Errorf("no kube-gpu-stack release %q in namespace %q (releases there: %s)", release, namespace, strings.Join(names, ", "))
}

// driverPods are the release's live driver (and vGPU manager) pods among pods.
func driverPods(pods []*corev1.Pod, release string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		switch p.Labels["app.kubernetes.io/component"] {
		case upgradeplan.KindDriver, upgradeplan.KindVGPUManager:
			if p.Labels["app.kubernetes.io/instance"] == release && p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// poolDrivers counts each pool's nodes by the driver version their driver pod runs. A pod belongs to the pool
// whose DaemonSets include its owner; without the pools (no saved report), each DaemonSet is its own pool.
func poolDrivers(pools []driverpools.Pool, pods []*corev1.Pod) []PoolDrivers {
	poolOf := map[string]string{}
	for _, p := range pools {
		for _, ds := range p.DaemonSets {
			poolOf[ds.Name] = p.Name
		}
	}
	counts := map[string]map[string]int{}
	for _, pod := range pods {
		owner := ""
		if ref := metav1.GetControllerOf(pod); ref != nil {
			owner = ref.Name
		}
		pool := cmp.Or(poolOf[owner], owner, "-")
		if counts[pool] == nil {
			counts[pool] = map[string]int{}
		}
		counts[pool][cmp.Or(upgradeplan.DriverVersion(pod.Spec), "-")]++
	}
	var out []PoolDrivers
	for _, pool := range slices.Sorted(maps.Keys(counts)) {
		pd := PoolDrivers{Pool: pool}
		for _, v := range slices.Sorted(maps.Keys(counts[pool])) {
			pd.Drivers = append(pd.Drivers, DriverNodes{v, counts[pool][v]})
		}
		out = append(out, pd)
	}
	return out
}

func hasDRA(r *releasecheck.Report) bool {
	for _, n := range r.Nodes {
		if n.Allocation == releasecheck.AllocationDRA {
			return true
		}
	}
	return false
}

// firstNotReady is a row's first operand (in the report's order) whose cell is neither ready nor rolling.
func firstNotReady(operands []string, row releasecheck.NodeRow) (string, releasecheck.Cell, bool) {
	for _, op := range operands {
		if cell, ok := row.Cells[op]; ok && cell.State != releasecheck.Ready && cell.State != releasecheck.Rolling {
			return op, cell, true
		}
	}
	return "", releasecheck.Cell{}, false
}

// healthCondition is the GPU health condition's type in the release's computed values, or the chart's default.
func healthCondition(values map[string]any) string {
	v, _ := lookup(values, "global", "health", "nodeCondition", "type").(string)
	return cmp.Or(v, DefaultHealthCondition)
}

func lookup(m map[string]any, path ...string) any {
	var cur any = m
	for _, k := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[k]
	}
	return cur
}

// CollectAll is the view of every source, in their order, read side by side, each within timeout.
func CollectAll(ctx context.Context, sources []Source, timeout time.Duration) []Cluster {
	out := make([]Cluster, len(sources))
	done := make(chan struct{}, len(sources))
	for i, s := range sources {
		go func() {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i] = Collect(cctx, s)
			done <- struct{}{}
		}()
	}
	for range sources {
		<-done
	}
	return out
}
