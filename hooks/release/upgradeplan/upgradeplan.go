// Package upgradeplan is the pre-upgrade hook: before Helm applies a new driver configuration it finds the GPU
// nodes whose driver will change (the pool's rendered DRIVER_CONFIG_DIGEST against the digest their running driver
// pod carries), prints the plan in batches of the pool's maxUnavailable, and marks those nodes upgrade-required —
// or refuses, changing nothing, when the upgrade is unsafe. It arms and checks; the DaemonSet rollout and the
// driver manager do the work. On a first install (Argo CD runs it as PreSync then too) there is no driver pod, so
// it finds nothing to do. vGPU manager pools are planned the same way on the nodes that run a vGPU manager pod (its
// pod runs the same driver manager with the same digest), paced by their DaemonSets' maxUnavailable, without a
// canary.
package upgradeplan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// DigestEnv is the driver manager's env var carrying the pool's config digest in the driver pod.
const DigestEnv = "DRIVER_CONFIG_DIGEST"

// Options configure Run.
type Options struct {
	Client             kubernetes.Interface
	Namespace, Release string
	Pools              []driverpools.Pool
	// VGPUPools are the vGPU manager pools (VGPU_MANAGER_POOLS, the same shape), planned on the nodes that run a
	// vGPU manager pod.
	VGPUPools []driverpools.Pool
	// Evict: the driver manager evicts GPU pods before unloading, so PDBs that never allow an eviction block it.
	Evict bool
	// Force proceeds although PDBs block eviction: each such node fails its driver change alone, restored.
	Force bool
	// Now stamps the state change; defaults to time.Now.
	Now func() time.Time
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	if o.Client == nil || o.Namespace == "" || o.Release == "" {
		return errors.New("need a client, --namespace and --release")
	}
	for _, p := range slices.Concat(o.Pools, o.VGPUPools) {
		if err := p.CheckMaxUnavailable(); err != nil {
			return err
		}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// ErrUnsafe wraps every refusal.
var ErrUnsafe = errors.New("driver upgrade refused, nothing changed")

// The kinds of pool a plan covers: driver pools on container nodes, vGPU manager pools on vm-vgpu nodes.
const (
	KindDriver      = "driver"
	KindVGPUManager = "vgpu-manager"
)

// NodePlan is one node whose driver will change, and the driver DaemonSet that will change it.
type NodePlan struct {
	Node, Pool, DaemonSet, From, To string
	// Kind is KindDriver or KindVGPUManager: which kind of pool Pool is (a name is unique within its kind only).
	Kind string
	// HeldBy says, for a held node, what holds it: HeldByLabel (the admin's label) or HeldByValues.
	HeldBy string
	// Allocation is "<from> -> <to>" when the node also switches between the device plugin and DRA (its
	// nvidia.com/gpu.allocation label against the pool's mode), else empty.
	Allocation string
	// Moves are the GPU pods the switch evicts (namespace/name), listed for an allocation switch.
	Moves []string
}

// What holds a node on its current driver (NodePlan.HeldBy).
const (
	HeldByLabel  = "skip label"
	HeldByValues = "driver.upgradePolicy.hold"
	// HeldByRevert: the plan's driver is the one that already failed validation on the node, which went back to the
	// driver that last validated there (nodestate.RevertedAnnotation); `upgrade retry` tries it again.
	HeldByRevert = "reverted"
)

// heldBy says what holds node on its driver ("" when nothing): its pool's upgradePolicy.hold, or the skip label
// when the admin set it; a label the release seeded for a node no longer listed is about to go (Run takes it back).
func heldBy(node *corev1.Node, listed map[string]bool) string {
	switch {
	case listed[node.Name]:
		return HeldByValues
	case node.Labels[nodestate.UpgradeSkipLabel] != "true":
		return ""
	}
	if seeded, err := nodestate.Seeded(node, nodestate.UpgradeSkipLabel); err == nil && seeded {
		return ""
	}
	return HeldByLabel
}

// holdList is every node some pool's upgradePolicy.hold names.
func holdList(pools ...[]driverpools.Pool) map[string]bool {
	out := map[string]bool{}
	for _, ps := range pools {
		for _, p := range ps {
			for _, n := range p.Hold {
				out[n] = true
			}
		}
	}
	return out
}

// Plan is what the upgrade will do.
type Plan struct {
	// Canary per pool: its first nodes (upgradePolicy.canary, in the plan's order), which change alone and must
	// validate before any other node of the pool starts (package canary). Pools that are OnDelete
	// (autoUpgrade=false) have none: there the admin picks each node.
	Canary map[string][]NodePlan
	// Marks per pool: what Run writes on each of its planned nodes (canary.MarkAnnotation); absent for a pool with
	// neither a canary nor a failure threshold, or OnDelete.
	Marks map[string]canary.Mark
	// Batches per driver (or vGPU manager) DaemonSet, in order, after the canary; each batch is at most the driver
	// pool's slots (its maxUnavailable of all its nodes), or the vGPU manager pool's maxUnavailable of that
	// DaemonSet's nodes, the bound its RollingUpdate enforces.
	Batches map[string][][]NodePlan
	Nodes   []NodePlan
	// Resumed names, per pool, the running plan this one keeps: its target is the same (a re-sync that changes no
	// driver), so the pool goes on under the same canary and marks, and nothing is written for it.
	Resumed map[string]string
	// Held are the nodes whose driver would change but that the admin holds on their current one
	// (nodestate.UpgradeSkipLabel): not planned, not marked, their old driver in service.
	Held []NodePlan
	// Refusals say why the upgrade is unsafe; empty means go.
	Refusals []string
	// Unrevert are reverted nodes (nodestate.RevertLabel) this plan moves to another driver than the one that failed
	// on them: Run takes them back from their revert DaemonSet, label and record, with their mark.
	Unrevert []string
	// Forgive are reverted nodes whose pool goes back to the driver they reverted to (a rollback): they keep it, from
	// the revert DaemonSet until their next change, and no longer count as failed (Run drops the record).
	Forgive []string
	// Reverts are, per driver DaemonSet of a pool with upgradePolicy.revert on, the driver configs its nodes may have
	// to go back to: Run keeps a revert DaemonSet of each it can (package revertset).
	Reverts map[string]RevertNeed
	// CalledOff are nodes still upgrade-required from an earlier plan whose driver pod already has the config this
	// release renders (that upgrade was reverted before the rollout reached them): nothing will move them on, so
	// Run sets them back to upgrade-done, or the post-upgrade gate would wait for them to its deadline.
	CalledOff []string
	// LeftOver are driver and vGPU manager DaemonSets of the release that no pool of this release renders, left by
	// upgrades that failed (leftOver); Run deletes them.
	LeftOver []string
}

// Compute builds the plan from the cluster without changing it.
func Compute(ctx context.Context, o Options) (*Plan, error) {
	nodeList, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.NodeList, error) {
		return o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	nodes := map[string]*corev1.Node{}
	for i := range nodeList.Items {
		nodes[nodeList.Items[i].Name] = &nodeList.Items[i]
	}
	plan := &Plan{Batches: map[string][][]NodePlan{}, Canary: map[string][]NodePlan{}, Marks: map[string]canary.Mark{}, Resumed: map[string]string{},
		Reverts: map[string]RevertNeed{}}
	marks := readMarks(nodes)
	unfit := map[string]string{}           // planned driver node -> why it cannot be its pool's canary ("" when it can)
	pools := map[string]driverpools.Pool{} // driver pools with planned nodes: their canary and marks
	dsNodes := map[string][]*corev1.Node{} // target DaemonSet -> the nodes it will serve
	dsPool := map[string]driverpools.Pool{}
	dsKind := map[string]string{}
	owner := map[string]NodePlan{}  // node -> the pool of the first kind whose pod runs there
	podsOf := map[string][]string{} // DaemonSet -> the nodes its pods run on
	stopping := map[string]bool{}   // nodes with a driver pod being deleted: its gate empties them before it stops
	targetOf := map[string]string{} // node -> the DaemonSet this release gives it
	listed := holdList(o.Pools, o.VGPUPools)
	for _, k := range []struct {
		kind  string
		pools []driverpools.Pool
	}{{KindDriver, o.Pools}, {KindVGPUManager, o.VGPUPools}} {
		sel := labels.Set{"app.kubernetes.io/instance": o.Release, "app.kubernetes.io/component": k.kind}.String()
		kindPods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
			return o.Client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		})
		if err != nil {
			return nil, fmt.Errorf("list %s pods: %w", kindNoun[k.kind], err)
		}
		for i := range kindPods.Items {
			pod := &kindPods.Items[i]
			node := nodes[pod.Spec.NodeName]
			if node != nil && pod.DeletionTimestamp != nil {
				stopping[node.Name] = true
			}
			if node == nil || pod.DeletionTimestamp != nil {
				continue
			}
			if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "DaemonSet" {
				podsOf[ref.Name] = append(podsOf[ref.Name], node.Name)
			}
			matched, err := driverpools.Matching(k.pools, node)
			if err != nil {
				return nil, err
			}
			switch {
			case len(matched) == 0:
				plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s runs a %s but no %s selects it any more: "+
					"the upgrade would remove its %s under running workloads", node.Name, kindNoun[k.kind], poolNoun(k.kind), kindNoun[k.kind]))
				continue
			case len(matched) > 1:
				plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s is selected by %s pools %s",
					node.Name, kindNoun[k.kind], strings.Join(driverpools.Names(matched), " and ")))
				continue
			}
			pool := matched[0]
			// one role per node: a node with pods of both kinds could be planned twice, each kind with its own pace
			if other, ok := owner[node.Name]; ok && other.Kind != k.kind {
				plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s runs a %s pod (%s pool %s) and a %s pod (%s pool %s): a node "+
					"has one role (nvidia.com/gpu.workload.config), so one of them is leaving; wait until its pod is gone", node.Name,
					kindNoun[other.Kind], kindNoun[other.Kind], other.Pool, kindNoun[k.kind], kindNoun[k.kind], pool.Name))
				continue
			}
			owner[node.Name] = NodePlan{Kind: k.kind, Pool: pool.Name}
			if pool.Source != "container" {
				plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s runs a %s pod but %s %s is now source=%s: "+
					"drain it and remove the %s pod first", node.Name, kindNoun[k.kind], poolNoun(k.kind), pool.Name, pool.Source, kindNoun[k.kind]))
				continue
			}
			ds, err := pool.DaemonSetFor(node)
			if err != nil {
				return nil, err
			}
			if ds == nil {
				plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s (%s %s, kernel %s): %s %s has no %s "+
					"image for its OS/kernel any more", node.Name, node.Labels[osIDLabel], node.Labels[osVersionLabel],
					node.Labels[kernelLabel], poolNoun(k.kind), pool.Name, kindNoun[k.kind]))
				continue
			}
			targetOf[node.Name] = ds.Name
			if k.kind == KindDriver {
				pools[pool.Name] = pool
			}
			dsNodes[ds.Name] = append(dsNodes[ds.Name], node)
			dsPool[ds.Name] = pool
			dsKind[ds.Name] = k.kind
			from := PodDigest(pod)
			if k.kind == KindDriver && pool.RevertOn() {
				plan.Reverts[ds.Name] = plan.Reverts[ds.Name].add(ds.Digest, from, node)
			}
			// a node is judged by the driver it runs as well as by its pod: a new pod that has not validated yet (it
			// waits for the node's turn, or installs) on a node whose recorded driver is another still has a change to make
			if running := node.Annotations[nodestate.DriverDigestAnnotation]; from == ds.Digest && running != "" && running != from && !podReady(pod) {
				from = running
			}
			if from == ds.Digest && node.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeRequired) {
				plan.CalledOff = append(plan.CalledOff, node.Name)
			}
			// a switch between the device plugin and DRA goes the driver change's way, with an unchanged driver too
			switching := AllocationSwitch(node, pool.Allocation)
			revert, revertErr := nodestate.ReadRevert(node)
			if from == ds.Digest && switching == "" {
				if revert != nil && revert.From != ds.Digest {
					plan.Forgive = append(plan.Forgive, node.Name) // the pool went back to the driver the node reverted to
				}
				continue
			}
			if revertErr == nil && revert != nil && revert.From == ds.Digest && switching == "" {
				plan.Held = append(plan.Held, NodePlan{Node: node.Name, Pool: pool.Name, Kind: k.kind, DaemonSet: ds.Name, From: from, To: ds.Digest, HeldBy: HeldByRevert})
				continue
			}
			if by := heldBy(node, listed); by != "" {
				plan.Held = append(plan.Held, NodePlan{Node: node.Name, Pool: pool.Name, Kind: k.kind, DaemonSet: ds.Name, From: from, To: ds.Digest, Allocation: switching, HeldBy: by})
				continue
			}
			plan.Nodes = append(plan.Nodes, NodePlan{Node: node.Name, Pool: pool.Name, Kind: k.kind, DaemonSet: ds.Name, From: from, To: ds.Digest, Allocation: switching})
			unfit[node.Name] = canaryUnfit(node, pod)
			if _, ok := node.Labels[nodestate.RevertLabel]; ok {
				plan.Unrevert = append(plan.Unrevert, node.Name)
			}
		}
	}
	kinds := []string{KindDriver}
	if o.VGPUPools != nil {
		kinds = append(kinds, KindVGPUManager) // without them, a vGPU manager DaemonSet is not known for left over
	}
	if plan.LeftOver, err = leftOver(ctx, o, podsOf, targetOf, kinds); err != nil {
		return nil, err
	}
	// a node whose driver pod stops is being emptied by that pod's gate, whatever its next pod installs
	plan.CalledOff = slices.DeleteFunc(plan.CalledOff, func(n string) bool { return stopping[n] })
	slices.Sort(plan.CalledOff)
	slices.Sort(plan.Unrevert)
	slices.Sort(plan.Forgive)
	slices.SortFunc(plan.Held, func(a, b NodePlan) int { return strings.Compare(a.Node, b.Node) })
	slices.SortFunc(plan.Nodes, func(a, b NodePlan) int {
		return strings.Compare(a.DaemonSet+"/"+a.Node, b.DaemonSet+"/"+b.Node)
	})

	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	// each driver pool's slots (package slots): its maxUnavailable of all its nodes, whatever DaemonSets (OS,
	// kernel) serve them; the driver DaemonSets are OnDelete, so the slots are the one bound
	poolNodes := map[string]int{}
	for dsName, members := range dsNodes {
		if dsKind[dsName] == KindDriver {
			poolNodes[dsPool[dsName].Name] += len(members)
		}
	}
	poolMax := map[string]int{}
	for name, count := range poolNodes {
		n, err := pools[name].MaxUnavailableNodes(count)
		if err != nil {
			return nil, err
		}
		poolMax[name] = n
	}
	inCanary := planCanary(plan, pools, poolMax, now(), marks, unfit)
	for _, n := range nodes {
		if n.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeFailed) && heldBy(n, listed) == "" {
			plan.Refusals = append(plan.Refusals, fmt.Sprintf("node %s is in upgrade-failed (%s): fix it, then run "+
				"`kube-gpu-stack upgrade retry %s`", n.Name, n.Annotations[nodestate.UpgradeReasonAnnotation], n.Name))
		}
	}
	for _, dsName := range slices.Sorted(maps.Keys(dsNodes)) {
		members, pool := dsNodes[dsName], dsPool[dsName]
		maxUnavailable, err := pool.MaxUnavailableNodes(len(members))
		if err != nil {
			return nil, err
		}
		if dsKind[dsName] == KindDriver {
			maxUnavailable = poolMax[pool.Name] // a batch of the pool's slots, this DaemonSet's nodes first
		}
		var batch []NodePlan
		for _, np := range plan.Nodes {
			if np.DaemonSet != dsName || inCanary[np.Node] {
				continue
			}
			if batch = append(batch, np); len(batch) == maxUnavailable {
				plan.Batches[dsName] = append(plan.Batches[dsName], batch)
				batch = nil
			}
		}
		if len(batch) > 0 {
			plan.Batches[dsName] = append(plan.Batches[dsName], batch)
		}
		if len(plan.Batches[dsName]) == 0 && !slices.ContainsFunc(plan.Nodes, func(np NodePlan) bool { return np.DaemonSet == dsName }) {
			continue
		}
		var down []string
		for _, n := range members {
			if unavailable(n) {
				down = append(down, n.Name)
			}
		}
		if len(down) > maxUnavailable {
			slices.Sort(down)
			plan.Refusals = append(plan.Refusals, fmt.Sprintf("%s (%s %s): %d of its nodes are already unavailable (%s), "+
				"more than its maxUnavailable %d: bring them back first", dsName, poolNoun(dsKind[dsName]), pool.Name, len(down), strings.Join(down, ", "), maxUnavailable))
		}
	}
	if err := listMoves(ctx, o.Client, plan.Nodes); err != nil {
		return nil, err
	}
	// the vGPU manager never evicts (its driver manager runs with eviction off): budgets block only driver nodes
	evicting := slices.DeleteFunc(slices.Clone(plan.Nodes), func(np NodePlan) bool { return np.Kind != KindDriver })
	if o.Evict && !o.Force && len(evicting) > 0 {
		blocked, err := blockingPDBs(ctx, o.Client, evicting)
		if err != nil {
			return nil, err
		}
		plan.Refusals = append(plan.Refusals, blocked...)
	}
	slices.Sort(plan.Refusals)
	return plan, nil
}

