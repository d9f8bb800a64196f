// Package releasecheck decides whether an installed release works: every operand DaemonSet rolled out on the nodes
// its selector matches, every GPU node's validation passed, every DRA node's GPUs published as ResourceSlices, and
// no cluster-level problem (no GPU node at all, GPU nodes no driver pool covers, nodes two pools select, nodes both
// allocation plugins target). Evaluate is a pure function of a snapshot of the cluster;
// Run keeps the snapshot current with watches and re-evaluates on every change, so it ends as soon as the last
// node turns ready.
package releasecheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// GPUPresentLabel marks GPU nodes (set by the chart's NodeFeatureRule, or by hand without NFD).
const GPUPresentLabel = "nvidia.com/gpu.present"

// componentLabel names a pod's or DaemonSet's operand.
const componentLabel = "app.kubernetes.io/component"

// validatorOperands are the operands whose readiness is the node's validation, explained by the validator's
// annotations.
var validatorOperands = map[string]bool{"operator-validator": true, "sandbox-validator": true}

// driverOperands install the driver; their pods wait on the node's driver upgrade.
var driverOperands = map[string]bool{"driver": true, "vgpu-manager": true}

// containerRoleOperands run only on container-role nodes, so a node that gets one of them needs a driver.
var containerRoleOperands = map[string]bool{"operator-validator": true, "container-toolkit": true}

// A GPU node's allocation mode is decided by which allocation DaemonSet targets it: the device plugin's or the DRA
// kubelet plugin's (operands by their component label). The pod template's affinity is evaluated as for every
// operand, so the mode follows however the chart places them (pool selectors, a node label).
const (
	AllocationDevicePlugin = "device-plugin"
	AllocationDRA          = "dra"
	// AllocationConflict: both target the node (a cluster problem, reported).
	AllocationConflict = "device-plugin+dra"

	devicePluginOperand = "device-plugin"
	draPluginOperand    = "dra-driver"
	// draGPUsContainer is the DRA kubelet plugin's container that publishes the node's GPUs as ResourceSlices; a
	// plugin without it (draDriver.gpus.enabled=false) publishes none, and none are waited for.
	draGPUsContainer = "gpus"
)

// SlicesColumn is the report's column for a DRA node's ResourceSlices of driver gpu.nvidia.com: ready once the
// node's slices are published, waiting until then (the scheduler allocates no claim there before).
const SlicesColumn = "resourceslices"

// State is a cell's or problem's state.
type State string

const (
	Ready   State = "ready"
	Waiting State = "waiting"
	Failed  State = "failed"
	// Rolling is a node's driver change the release does not wait for: its pool's canary validated the new driver,
	// and the node waits for its turn or is on its way, never more of the pool out at once than its maxUnavailable
	// (`kube-gpu-stack upgrade status` follows it). A release with rolling cells and nothing waiting or failed passed.
	Rolling State = "rolling"
)

