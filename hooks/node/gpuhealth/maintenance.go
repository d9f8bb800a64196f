package gpuhealth

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// reporter writes a verdict on the Node.
type reporter interface {
	Report(ctx context.Context, v Verdict) error
}

// Maintenance is the verdict while a planned change is under way on the node: Unknown, so that a remediation
// controller does not take the GPUs' errors of a driver reload or a MIG reconfiguration for faults.
func Maintenance(why string) Verdict {
	return Verdict{Status: corev1.ConditionUnknown, Reason: nodestate.MaintenanceReason, Message: nodestate.MaintenanceMessage(why)}
}

// maintenanceGate stands between the agent's verdicts and its Node. While the Node says a planned change is under
// way (nodestate.UnderMaintenance) it reports Maintenance instead of the verdicts, and once the change is over it
// reports the latest verdict again: a fault found after the change still gets to the Node.
type maintenanceGate struct {
	rep  Reporter
	logf func(string, ...any)

	mu      sync.Mutex
	verdict *Verdict // the monitor's latest, nil before its first
	why     string   // the change under way, "" when none
}

// Report takes the monitor's verdict and writes what the Node should say now.
func (g *maintenanceGate) Report(ctx context.Context, v Verdict) error {
	g.mu.Lock()
	g.verdict = &v
	now, ok := g.current()
	g.mu.Unlock()
	if !ok {
		return nil
	}
	return g.rep.Report(ctx, now)
}

// current is what the Node should say (false: nothing yet); call with mu held.
func (g *maintenanceGate) current() (Verdict, bool) {
	if g.why != "" {
		return Maintenance(g.why), true
	}
	if g.verdict == nil {
		return Verdict{}, false
	}
	return *g.verdict, true
}

// node takes the Node as the watch has it and writes what it should say when its condition says otherwise: a change
// into or out of maintenance at once, and a condition someone else left (a driver manager stopped between its
// Maintenance mark and its cordon, a failed change's DriverUpgradeFailed) once the agent has a verdict of its own.
func (g *maintenanceGate) node(ctx context.Context, n *corev1.Node) error {
	why, _ := nodestate.UnderMaintenance(n)
	g.mu.Lock()
	changed := why != g.why
	g.why = why
	now, ok := g.current()
	g.mu.Unlock()
	cur, _ := nodecondition.Find(n, g.rep.Policy.ConditionType)
	if !ok || (cur.Status == now.Status && cur.Reason == now.Reason && cur.Message == now.Message) {
		return nil
	}
	switch {
	case changed && why != "":
		g.logf("node %s: %s: reporting %s until it is over", g.rep.NodeName, why, nodestate.MaintenanceReason)
	case changed:
		g.logf("node %s: planned change over: %s", g.rep.NodeName, now)
	default:
		g.logf("node %s: condition %s says %s %s, not %s: writing it again", g.rep.NodeName, g.rep.Policy.ConditionType, cur.Status, cur.Reason, now)
	}
	return g.rep.Report(ctx, now)
}

// watchNode follows the agent's Node until ctx ends. It returns once the first read is in (the gate knows whether
// a change is under way before the first verdict), then runs on in the background; a write that fails there is
// logged and written again at the next change.
func (g *maintenanceGate) watchNode(ctx context.Context, o *Options) error {
	store, err := kwatch.Start(ctx, kwatch.Node(o.Client, o.NodeName), &corev1.Node{})
	if err != nil {
		return fmt.Errorf("watch node %s for planned changes: %w", o.NodeName, err)
	}
	apply := func() {
		if n, ok := store.Get("", o.NodeName); ok {
			if err := g.node(ctx, n); err != nil {
				g.logf("node %s: %v", o.NodeName, err)
			}
		}
	}
	apply()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-store.Changed():
				apply()
			}
		}
	}()
	return nil
}