// Target names what a pool's plan moves its nodes to: its driver DaemonSets' config digests and its GPU allocation.
func Target(pool driverpools.Pool) string {
	h := sha256.New()
	for _, ds := range slices.SortedFunc(slices.Values(pool.DaemonSets), func(a, b driverpools.DaemonSet) int { return strings.Compare(a.Name, b.Name) }) {
		fmt.Fprintf(h, "%s=%s\n", ds.Name, ds.Digest)
	}
	fmt.Fprintf(h, "allocation=%s\n", pool.Allocation)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// kindNoun names a kind of pool's operand in messages.
var kindNoun = map[string]string{KindDriver: "driver", KindVGPUManager: "vGPU manager"}

// poolNoun names a kind's pools in messages: "pool" alone for the driver's, as before vGPU manager pools were planned.
func poolNoun(kind string) string {
	if kind == KindVGPUManager {
		return "vGPU manager pool"
	}
	return "pool"
}

const (
	osIDLabel      = "feature.node.kubernetes.io/system-os_release.ID"
	osVersionLabel = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	kernelLabel    = "feature.node.kubernetes.io/kernel-version.full"
)

// AllocationSwitch is "<from> -> <to>" when the node switches between the device plugin and DRA: its
// nvidia.com/gpu.allocation label against mode, the allocation of the pool it will be in; else "" (also when
// either is unknown).
func AllocationSwitch(node *corev1.Node, mode string) string {
	if cur := node.Labels[nodestate.AllocationLabel]; cur != "" && mode != "" && cur != mode {
		return cur + " -> " + mode
	}
	return ""
}

// PodDigest is the DRIVER_CONFIG_DIGEST a driver pod carries: the config of the driver it loaded.
func PodDigest(pod *corev1.Pod) string {
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.Name == DigestEnv {
				return e.Value
			}
		}
	}
	return ""
}

