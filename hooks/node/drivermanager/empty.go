package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpudrain"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// emptyNode moves the node's workloads off and stops what uses its GPUs, short of the driver itself: cordon (as
// ours) and pause the GPU operands, evict the GPU pods (auto-drain on failure) while the operands' pods go, the DRA
// kubelet plugin last. The new driver pod's manager runs it before the unload; the old driver pod's upgrade gate runs it
// before that pod stops (replace.go), so that the old driver container's stop finds nothing on the GPUs. drained
// says whether the whole node was drained.
func (m *manager) emptyNode(ctx context.Context) (drained bool, err error) {
	moveOff := m.o.Eviction.Enabled || m.o.Drain.Enabled
	// the node says it is under maintenance before anything on it stops
	if err := m.o.Maintenance.begin(ctx, m.o.Client, m.o.NodeName, m.o.APITimeout); err != nil {
		return false, err
	}
	if err := m.apply(ctx, m.emptyingState(nodestate.CordonRequired), m.o.Maintenance.label()); err != nil {
		return false, err
	}
	// The operands pause with the cordon and leave while the GPU pods are evicted, as the reference driver manager
	// pauses them before it evicts: a running job keeps the GPUs it holds (it only loses their monitoring), no new
	// pod gets one, and the node is empty after the longer of the two waits, not their sum. (The DRA kubelet plugin
	// is not among them: it goes last, once no pod holds a claim.) A switch the admin sets meanwhile is kept:
	// Resume restores only what is still paused.
	pause := func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Pause(n, nodestate.PausableOperands) }
	cs := []change{m.emptyingState(nodestate.PodDeletionRequired), pause}
	if moveOff {
		cs = append(cs, pure(func(n *corev1.Node) nodestate.Patch { return nodestate.Cordon(n, cordonReason) }))
	}
	if err := m.apply(ctx, cs...); err != nil {
		return false, err
	}
	if err := m.step(ctx, "cordon"); err != nil {
		return false, err
	}
	paused := m.paused(nodestate.PausableOperands)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		drained, err = m.moveGPUPodsOff(gctx, "")
		return err
	})
	g.Go(func() error { return m.awaitOperandsGone(gctx, paused) })
	if err := g.Wait(); err != nil {
		return false, err
	}
	if len(paused) > 0 {
		m.log.Info("paused operands are gone", "operands", paused)
	}
	if err := m.step(ctx, "evict"); err != nil {
		return false, err
	}
	if err := m.apply(ctx, m.emptyingState(nodestate.PodRestartRequired)); err != nil {
		return false, err
	}
	if err := m.step(ctx, "pause"); err != nil {
		return false, err
	}
	// the DRA kubelet plugin goes last, within the operands step (a stop after "pause" finds it still running)
	if err := m.pauseDRAPlugin(ctx); err != nil {
		return false, err
	}
	// a GPU pod that landed during the eviction (it tolerates the cordon, or names the node) got its GPU from the
	// device plugin or the DRA plugin still running then: with both gone none can come, so one more pass empties the
	// node for good before the old driver stops
	if !drained {
		if drained, err = m.moveGPUPodsOff(ctx, " that arrived during the eviction"); err != nil {
			return false, err
		}
	}
	if err := m.step(ctx, "operands"); err != nil {
		return false, err
	}
	return drained, nil
}

// emptying is the order of the states a node goes through while emptyNode empties it.
var emptying = []nodestate.UpgradeState{nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired}

// emptyingState is the change to state s of the emptying, none on a node past it already: the new driver pod's
// manager goes over a node its old pod's gate emptied (for pods that arrived meanwhile) without taking its state
// back, and a run that resumes an emptying goes on from where the state says it stopped.
func (m *manager) emptyingState(s nodestate.UpgradeState) change {
	return pure(func(n *corev1.Node) nodestate.Patch {
		if slices.Index(emptying, nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])) >= slices.Index(emptying, s) {
			return nodestate.Patch{}
		}
		return m.setState(n, s, "")
	})
}