// Cell is one operand on one node.
type Cell struct {
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Problem is a cluster-level finding; Waiting problems may still resolve (NFD labels nodes a little after install).
type Problem struct {
	State   State  `json:"state"`
	Message string `json:"message"`
}

// Snapshot is the cluster as the check sees it.
type Snapshot struct {
	Nodes      []*corev1.Node
	DaemonSets []*appsv1.DaemonSet
	Pods       []*corev1.Pod
	// Revisions maps a DaemonSet's UID to its current controller-revision-hash.
	Revisions map[types.UID]string
	// Events are the namespace's warning events (FailedCreate on a DaemonSet carries the admission reason).
	Events []*corev1.Event
	// WatchSlices says ResourceSlices were read (the release deploys the DRA driver): a DRA node waits in
	// SlicesColumn until ResourceSlices holds one of driver gpu.nvidia.com for it.
	WatchSlices    bool
	ResourceSlices []*resourcev1.ResourceSlice
}

// Report is the outcome: a node × operand grid and the cluster-level problems.
type Report struct {
	Release   string        `json:"release"`
	Namespace string        `json:"namespace"`
	Operands  []string      `json:"operands"`
	Nodes     []NodeRow     `json:"nodes"`
	Problems  []Problem     `json:"problems,omitempty"`
	Summary   map[State]int `json:"summary"`
	Elapsed   string        `json:"elapsed,omitempty"`
	// FailedUpgrades are the nodes whose driver change failed (upgrade-failed): waiting cannot help them, and the
	// rollout holds their slots of maxUnavailable, so the check ends at once.
	FailedUpgrades []string `json:"failedUpgrades,omitempty"`
	byNode         map[string]*NodeRow
}

// NodeRow is one node's cells, by operand.
type NodeRow struct {
	Name string `json:"name"`
	GPU  bool   `json:"gpu"`
	// Allocation is how the node hands out its GPUs, AllocationDevicePlugin or AllocationDRA (empty: neither
	// allocation DaemonSet targets it, e.g. a VM node or one whose switch is off or paused; AllocationConflict when
	// both do).
	Allocation string          `json:"allocation,omitempty"`
	Cells      map[string]Cell `json:"cells"`
}

// Settled reports whether nothing is waiting any more, or a node's driver change failed (the rest of a rollout
// that stopped there would only wait out the deadline).
func (r *Report) Settled() bool { return r.Summary[Waiting] == 0 || len(r.FailedUpgrades) > 0 }

// Passed reports whether everything is ready (or rolling: a driver change its pool's canary validated) and no
// problem was found.
func (r *Report) Passed() bool { return r.Summary[Waiting] == 0 && r.Summary[Failed] == 0 }

// Expire turns everything still waiting into a failure, at the deadline.
func (r *Report) Expire(after time.Duration) {
	prefix := fmt.Sprintf("timed out after %s: ", after.Round(time.Second))
	for i := range r.Nodes {
		for op, c := range r.Nodes[i].Cells {
			if c.State == Waiting {
				r.Nodes[i].Cells[op] = Cell{Failed, prefix + c.Reason}
			}
		}
	}
	for i, p := range r.Problems {
		if p.State == Waiting {
			r.Problems[i] = Problem{Failed, prefix + p.Message}
		}
	}
	r.count()
}

func (r *Report) count() {
	r.Summary = map[State]int{}
	for _, n := range r.Nodes {
		for _, c := range n.Cells {
			r.Summary[c.State]++
		}
	}
	for _, p := range r.Problems {
		r.Summary[p.State]++
	}
}

// set records c for operand on node; two DaemonSets of one operand on a node (overlapping pools) keep the worse.
func (r *Report) set(node *corev1.Node, operand string, c Cell) {
	row := r.byNode[node.Name]
	if row == nil {
		row = &NodeRow{Name: node.Name, GPU: node.Labels[GPUPresentLabel] == "true", Cells: map[string]Cell{}}
		r.byNode[node.Name] = row
	}
	if old, ok := row.Cells[operand]; ok && rank(old.State) >= rank(c.State) {
		return
	}
	row.Cells[operand] = c
}

func rank(s State) int {
	switch s {
	case Failed:
		return 2
	case Waiting:
		return 1
	}
	return 0
}

// Evaluate computes the report for release's DaemonSets in s.
func Evaluate(release, namespace string, pools []driverpools.Pool, s Snapshot) (*Report, error) {
	r := &Report{Release: release, Namespace: namespace, byNode: map[string]*NodeRow{}}
	nodes := slices.Clone(s.Nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	dss := slices.Clone(s.DaemonSets)
	slices.SortFunc(dss, func(a, b *appsv1.DaemonSet) int { return strings.Compare(a.Name, b.Name) })

	// indexed once: every DaemonSet × node cell looks up its own pods (1,000 nodes make a scan per cell quadratic)
	type ownerNode struct {
		owner types.UID
		node  string
	}
	podsOn := map[ownerNode][]*corev1.Pod{}
	for _, p := range s.Pods {
		if ref := controllerOf(p); ref != "" {
			k := ownerNode{ref, p.Spec.NodeName}
			podsOn[k] = append(podsOn[k], p)
		}
	}
	// the newest FailedCreate per DaemonSet says why its pods cannot be created (quota, admission, PSA)
	events := slices.Clone(s.Events)
	slices.SortStableFunc(events, func(a, b *corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	failedCreate := map[types.UID]string{}
	for _, e := range events {
		if e.Reason == "FailedCreate" && e.InvolvedObject.Kind == "DaemonSet" {
			failedCreate[e.InvolvedObject.UID] = e.Message
		}
	}

	rollingOn := rolling(nodes)
	operands := map[string]bool{}
	containerNodes := map[string]bool{}
	driverDS := map[string][]string{}   // node -> driver DaemonSets that select it
	allocation := map[string][]string{} // node -> allocation DaemonSets that select it, by mode
	slicesWanted := map[string]bool{}   // DRA nodes whose plugin publishes gpu.nvidia.com slices
	for _, ds := range dss {
		operand := operandOf(ds)
		fitter := schedule.NewDaemonSetFitter(&ds.Spec.Template.Spec)
		for _, n := range nodes {
			fits, err := fitter.Fits(n)
			if err != nil {
				return nil, fmt.Errorf("DaemonSet %s on node %s: %w", ds.Name, n.Name, err)
			}
			if !fits {
				continue
			}
			operands[operand] = true
			if containerRoleOperands[operand] {
				containerNodes[n.Name] = true
			}
			if operand == "driver" {
				driverDS[n.Name] = append(driverDS[n.Name], ds.Name)
			}
			switch operand {
			case devicePluginOperand:
				allocation[n.Name] = append(allocation[n.Name], AllocationDevicePlugin+" ("+ds.Name+")")
			case draPluginOperand:
				allocation[n.Name] = append(allocation[n.Name], AllocationDRA+" ("+ds.Name+")")
				if slices.ContainsFunc(ds.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == draGPUsContainer }) {
					slicesWanted[n.Name] = true
				}
			}
			c := podCell(ds, n, podsOn[ownerNode{ds.UID, n.Name}], s.Revisions[ds.UID], failedCreate[ds.UID])
			if validatorOperands[operand] {
				c = withValidation(c, n)
			}
			if driverOperands[operand] {
				c = withUpgradeState(c, n, adminPaced(ds), rollingOn[n.Name])
				failed := n.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeFailed) || nodestate.Reverted(n)
				if failed && !slices.Contains(r.FailedUpgrades, n.Name) {
					r.FailedUpgrades = append(r.FailedUpgrades, n.Name)
				}
			}
			r.set(n, operand, c)
		}
	}
	published := publishedSlices(s.ResourceSlices)
	var twoModes []Problem
	for _, n := range nodes {
		modes := allocation[n.Name]
		if len(modes) == 0 {
			continue
		}
		row := r.byNode[n.Name]
		row.Allocation, _, _ = strings.Cut(modes[0], " ")
		if len(modes) > 1 {
			slices.Sort(modes)
			row.Allocation = AllocationConflict
			twoModes = append(twoModes, Problem{Failed, fmt.Sprintf("GPU node %s: targeted by %s; a node hands its GPUs "+
				"to pods through the device plugin or DRA, never both (check its pool's gpuAllocation and its labels)",
				n.Name, strings.Join(modes, " and "))})
			continue
		}
		if row.Allocation == AllocationDRA && slicesWanted[n.Name] && s.WatchSlices {
			operands[SlicesColumn] = true
			r.set(n, SlicesColumn, sliceCell(n.Name, published[n.Name]))
		}
	}
	r.Operands = slices.Sorted(maps.Keys(operands))
	for _, n := range nodes {
		if row := r.byNode[n.Name]; row != nil {
			r.Nodes = append(r.Nodes, *row)
		}
	}
	r.byNode = nil
	r.Problems = append(problems(nodes, pools, containerNodes, driverDS), twoModes...)
	r.count()
	return r, nil
}

// publishedSlices counts, per node, the devices in the node's ResourceSlices of driver gpu.nvidia.com (-1: slices
// published with no device in them; absent: none published).
func publishedSlices(rs []*resourcev1.ResourceSlice) map[string]int {
	out := map[string]int{}
	for _, s := range rs {
		if s.Spec.Driver != gpupods.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName == "" || s.DeletionTimestamp != nil {
			continue
		}
		node := *s.Spec.NodeName
		out[node] = max(out[node], 0) + len(s.Spec.Devices)
		if out[node] == 0 {
			out[node] = -1
		}
	}
	return out
}

// sliceCell says whether a DRA node's GPUs are published for the scheduler. A node with no slice has no GPU that a
// claim can get: its kubelet plugin has not registered (or not yet found the driver).
func sliceCell(node string, devices int) Cell {
	switch {
	case devices > 0:
		return Cell{Ready, ""}
	case devices < 0:
		return Cell{Waiting, fmt.Sprintf("node %s: its %s ResourceSlices list no device (the DRA kubelet plugin's %s container found no GPU)",
			node, gpupods.DRADriver, draGPUsContainer)}
	}
	return Cell{Waiting, fmt.Sprintf("node %s: no ResourceSlice of driver %s published for it: no claim can be allocated there until "+
		"the DRA kubelet plugin's %s container registers with the kubelet", node, gpupods.DRADriver, draGPUsContainer)}
}

func operandOf(ds *appsv1.DaemonSet) string {
	if strings.Contains(ds.Name, "mps-control-daemon") {
		return "mps-control-daemon"
	}
	if c := ds.Labels[componentLabel]; c != "" {
		return c
	}
	return ds.Name
}

func controllerOf(p *corev1.Pod) types.UID {
	for _, ref := range p.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			return ref.UID
		}
	}
	return ""
}