func unavailable(n *corev1.Node) bool {
	if n.Spec.Unschedulable && !nodestate.CordonedByUs(n) {
		return true
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status != corev1.ConditionTrue
		}
	}
	return true
}

// Run computes the plan, prints it, and — when nothing makes it unsafe — marks the planned nodes upgrade-required.
func Run(ctx context.Context, o Options, out io.Writer) (*Plan, error) {
	plan, err := Compute(ctx, o)
	if err != nil {
		return nil, err
	}
	plan.Write(out)
	if len(plan.Refusals) > 0 {
		return plan, fmt.Errorf("%w: %s", ErrUnsafe, strings.Join(plan.Refusals, "; "))
	}
	if err := syncHolds(ctx, o, out); err != nil {
		return plan, err
	}
	if err := keepReverts(ctx, o, plan, out); err != nil {
		return plan, err
	}
	now := o.Now().UTC().Format(time.RFC3339)
	var marked []*corev1.Node // as they were before their mark
	kept := 0                 // planned nodes that already carry their mark
	for _, np := range plan.Nodes {
		reason := fmt.Sprintf("pool %s driver config %s -> %s", np.Pool, nodestate.ShortDigest(np.From), nodestate.ShortDigest(np.To))
		if np.Kind == KindVGPUManager {
			reason = fmt.Sprintf("vGPU manager pool %s config %s -> %s", np.Pool, nodestate.ShortDigest(np.From), nodestate.ShortDigest(np.To))
		}
		if np.Allocation != "" {
			reason += ", GPU allocation " + np.Allocation
		}
		var before *corev1.Node
		mark, hasMark := plan.Marks[np.Pool]
		hasMark = hasMark && np.Kind != KindVGPUManager // marks are the driver pools' (planCanary)
		if _, err := nodestate.Update(ctx, o.Client, np.Node, func(n *corev1.Node) (nodestate.Patch, error) {
			before = n.DeepCopy()
			state := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
			underWay := state != "" && state != nodestate.UpgradeRequired && state != nodestate.UpgradeDone && state != nodestate.UpgradeFailed
			if hasMark && n.Annotations[canary.MarkAnnotation] == mark.Format() && (underWay || state == nodestate.UpgradeRequired) {
				kept++
				return nodestate.Patch{}, nil // planned as it is (a re-sync of the running plan): nothing to write
			}
			p := nodestate.SetUpgradeState(n, nodestate.UpgradeRequired, reason, now)
			if underWay {
				p = nodestate.Patch{} // its change is under way: it keeps its state, and takes the new plan's mark
			}
			if state == nodestate.UpgradeDone && n.Annotations[nodestate.ValidatedDigestAnnotation] == "" && n.Annotations[nodestate.DriverDigestAnnotation] == np.From {
				// upgrade-done with the driver its pod runs: that driver validated (a node done before the record)
				p = nodestate.Merge(p, nodestate.SetValidated(n, np.From))
			}
			// a reverted node planned for another driver than the one that failed on it goes back to its driver
			// DaemonSet, to change from there
			p = nodestate.Merge(p, nodestate.EndRevert(n))
			// one patch with the state: a mark read together with a later state was written before it (canary.Mark)
			if p.Annotations == nil {
				p.Annotations = map[string]*string{}
			}
			if hasMark {
				v := mark.Format()
				p.Annotations[canary.MarkAnnotation] = &v
			} else if _, ok := n.Annotations[canary.MarkAnnotation]; ok {
				p.Annotations[canary.MarkAnnotation] = nil // an earlier plan's mark says nothing about this one
			}
			return p, nil
		}); apierrors.IsNotFound(err) {
			// deleted since the plan read it (to be registered again): its next driver pod takes the pool's plan
			// from its DaemonSet's other nodes
			fmt.Fprintf(out, "pre-upgrade: node %s is gone since the plan read it: not marked\n", np.Node)
			continue
		} else if err != nil {
			return plan, unmark(ctx, o.Client, marked, err)
		}
		marked = append(marked, before)
	}
	for _, name := range plan.Forgive {
		if _, err := nodestate.Update(ctx, o.Client, name, func(n *corev1.Node) (nodestate.Patch, error) {
			return nodestate.ForgetRevert(n), nil
		}); err != nil && !apierrors.IsNotFound(err) {
			return plan, err
		}
		fmt.Fprintf(out, "pre-upgrade: node %s reverted to the driver its pool now goes back to: no longer counted as failed\n", name)
	}
	for _, name := range plan.CalledOff {
		// from a fresh read: a node the rollout moved on meanwhile keeps the state it reached
		if _, err := nodestate.Update(ctx, o.Client, name, func(n *corev1.Node) (nodestate.Patch, error) {
			if n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
				return nodestate.Patch{}, nil
			}
			return nodestate.Merge(nodestate.SetUpgradeState(n, nodestate.UpgradeDone, "", now), nodestate.SetValidated(n, n.Annotations[nodestate.DriverDigestAnnotation])), nil
		}); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return plan, err
		}
		fmt.Fprintf(out, "pre-upgrade: node %s was upgrade-required but its driver pod already has this release's driver config: upgrade-done\n", name)
	}
	if err := deleteLeftOver(ctx, o, plan.LeftOver, "pre-upgrade", out); err != nil {
		return plan, err
	}
	fmt.Fprintf(out, "pre-upgrade: %d GPU nodes marked upgrade-required\n", len(plan.Nodes)-kept)
	if kept > 0 {
		fmt.Fprintf(out, "pre-upgrade: %d GPU nodes already planned so, left as they are\n", kept)
	}
	return plan, nil
}

