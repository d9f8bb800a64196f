package soak

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// invariants watches every Node for a seed's whole run and records each moment an invariant breaks:
//   - a pool has more nodes out of service by the stack (cordoned by it, or upgrade-failed) than its bound. A node
//     counts in the pool its label puts it in now, unless it is out under a slot of another pool only: a node
//     moved to another pool while out stays out under the slot its old pool gave it (and counts there) until it
//     is back in service;
//   - a node is schedulable while its new driver has not validated (pod-restart-required, validation-required);
//   - a node failed its driver change, other than one whose driver the soak made fail (a failure elsewhere is the
//     routine operations' doing). A node whose driver fails goes back to its old one by itself (reverted, not failed);
//     it fails only where it cannot (its Node registered again, say, it lost the record of what validated there).
type invariants struct {
	e  *soakEnv
	mu sync.Mutex
	// out are the nodes out of service, each with the pool its label puts it in
	out map[string]string
	// holders are each slots Lease's holders; leasePool the pool (its soak name) whose plan marks name each Lease
	holders   map[string]map[string]bool
	leasePool map[string]string
	broken    []string
	// last is each invariant's last breach (by pool or node), so that a breach lasting many events is told once
	last map[string]string
	// paused are, per node, the etcd revisions over which its device plugin was paused: [from, to), to 0 while it is
	paused map[string][][2]int64
	checks int
	// seen is each node's last (state, cordon, plan) as history shows it; history each pool's changes of them, the
	// last historyLines, printed with the pool's first bound breach
	seen    map[string]string
	history map[string][]string
	told    map[string]bool
	// nodeHistory is each node's last changes (state, cordon, plan, reason), printed with its first breach
	nodeHistory map[string][]string
	// faulty are the nodes whose new driver the soak made fail: their failure is no breach
	faulty map[string]bool
	cancel context.CancelFunc
	done   chan struct{}
}

func watchInvariants(t *testing.T, e *soakEnv) *invariants {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	inv := &invariants{e: e, out: map[string]string{}, holders: map[string]map[string]bool{}, leasePool: map[string]string{}, last: map[string]string{}, paused: map[string][][2]int64{},
		seen: map[string]string{}, history: map[string][]string{}, told: map[string]bool{}, nodeHistory: map[string][]string{}, faulty: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		inv.observe(&list.Items[i])
	}
	w, err := kube.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	// the pools' slots Leases go into every pool's history: a bound breach then shows who held the slots
	lw, err := kube.Client.CoordinationV1().Leases(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: nodestate.DriverManagerLeaseLabel + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(inv.done)
		defer w.Stop()
		defer lw.Stop()
		nodes, leases := w.ResultChan(), lw.ResultChan()
		for nodes != nil || leases != nil {
			select {
			case ev, ok := <-nodes:
				if !ok {
					nodes = nil
				} else if n, isNode := ev.Object.(*corev1.Node); isNode && ev.Type != watch.Deleted {
					inv.observe(n)
				}
			case ev, ok := <-leases:
				if !ok {
					leases = nil
				} else if l, isLease := ev.Object.(*coordinationv1.Lease); isLease && strings.HasPrefix(l.Name, slots.Prefix) {
					inv.slots(l, ev.Type)
				}
			}
		}
	}()
	return inv
}