// podCell describes the DaemonSet's pod on node, from the DaemonSet's pods there.
func podCell(ds *appsv1.DaemonSet, node *corev1.Node, pods []*corev1.Pod, revision, failedCreate string) Cell {
	var pod *corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time) {
			pod = p
		}
	}
	if pod == nil {
		if failedCreate != "" {
			return Cell{Waiting, "no pod: FailedCreate: " + failedCreate}
		}
		return Cell{Waiting, "no pod created yet"}
	}
	stale := revision != "" && pod.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] != revision
	if stale && ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		return Cell{Waiting, fmt.Sprintf("pod %s runs an old revision; rolling update in progress", pod.Name)}
	}
	if ready(pod) {
		return Cell{Ready, ""}
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return Cell{Waiting, fmt.Sprintf("pod %s is %s: %s", pod.Name, pod.Status.Phase, pod.Status.Message)}
	}
	return Cell{Waiting, fmt.Sprintf("pod %s: %s", pod.Name, describe(pod))}
}

func ready(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describe says what holds a pod back, the way `kubectl get pod` would show it, with the message behind it.
func describe(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "unschedulable: " + c.Message
		}
	}
	n := len(p.Spec.InitContainers)
	for i, st := range p.Status.InitContainerStatuses {
		if st.State.Terminated != nil && st.State.Terminated.ExitCode == 0 {
			continue
		}
		if sidecar(p, st.Name) && st.State.Running != nil && st.Started != nil && *st.Started {
			continue // a native sidecar runs for the pod's life: started, it holds nothing back
		}
		return fmt.Sprintf("Init:%d/%d %s %s", i, n, st.Name, containerState(st))
	}
	for _, st := range p.Status.ContainerStatuses {
		if !st.Ready {
			return fmt.Sprintf("container %s %s", st.Name, containerState(st))
		}
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		return strings.TrimSpace(p.Status.Reason + " " + p.Status.Message)
	}
	return string(p.Status.Phase) + ", not ready"
}