// syncHolds makes the skip label follow the pools' upgradePolicy.hold: each listed node gets it (recorded as the
// release's, nodestate.Seed; a node already labelled keeps its label, and it stays the admin's), and a node the
// release labelled that no list names any more loses it (nodestate.Unseed). Nodes first, so that no driver pod of a
// listed node sees this plan's DaemonSets without its hold. A failed write takes back the labels written.
func syncHolds(ctx context.Context, o Options, out io.Writer) error {
	listed := holdList(o.Pools, o.VGPUPools)
	nodes, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.NodeList, error) {
		return o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var held []string
	for i := range nodes.Items {
		n := &nodes.Items[i]
		seed := listed[n.Name]
		if _, recorded, err := nodestate.SeedOf(n, nodestate.UpgradeSkipLabel); !seed && (err != nil || !recorded) {
			continue // neither listed nor ever labelled by the release (a malformed record is the cleanup's to report)
		}
		changed := false
		if _, err := nodestate.Update(ctx, o.Client, n.Name, func(n *corev1.Node) (nodestate.Patch, error) {
			var p nodestate.Patch
			var err error
			if seed {
				p, err = nodestate.Seed(n, nodestate.UpgradeSkipLabel, "true")
			} else {
				p, err = nodestate.Unseed(n, nodestate.UpgradeSkipLabel)
			}
			changed = len(p.Labels) > 0
			return p, err
		}); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			undoHolds(ctx, o.Client, held)
			return fmt.Errorf("hold node %s (%s): %w", n.Name, HeldByValues, err)
		}
		switch {
		case seed && changed:
			held = append(held, n.Name)
			fmt.Fprintf(out, "pre-upgrade: node %s held (%s): labelled %s=true\n", n.Name, HeldByValues, nodestate.UpgradeSkipLabel)
		case !seed && changed:
			fmt.Fprintf(out, "pre-upgrade: node %s no longer held (%s): its %s label removed\n", n.Name, HeldByValues, nodestate.UpgradeSkipLabel)
		}
	}
	return nil
}