// moveGPUPodsOff evicts the node's GPU pods (when eviction is on), or drains the node when that fails and
// auto-drain is on; drained says it drained. which qualifies the pods in the error.
func (m *manager) moveGPUPodsOff(ctx context.Context, which string) (drained bool, err error) {
	if !m.o.Eviction.Enabled {
		return false, nil
	}
	err = m.evictGPUPods(ctx)
	if err == nil {
		return false, nil
	}
	if !m.o.Drain.Enabled || ctx.Err() != nil {
		return false, fmt.Errorf("evict GPU pods%s: %w", which, err)
	}
	m.log.Info("evicting GPU pods failed; draining the node (auto-drain)", "err", err)
	if err := m.drain(ctx, err.Error()); err != nil {
		return false, err
	}
	return true, nil
}

// unload removes the driver's modules: all of them, or, when one is in use, none (kmod.Host.Unload). A module
// in use names the pods of the processes that hold it. An unload that failed midway and could not load back what
// it removed is remembered, so that failed keeps the node cordoned.
func (m *manager) unload(ctx context.Context) ([]string, error) {
	unloaded, err := m.o.Host.Unload()
	var partial *kmod.PartialUnloadError
	if errors.As(err, &partial) {
		m.missing = partial.Missing
	}
	var busy *kmod.BusyError
	if errors.As(err, &busy) {
		m.namePods(ctx, busy.Processes)
	}
	return unloaded, err
}

// namePods fills in the namespace/name of the pods the processes run in, from the pods on the node (best effort:
// a process whose pod is not found keeps its pod UID).
func (m *manager) namePods(ctx context.Context, procs []kmod.Process) {
	if !slices.ContainsFunc(procs, func(p kmod.Process) bool { return p.PodUID != "" }) {
		return
	}
	pods, err := m.o.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + m.o.NodeName})
	if err != nil {
		m.log.Info("cannot name the pods holding the GPUs", "err", err)
		return
	}
	for i := range procs {
		for _, p := range pods.Items {
			if procs[i].PodUID != "" && string(p.UID) == procs[i].PodUID {
				procs[i].Pod = p.Namespace + "/" + p.Name
			}
		}
	}
}

// driverMissing says why the node has no working NVIDIA driver ("" when it has one): an unload that could not
// load back what it removed, or no nvidia module loaded (unloaded for the new driver, or never installed).
func (m *manager) driverMissing() string {
	if m.agent {
		return ""
	}
	if len(m.missing) > 0 {
		return "kernel modules " + strings.Join(m.missing, ", ") + " were removed and not loaded back"
	}
	mods, err := m.o.Host.Loaded()
	if err != nil {
		return fmt.Sprintf("its loaded kernel modules cannot be read (%v)", err)
	}
	if !slices.ContainsFunc(mods, func(mod kmod.Module) bool { return mod.Name == "nvidia" }) {
		return "no NVIDIA driver is loaded"
	}
	return ""
}

func (m *manager) evictGPUPods(ctx context.Context) error {
	d := gpudrain.Options{
		Client: m.o.Client, Node: m.o.NodeName, GPUOnly: true, Log: m.drainLog,
		Force: m.o.Eviction.Force, DeleteEmptyDirData: m.o.Eviction.DeleteEmptyDirData, Timeout: m.o.Eviction.Timeout,
	}
	d.Complete()
	if err := d.Validate(); err != nil {
		return err
	}
	res, err := d.Run(ctx, m.out)
	if err == nil && len(res.Pods) > 0 {
		m.log.Info("GPU pods evicted", "pods", res.Pods)
	}
	return err
}

func (m *manager) drain(ctx context.Context, why string) error {
	if err := m.apply(ctx, m.state(nodestate.DrainRequired, why)); err != nil {
		return err
	}
	d := gpudrain.Options{
		Client: m.o.Client, Node: m.o.NodeName, PodSelector: m.o.Drain.PodSelector, Log: m.drainLog,
		Force: m.o.Drain.Force, DeleteEmptyDirData: m.o.Drain.DeleteEmptyDirData, Timeout: m.o.Drain.Timeout,
	}
	d.Complete()
	if err := d.Validate(); err != nil {
		return err
	}
	res, err := d.Run(ctx, m.out)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	m.log.Info("node drained", "pods", res.Pods)
	return nil
}