// sidecar says whether the pod's init container name is a native sidecar (restartPolicy Always).
func sidecar(p *corev1.Pod, name string) bool {
	i := slices.IndexFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == name })
	return i >= 0 && p.Spec.InitContainers[i].RestartPolicy != nil && *p.Spec.InitContainers[i].RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func containerState(st corev1.ContainerStatus) string {
	switch s := st.State; {
	case s.Waiting != nil:
		return strings.TrimSpace(s.Waiting.Reason + " " + s.Waiting.Message)
	case s.Terminated != nil:
		t := s.Terminated
		return strings.TrimSpace(fmt.Sprintf("exited %d %s %s", t.ExitCode, t.Reason, t.Message))
	case s.Running != nil:
		return "running, not ready"
	}
	return "pending"
}

// withValidation explains a validator cell by the checks' own annotations on the node: a failed check fails the
// cell, a waiting check replaces the pod's generic "Init:1/4" with what it waits for.
func withValidation(c Cell, node *corev1.Node) Cell {
	var failed, waiting []string
	for _, k := range slices.Sorted(maps.Keys(node.Annotations)) {
		check, ok := strings.CutPrefix(k, nodestate.ValidationAnnotationPrefix)
		if !ok {
			continue
		}
		v, err := nodestate.ParseValidation(node.Annotations[k])
		if err != nil {
			failed = append(failed, check+": unreadable status "+node.Annotations[k])
			continue
		}
		switch v.State {
		case nodestate.CheckFailed:
			failed = append(failed, check+": "+v.Reason)
		case nodestate.CheckWaiting:
			waiting = append(waiting, check+": "+v.Reason)
		}
	}
	switch {
	case len(failed) > 0:
		return Cell{Failed, "validation " + strings.Join(failed, "; ")}
	case c.State == Waiting && len(waiting) > 0:
		return Cell{Waiting, "validation " + strings.Join(waiting, "; ") + " (" + c.Reason + ")"}
	}
	return c
}