// undoHolds takes back the skip labels syncHolds wrote before it failed.
func undoHolds(ctx context.Context, client kubernetes.Interface, names []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, name := range names {
		_, _ = nodestate.Update(ctx, client, name, func(n *corev1.Node) (nodestate.Patch, error) {
			return nodestate.Unseed(n, nodestate.UpgradeSkipLabel)
		})
	}
}

// unmark takes back the marks of a plan that failed half way: Helm applies nothing after a failed pre-upgrade hook,
// so a node left upgrade-required would wait for a driver change that never comes. Each node gets back the state,
// reason and since it had before; the error names what was taken back, or what could not be.
func unmark(ctx context.Context, client kubernetes.Interface, marked []*corev1.Node, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var back, left []string
	for _, n := range marked {
		p := nodestate.Patch{Labels: map[string]*string{}, Annotations: map[string]*string{}}
		p.Labels[nodestate.UpgradeStateLabel] = previous(n.Labels, nodestate.UpgradeStateLabel)
		for _, k := range []string{nodestate.UpgradeReasonAnnotation, nodestate.UpgradeSinceAnnotation, canary.MarkAnnotation} {
			p.Annotations[k] = previous(n.Annotations, k)
		}
		if _, err := nodestate.Apply(ctx, client, n.Name, p); err != nil {
			left = append(left, fmt.Sprintf("%s (%v)", n.Name, err))
			continue
		}
		back = append(back, n.Name)
	}
	switch {
	case len(left) > 0:
		return fmt.Errorf("mark nodes upgrade-required: %w; marks taken back on %v, left on %s", cause, back, strings.Join(left, ", "))
	case len(back) > 0:
		return fmt.Errorf("mark nodes upgrade-required: %w; marks taken back on %s", cause, strings.Join(back, ", "))
	}
	return fmt.Errorf("mark nodes upgrade-required: %w", cause)
}