// paused are those of ops whose switch is paused on the node.
func (m *manager) paused(ops []string) []string {
	var paused []string
	for _, op := range ops {
		if m.node.Labels[nodestate.DeployLabelPrefix+op] == nodestate.Paused {
			paused = append(paused, op)
		}
	}
	return paused
}

// pauseDRAPlugin stops the DRA kubelet plugin on a DRA node, after everything else, as the reference driver
// manager (k8s-driver-manager v0.12.0) does: the plugin unprepares the claims of pods as they leave, so it goes
// only once no pod holds a gpu.nvidia.com claim. The other operands paused with the cordon, as the reference
// pauses them before it evicts; by now the eviction is over and the claim holders are gone. One still there (eviction off, a PDB that refused it, a DaemonSet pod, which the eviction
// skips) fails the run, the plugin untouched: the restore resumes the other operands and no claim is stranded.
func (m *manager) pauseDRAPlugin(ctx context.Context) error {
	op := m.o.DRAPlugin
	if op == "" {
		return nil
	}
	running, err := m.operandPods(ctx, op)
	if err != nil {
		return err
	}
	// a run stopped after this pause finds the plugin gone and its switch paused: it is a DRA node all the same
	if len(running) == 0 && len(m.paused([]string{op})) == 0 {
		return nil
	}
	var holders []string
	err = apiretry.Do(ctx, func(ctx context.Context) error {
		holders, err = gpupods.ClaimHolders(ctx, m.o.Client, m.o.NodeName)
		return err
	})
	if err != nil {
		return err
	}
	if len(holders) > 0 {
		return fmt.Errorf("cannot stop the DRA kubelet plugin (%s%s): pods still hold %s claims: %s (evict them, or let ENABLE_GPU_POD_EVICTION do it)",
			nodestate.DeployLabelPrefix, op, gpupods.DRADriver, strings.Join(holders, ", "))
	}
	pause := func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Pause(n, []string{op}) }
	if err := m.apply(ctx, pause); err != nil {
		return err
	}
	m.log.Info("no pod holds a GPU claim: DRA kubelet plugin paused", "switch", nodestate.DeployLabelPrefix+op)
	return m.waitOperandsGone(ctx, m.paused([]string{op}))
}

// operandPods lists the pods of an operand on the node.
func (m *manager) operandPods(ctx context.Context, op string) ([]corev1.Pod, error) {
	var pods *corev1.PodList
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		pods, err = m.o.Client.CoreV1().Pods(m.o.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: ComponentLabel + "=" + op, FieldSelector: "spec.nodeName=" + m.o.NodeName})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the %s pods on the node: %w", op, err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName == m.o.NodeName {
			out = append(out, p)
		}
	}
	return out, nil
}

// waitOperandsGone watches until no pod of the paused operands is left on the node.
func (m *manager) waitOperandsGone(ctx context.Context, paused []string) error {
	if err := m.awaitOperandsGone(ctx, paused); err != nil || len(paused) == 0 {
		return err
	}
	m.log.Info("paused operands are gone", "operands", paused)
	return nil
}

// awaitOperandsGone is waitOperandsGone without the log line: it runs beside the eviction, which writes to the
// same output.
func (m *manager) awaitOperandsGone(ctx context.Context, paused []string) error {
	if len(paused) == 0 {
		return nil
	}
	req, err := labels.NewRequirement(ComponentLabel, selection.In, paused)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.o.OperandTimeout)
	defer cancel()
	pods, err := kwatch.Start(ctx, kwatch.NodePods(m.o.Client, m.o.Namespace, m.o.NodeName, req.String()), &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watch operand pods: %w", err)
	}
	err = kwatch.Until(ctx, pods, func(ps []*corev1.Pod) (bool, error) { return len(ps) == 0, nil })
	if err != nil {
		var left []string
		for _, p := range pods.List() {
			left = append(left, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, p.Labels[ComponentLabel]))
		}
		return fmt.Errorf("paused operands' pods still on the node after %s: %s (is their DaemonSet's node affinity honouring the %s* switches?): %w",
			m.o.OperandTimeout, strings.Join(left, ", "), nodestate.DeployLabelPrefix, err)
	}
	return nil
}
