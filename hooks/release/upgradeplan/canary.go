package upgradeplan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// planCanary picks each driver pool's canary and the mark its planned nodes get, with the pool's slots (poolMax),
// and returns the canary nodes. A pool whose running plan (the newest mark on its nodes, marks) has this plan's
// target keeps that plan: a re-sync that changes no driver neither names a new canary nor starts the wait over,
// unless a canary it named has not started and can no longer be one. Otherwise the plan is new, named after its
// time, ordered after every plan on the nodes (Mark.Seq), and its canary is the pool's first upgradePolicy.canary
// planned nodes that can be one (unfit); a pool with none refuses. vGPU manager pools get neither: their
// DaemonSets' updateStrategy alone paces them, and their driver manager may not evict.
func planCanary(plan *Plan, pools map[string]driverpools.Pool, poolMax map[string]int, now time.Time, marks nodeMarks, unfit map[string]string) map[string]bool {
	in := map[string]bool{}
	id := now.UTC().Format(time.RFC3339Nano)
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		pool := pools[name]
		if pool.AutoUpgrade != nil && !*pool.AutoUpgrade {
			continue
		}
		var planned []NodePlan
		for _, np := range plan.Nodes {
			if np.Pool == name && np.Kind == KindDriver {
				planned = append(planned, np)
			}
		}
		target := Target(pool)
		if running := marks.running[name]; running != nil && running.Target == target && canariesStand(running, planned, unfit) {
			mark := *running // its slots too: the nodes out hold them (a running plan from before Mark.Slots keeps the pool's name)
			mark.MaxFailures, mark.MaxUnavailable = pool.FailureThreshold(), poolMax[name]
			for _, np := range planned {
				if mark.IsCanary(np.Node) {
					plan.Canary[name] = append(plan.Canary[name], np)
					in[np.Node] = true
				}
			}
			plan.Marks[name], plan.Resumed[name] = mark, running.Plan
			continue
		}
		mark := canary.Mark{Pool: name, Plan: id, Seq: marks.maxSeq + 1, Target: target, Canary: map[string]string{},
			MaxFailures: pool.FailureThreshold(), MaxUnavailable: poolMax[name], Slots: pool.SlotsKey()}
		var why []string
		for _, np := range planned {
			if len(plan.Canary[name]) >= pool.CanaryNodes() {
				break
			}
			if reason := unfit[np.Node]; reason != "" {
				why = append(why, np.Node+" ("+reason+")")
				continue
			}
			plan.Canary[name] = append(plan.Canary[name], np)
			mark.Canary[np.Node] = np.To
			in[np.Node] = true
		}
		if pool.CanaryNodes() > 0 && len(planned) > 0 && len(mark.Canary) == 0 {
			plan.Refusals = append(plan.Refusals, fmt.Sprintf("no node of pool %s can be its canary (a Ready, schedulable node "+
				"whose current driver validated): %s; bring one back, or set its upgradePolicy.canary: 0 for this upgrade",
				name, strings.Join(why, ", ")))
		}
		if len(mark.Canary) > 0 || mark.MaxFailures > 0 || mark.MaxUnavailable > 0 {
			plan.Marks[name] = mark
		}
	}
	return in
}

// canariesStand: every canary of the running plan that is still to change (planned and not started) can still be
// one; a canary that went down before it started would hold its pool for good.
func canariesStand(running *canary.Mark, planned []NodePlan, unfit map[string]string) bool {
	for _, np := range planned {
		if running.IsCanary(np.Node) && unfit[np.Node] != "" && unfit[np.Node] != inFlight {
			return false
		}
	}
	return true
}

// inFlight is canaryUnfit's reason for a node whose driver change has started.
const inFlight = "its driver change is under way"

// canaryUnfit says why a planned node cannot be its pool's canary, "" when it can: the canary must show the new
// driver works, so it is a Ready, schedulable node whose current driver validated (driverPod Ready: the upgrade
// gate's startup probe passes only once the driver validated) and no change is under way on it.
func canaryUnfit(node *corev1.Node, driverPod *corev1.Pod) string {
	switch state := nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel]); {
	case state != "" && state != nodestate.UpgradeDone && state != nodestate.UpgradeRequired:
		return inFlight
	case nodestate.CordonedByUs(node):
		return inFlight
	case !nodeReady(node):
		return "NotReady"
	case node.Spec.Unschedulable:
		return "cordoned"
	case !podReady(driverPod):
		return "driver pod not Ready: its driver has not validated"
	}
	return ""
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeMarks is what the plans before this one left on the nodes.
type nodeMarks struct {
	// maxSeq is the highest Mark.Seq on any node: this plan's is one more.
	maxSeq int64
	// running is each pool's newest readable mark (canary.NotBefore).
	running map[string]*canary.Mark
}

func readMarks(nodes map[string]*corev1.Node) nodeMarks {
	out := nodeMarks{running: map[string]*canary.Mark{}}
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		m, err := canary.Read(nodes[name])
		if err != nil || m == nil {
			continue // an unreadable mark is the driver manager's to refuse on its node
		}
		out.maxSeq = max(out.maxSeq, m.Seq)
		if cur := out.running[m.Pool]; cur == nil || (canary.NotBefore(m, cur) && !canary.NotBefore(cur, m)) {
			out.running[m.Pool] = m
		}
	}
	return out
}