// previous is m[k] as a merge patch value: nil (delete) when absent.
func previous(m map[string]string, k string) *string {
	if v, ok := m[k]; ok {
		return &v
	}
	return nil
}

// Write prints the plan: per driver DaemonSet, its batches in order.
func (p *Plan) Write(out io.Writer) {
	if len(p.Nodes) == 0 {
		fmt.Fprintln(out, "pre-upgrade: no GPU node's driver changes; nothing to do")
	}
	for _, name := range p.LeftOver {
		fmt.Fprintf(out, "DaemonSet %s is no pool's of this release (an upgrade that failed left it): it is deleted, its pods stop through their gates\n", name)
	}
	for _, pool := range slices.Sorted(maps.Keys(p.Resumed)) {
		fmt.Fprintf(out, "pool %s resumes its plan %s: this release moves it to the same drivers, so its canary (%s) and the "+
			"nodes' turns stand\n", pool, p.Resumed[pool], strings.Join(slices.Sorted(maps.Keys(p.Marks[pool].Canary)), ", "))
	}
	for _, pool := range slices.Sorted(maps.Keys(p.Canary)) {
		if _, ok := p.Resumed[pool]; ok {
			continue
		}
		names := make([]string, len(p.Canary[pool]))
		for j, np := range p.Canary[pool] {
			names[j] = np.Node + " (" + np.DaemonSet + ")"
		}
		fmt.Fprintf(out, "pool %s canary: %s; changes alone and must validate before any other node of the pool starts\n", pool, strings.Join(names, ", "))
	}
	for _, pool := range slices.Sorted(maps.Keys(p.Marks)) {
		// a pool none of whose nodes changes has no threshold to hold at: the line would read as its state
		planned := slices.ContainsFunc(p.Nodes, func(np NodePlan) bool { return np.Pool == pool })
		if k := p.Marks[pool].MaxFailures; k > 0 && planned {
			fmt.Fprintf(out, "pool %s holds after %d failed node(s): no other node of it starts until `kube-gpu-stack upgrade retry NODE`\n", pool, k)
		}
	}
	for _, ds := range slices.Sorted(maps.Keys(p.Batches)) {
		for i, b := range p.Batches[ds] {
			names := make([]string, len(b))
			for j, np := range b {
				names[j] = np.Node
			}
			fmt.Fprintf(out, "%s (%s %s) batch %d: %s\n", ds, poolNoun(b[0].Kind), b[0].Pool, i+1, strings.Join(names, ", "))
		}
	}
	for _, np := range p.Held {
		if np.HeldBy == HeldByRevert {
			fmt.Fprintf(out, "node %s (%s %s) held: driver config %s already failed validation there and the node went back to %s; "+
				"`kube-gpu-stack upgrade retry %s` tries it again\n", np.Node, poolNoun(np.Kind), np.Pool, nodestate.ShortDigest(np.To), nodestate.ShortDigest(np.From), np.Node)
			continue
		}
		if np.HeldBy == HeldByValues {
			fmt.Fprintf(out, "node %s (%s %s) held: %s lists it, so it keeps its driver (config %s) in service; take it off the list to let it change to %s\n",
				np.Node, poolNoun(np.Kind), np.Pool, HeldByValues, nodestate.ShortDigest(np.From), nodestate.ShortDigest(np.To))
			continue
		}
		fmt.Fprintf(out, "node %s (%s %s) held: %s=true keeps its driver (config %s) in service; remove the label to let it change to %s\n",
			np.Node, poolNoun(np.Kind), np.Pool, nodestate.UpgradeSkipLabel, nodestate.ShortDigest(np.From), nodestate.ShortDigest(np.To))
	}
	for _, np := range p.Nodes {
		if np.Allocation == "" {
			continue
		}
		moves := "no GPU pod to move"
		if len(np.Moves) > 0 {
			moves = "GPU pods to move first: " + strings.Join(np.Moves, ", ")
		}
		fmt.Fprintf(out, "node %s switches GPU allocation %s (pool %s); %s\n", np.Node, np.Allocation, np.Pool, moves)
	}
	for _, r := range p.Refusals {
		fmt.Fprintln(out, "unsafe:", r)
	}
}