// withUpgradeState holds a driver cell until the node's driver change is over: a Ready pod of the current
// revision is not enough, since the pod may turn Ready before (or without) the driver manager and the upgrade gate
// moving the node. A node the pre-upgrade plan marked, or that a driver pod is changing, waits until it reaches
// upgrade-done; an upgrade-failed node fails at once with its reason, since the driver manager refuses that node
// until `kube-gpu-stack upgrade retry`. On a DaemonSet the admin paces (adminPaced) an upgrade-required node waits
// for the admin, which is not the release's to wait for; a node whose pool's canary validated rolls on (rolling says
// why), bounded, which the release does not wait for either.
func withUpgradeState(c Cell, node *corev1.Node, adminPaced bool, rolling string) Cell {
	state := nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel])
	switch {
	case nodestate.Reverted(node):
		// the new driver failed there: the node goes back (or went back) to its old driver by itself, and the
		// pool holds; the release failed all the same
		return Cell{Failed, fmt.Sprintf("driver upgrade failed and %s; `kube-gpu-stack upgrade retry %s` tries the new driver again",
			nodestate.RevertSummary(node), node.Name)}
	case state == "" || state == nodestate.UpgradeDone:
		return c
	case state == nodestate.UpgradeFailed:
		reason := fmt.Sprintf("driver upgrade failed: %s; fix it, then run `kube-gpu-stack upgrade retry %s`",
			node.Annotations[nodestate.UpgradeReasonAnnotation], node.Name)
		if c.Reason != "" {
			reason += " (" + c.Reason + ")"
		}
		return Cell{Failed, reason}
	case c.State == Failed || adminPaced && state == nodestate.UpgradeRequired:
		return c
	case rolling != "":
		return Cell{Rolling, rolling}
	}
	reason := fmt.Sprintf("driver change not over: node is %s", state)
	if why := node.Annotations[nodestate.UpgradeReasonAnnotation]; why != "" {
		reason += ": " + why // what it waits for (the canary, a slot) or does, as its driver manager says
	}
	if c.Reason != "" {
		reason += " (" + c.Reason + ")"
	}
	return Cell{Waiting, reason}
}

// rolling names, for each node whose driver change the release need not wait for, why: the node is planned (its
// mark names a canary it is not), its change not over and not failed, and its pool's canary validated with no hold
// (canary.Decide). The rest of the pool then rolls on under its slots, which bound it; a pool without a canary is
// waited for whole, and a canary itself always.
func rolling(nodes []*corev1.Node) map[string]string {
	out := map[string]string{}
	turns := map[string]canary.Turn{} // by plan: Decide reads every node
	for _, n := range nodes {
		switch nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) {
		case "", nodestate.UpgradeDone, nodestate.UpgradeFailed:
			continue
		}
		m, err := canary.Read(n)
		if err != nil || m == nil || len(m.Canary) == 0 || m.IsCanary(n.Name) {
			continue
		}
		key := fmt.Sprintf("%s/%s/%d", m.Pool, m.Plan, m.Seq)
		turn, ok := turns[key]
		if !ok {
			turn = canary.Decide("", m, nodes)
			turns[key] = turn
		}
		if !turn.Go {
			continue
		}
		bound := "its slots"
		if m.MaxUnavailable > 0 {
			bound = fmt.Sprintf("at most %d of its nodes out at once", m.MaxUnavailable)
		}
		out[n.Name] = fmt.Sprintf("rolling, bounded: node is %s; pool %s's canary (%s) validated the new driver, %s",
			n.Labels[nodestate.UpgradeStateLabel], m.Pool, strings.Join(slices.Sorted(maps.Keys(m.Canary)), ", "), bound)
	}
	return out
}