func (inv *invariants) observe(n *corev1.Node) {
	if _, gpu := inv.e.pool[n.Name]; !gpu {
		return
	}
	pool := n.Labels[nodefixtures.DriverPoolLabel]
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.checks++
	rv, _ := strconv.ParseInt(n.ResourceVersion, 10, 64)
	spans := inv.paused[n.Name]
	open := len(spans) > 0 && spans[len(spans)-1][1] == 0
	switch paused := n.Labels[nodestate.DeployLabelPrefix+"device-plugin"] == nodestate.Paused; {
	case paused && !open:
		inv.paused[n.Name] = append(spans, [2]int64{rv, 0})
	case !paused && open:
		spans[len(spans)-1][1] = rv
	}
	state := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	if m, err := canary.Read(n); err == nil && m != nil && m.Pool != "" {
		inv.leasePool[slots.Name(m.SlotsName())] = soakPool(m.Pool)
	}
	// a node registered again is cordoned until its driver validates, outside its pool's slots: its registration
	// took it out, not a driver change (the schedulable check below still holds it to validation)
	revalidating := n.Annotations[nodestate.CordonedAnnotation] == drivermanager.ReregisteredCordon
	if (nodestate.CordonedByUs(n) && !revalidating) || state == nodestate.UpgradeFailed {
		inv.out[n.Name] = pool
	} else {
		delete(inv.out, n.Name)
	}
	inv.record(pool, n, state)
	inv.checkBounds()
	unvalidated := ""
	if (state == nodestate.PodRestartRequired || state == nodestate.ValidationRequired) && !n.Spec.Unschedulable {
		unvalidated = fmt.Sprintf("node %s is schedulable in %s: its new driver has not validated", n.Name, state)
		if !inv.told[n.Name] {
			inv.told[n.Name] = true
			unvalidated += "; the node's changes before it:\n    " + strings.Join(inv.nodeHistory[n.Name], "\n    ")
		}
	}
	inv.breach("schedulable "+n.Name, unvalidated)
	failed := ""
	if state == nodestate.UpgradeFailed && !inv.faulty[n.Name] {
		failed = fmt.Sprintf("node %s failed its driver change: %s", n.Name, n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	inv.breach("failed "+n.Name, failed)
}

// soakPool is the label value (poolBounds' key) of the pool a plan names: "" for the default pool, b for b renamed.
func soakPool(planned string) string {
	switch planned {
	case "default":
		return ""
	case renamedB:
		return "b"
	}
	return planned
}

// checkBounds records a breach of each pool's bound by the nodes out now.
func (inv *invariants) checkBounds() {
	out := map[string][]string{}
	for node, pool := range inv.out {
		out[inv.countedIn(node, pool)] = append(out[inv.countedIn(node, pool)], node)
	}
	for _, pool := range slices.Sorted(maps.Keys(inv.e.bound)) {
		bound := ""
		if len(out[pool]) > inv.e.bound[pool] {
			slices.Sort(out[pool])
			bound = fmt.Sprintf("pool %q: %d nodes out (%s), its bound is %d", pool, len(out[pool]), strings.Join(out[pool], ", "), inv.e.bound[pool])
			if !inv.told[pool] {
				inv.told[pool] = true
				bound += "; the pool's changes before it:\n    " + strings.Join(inv.history[pool], "\n    ")
			}
		}
		inv.breach("pool "+pool, bound)
	}
}

// countedIn is the pool an out node counts in: the one its label names, unless it holds a slot of another pool's
// only.
func (inv *invariants) countedIn(node, labelled string) string {
	other, elsewhere := "", false // "" is the default pool's key: elsewhere says whether other names a pool
	for lease, holders := range inv.holders {
		if !holders[node] {
			continue
		}
		pool, known := inv.leasePool[lease]
		if !known || pool == labelled {
			return labelled
		}
		other, elsewhere = pool, true
	}
	if elsewhere {
		return other
	}
	return labelled
}

// historyLines is how many of a pool's last changes a bound breach shows.
const historyLines = 60

// record adds to the pool's history the node's change of state, cordon or plan mark, if any.
func (inv *invariants) record(pool string, n *corev1.Node, state nodestate.UpgradeState) {
	now := fmt.Sprintf("%-24s cordoned-by-us=%-5v unschedulable=%-5v plan %s", state, nodestate.CordonedByUs(n), n.Spec.Unschedulable, n.Annotations[canary.MarkAnnotation])
	if inv.seen[n.Name] == now {
		return
	}
	inv.seen[n.Name] = now
	h := append(inv.history[pool], time.Now().Format("15:04:05.000")+" "+n.Name+" "+now)
	inv.history[pool] = h[max(0, len(h)-historyLines):]
	line := fmt.Sprintf("%s rv %s %s unschedulable=%v cordon %q revert %q reason %q", time.Now().Format("15:04:05.000"), n.ResourceVersion, now,
		n.Spec.Unschedulable, n.Annotations[nodestate.CordonedAnnotation], n.Labels[nodestate.RevertLabel], n.Annotations[nodestate.UpgradeReasonAnnotation])
	nh := append(inv.nodeHistory[n.Name], line)
	inv.nodeHistory[n.Name] = nh[max(0, len(nh)-historyLines):]
}

// changesOf returns the node's last changes as record keeps them, one per line.
func (inv *invariants) changesOf(node string) string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return strings.Join(inv.nodeHistory[node], "\n    ")
}

// slots adds a slots Lease's holders to every pool's history.
func (inv *invariants) slots(l *coordinationv1.Lease, ev watch.EventType) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	line := fmt.Sprintf("%s %s %s holders %s", time.Now().Format("15:04:05.000"), l.Name, ev, l.Annotations[slots.HoldersAnnotation])
	for pool := range inv.e.bound {
		h := append(inv.history[pool], line)
		inv.history[pool] = h[max(0, len(h)-historyLines):]
	}
	holders, err := slots.Holders(l)
	if ev == watch.Deleted || err != nil {
		holders = nil
	}
	inv.holders[l.Name] = map[string]bool{}
	for node := range holders {
		inv.holders[l.Name][node] = true
	}
	inv.checkBounds()
}

// breach records what (a breach of the invariant on key, "" for none) when it differs from the last one recorded.
func (inv *invariants) breach(key, what string) {
	if what == inv.last[key] {
		return
	}
	inv.last[key] = what
	if what != "" {
		inv.broken = append(inv.broken, time.Now().Format("15:04:05.000")+" "+what)
	}
}

// whilePaused says whether revision rv (a pod's creation) fell while node's device plugin was paused: a real kubelet
// then admits no pod asking for a GPU (its device manager has no device to give; kwok runs such a pod anyway).
func (inv *invariants) whilePaused(node string, rv int64) bool {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	for _, s := range inv.paused[node] {
		if rv > s[0] && (s[1] == 0 || rv < s[1]) {
			return true
		}
	}
	return false
}

// pausedSpans says, for the failure message, at which revision each late pod of pods was created and over which
// revisions node's device plugin was paused.
func (inv *invariants) pausedSpans(node string, pods []string) string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var parts []string
	for _, p := range pods {
		if rv, late := lateRV.Load(p); late {
			parts = append(parts, fmt.Sprintf("%s created at rv %d", p, rv))
		}
	}
	return strings.Join(append(parts, fmt.Sprintf("device plugin paused over rv %v", inv.paused[node])), ", ")
}

// stop ends the watch, reports every broken invariant (at most 20 lines of them) and returns the checks made.
func (inv *invariants) stop(t *testing.T) int {
	t.Helper()
	inv.cancel()
	<-inv.done
	inv.mu.Lock()
	defer inv.mu.Unlock()
	for i, b := range inv.broken {
		if i == 20 {
			t.Errorf("... and %d more", len(inv.broken)-20)
			break
		}
		t.Errorf("invariant broken: %s", b)
	}
	return inv.checks
}

// expectFailure tells the checker that node's new driver will fail: its driver change failing there is no breach.
func (inv *invariants) expectFailure(node string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.faulty[node] = true
}