// adminPaced says whether the admin starts each node's change of ds: an OnDelete DaemonSet whose pods do not replace
// themselves (a vGPU manager pool set to OnDelete), or whose upgrade gate replaces its pod only on the admin's
// request (a driver pool with autoUpgrade=false: --on-request). The driver DaemonSets are OnDelete in every pool; with
// autoUpgrade their old pods' gates carry the change on (--replace-outdated), which the release waits for.
func adminPaced(ds *appsv1.DaemonSet) bool {
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		return false
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if len(c.Command) > 0 && c.Command[0] == "driver-manager" && slices.Contains(c.Args, "--replace-outdated") {
			return slices.Contains(c.Args, "--on-request")
		}
	}
	return true
}

// ContainerRoleOperand reports whether operand runs only on container-role nodes: a node that gets it needs a driver.
func ContainerRoleOperand(operand string) bool { return containerRoleOperands[operand] }

// Coverage is the gate's check of driver coverage without a cluster: given the nodes that get a container-role
// operand and the driver DaemonSets that select each node, the problems of GPU nodes that no pool, or more than one
// pool, or no driver DaemonSet of their pool covers (and of no GPU node at all).
func Coverage(nodes []*corev1.Node, pools []driverpools.Pool, containerNodes map[string]bool, driverDS map[string][]string) []Problem {
	return problems(nodes, pools, containerNodes, driverDS)
}

// problems finds what no single cell shows: no GPU node at all, and GPU nodes that need a driver but that no
// pool, or more than one pool, or no driver DaemonSet of their pool covers.
func problems(nodes []*corev1.Node, pools []driverpools.Pool, containerNodes map[string]bool, driverDS map[string][]string) []Problem {
	var out []Problem
	gpus := 0
	for _, n := range nodes {
		if n.Labels[GPUPresentLabel] == "true" {
			gpus++
		}
	}
	if gpus == 0 {
		out = append(out, Problem{Waiting, "no node is labelled " + GPUPresentLabel + "=true: NFD is not running or " +
			"not labelling GPU nodes (check the node-feature-discovery pods and the nvidia-gpu-present NodeFeatureRule), " +
			"or, without NFD, label GPU nodes by hand"})
	}
	if len(pools) == 0 {
		return out
	}
	for _, n := range nodes {
		if n.Labels[GPUPresentLabel] != "true" || !containerNodes[n.Name] {
			continue
		}
		if v, ok := n.Labels[nodestate.DriverDeployLabel]; !nodestate.SwitchOn(v, ok) && v != nodestate.Paused {
			continue // the admin opted out, or a host driver was found
		}
		matched, err := driverpools.Matching(pools, n)
		if err != nil {
			out = append(out, Problem{Failed, err.Error()})
			continue
		}
		switch {
		case len(matched) == 0:
			out = append(out, Problem{Failed, fmt.Sprintf("GPU node %s: no driver pool selects it (add a pool whose "+
				"nodeSelector matches it, or a default pool)", n.Name)})
		case len(matched) > 1:
			names := driverpools.Names(matched)
			out = append(out, Problem{Failed, fmt.Sprintf("GPU node %s: selected by driver pools %s; pools must not "+
				"overlap (make their nodeSelectors exclusive)", n.Name, strings.Join(names, " and "))})
		case matched[0].Source == "container" && len(driverDS[n.Name]) == 0:
			out = append(out, Problem{Failed, fmt.Sprintf("GPU node %s: pool %s has no driver DaemonSet for its OS/kernel "+
				"(%s=%s, %s=%s, %s=%s): add it to driver.os or the pool's precompiled kernels", n.Name, matched[0].Name,
				osIDLabel, n.Labels[osIDLabel], osVersionLabel, n.Labels[osVersionLabel], kernelLabel, n.Labels[kernelLabel])})
		case len(driverDS[n.Name]) > 1:
			out = append(out, Problem{Failed, fmt.Sprintf("GPU node %s: selected by driver DaemonSets %s",
				n.Name, strings.Join(driverDS[n.Name], " and "))})
		}
	}
	return out
}

const (
	osIDLabel      = "feature.node.kubernetes.io/system-os_release.ID"
	osVersionLabel = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	kernelLabel    = "feature.node.kubernetes.io/kernel-version.full"
)
