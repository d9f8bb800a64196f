// Package canary makes a driver pool's change go canary first, then widen, and hold at its failure threshold.
//
// The pre-upgrade plan marks every node whose driver will change (MarkAnnotation: its pool, the plan, the pool's
// canary nodes, its failure threshold and its slots), and the old driver pod's upgrade gate of a node that is not a
// canary waits, before it cordons, until every canary of its plan is upgrade-done; any node of a pool holds while
// that pool has MaxFailures nodes upgrade-failed. A waiting node is untouched: not cordoned, nothing evicted, its
// old driver pod in service (the driver DaemonSets are OnDelete: nothing else replaces it).
package canary

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// MarkAnnotation holds a planned node's Mark as JSON. Only the pre-upgrade plan writes it (a later plan replaces
// it); `upgrade retry` keeps it, so a retried canary is still the canary; the pre-delete cleanup removes it with
// every stack annotation (nodestate.Cleanup).
const MarkAnnotation = nodestate.AnnotationPrefix + "upgrade-plan"

// Mark is what the plan tells each node whose driver will change.
type Mark struct {
	// Pool is the node's driver pool.
	Pool string `json:"pool"`
	// Plan names the plan that wrote the mark (its time, RFC 3339 with nanoseconds). A canary counts as validated
	// only when its own mark names the same plan or a later one (NotBefore): the plan writes mark and upgrade-required in
	// one patch, so upgrade-done read together with this plan's mark was written after it, never left from an
	// earlier change.
	Plan string `json:"plan"`
	// Seq orders plans by what the cluster shows, not by the clock of the pod that ran them: each plan's is one more
	// than the highest on any node when it ran. 0: a mark written before plans had one, earlier than any that has.
	Seq int64 `json:"seq,omitempty"`
	// Target names what the plan moves the pool to (its driver DaemonSets' config digests and its GPU allocation).
	// A plan for the target the pool's running plan has (a re-sync that changes no driver) keeps that plan.
	Target string `json:"target,omitempty"`
	// Canary are the pool's canary nodes, each with the DRIVER_CONFIG_DIGEST it will get (none: the pool has no
	// canary, only its threshold).
	Canary map[string]string `json:"canary"`
	// MaxFailures is the pool's failure threshold: with that many of its nodes upgrade-failed, no other node of
	// the pool starts. 0: no threshold.
	MaxFailures int `json:"maxFailures"`
	// MaxUnavailable is the pool's maxUnavailable as a number of its planned pool's nodes: the driver managers take
	// one of that many slots (package slots) before they cordon, so that no more of the pool's nodes are out at once,
	// whatever replaces their driver pods. 0 (a mark from before it): the DaemonSet's bound alone.
	MaxUnavailable int `json:"maxUnavailable,omitempty"`
	// Slots names the pool's slots (package slots) by its node selection, not its name, so that the bound holds
	// across a pool renamed mid-rollout: the nodes out under the old name hold slots of the same Lease. Empty (a mark
	// from before it, or of a pool no plan named): the slots are named after Pool.
	Slots string `json:"slots,omitempty"`
}

// SlotsName is what names the pool's slots Lease (package slots): Slots, or Pool for a mark without it.
func (m Mark) SlotsName() string {
	if m.Slots != "" {
		return m.Slots
	}
	return m.Pool
}

// Format renders the mark for MarkAnnotation.
func (m Mark) Format() string {
	b, _ := json.Marshal(m) // strings, a map of strings and an int always marshal
	return string(b)
}

// Read returns node's mark: nil without one (the node was not in a plan: added to the pool after it, or its
// driver changes without the pre-upgrade hook), an error when it cannot be read.
func Read(node *corev1.Node) (*Mark, error) {
	raw, ok := node.Annotations[MarkAnnotation]
	if !ok {
		return nil, nil
	}
	var m Mark
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("node %s: annotation %s=%q is not the plan's mark: %w", node.Name, MarkAnnotation, raw, err)
	}
	if m.Pool == "" || m.Plan == "" || m.MaxFailures < 0 || m.MaxUnavailable < 0 {
		return nil, fmt.Errorf("node %s: annotation %s=%q is not the plan's mark: want a pool, a plan, and maxFailures and maxUnavailable of 0 or more",
			node.Name, MarkAnnotation, raw)
	}
	return &m, nil
}

// IsCanary says whether node is one of the mark's canary nodes.
func (m *Mark) IsCanary(node string) bool {
	_, ok := m.Canary[node]
	return ok
}

// Turn is whether a node may start its driver change now, and if not, why.
type Turn struct {
	Go bool
	// Waiting names what the node waits for (the reason its upgrade state shows meanwhile).
	Waiting string
	// Pending are the canary nodes not yet validated.
	Pending []string
}

// Decide is a node's turn under its mark, from the nodes as read (any set holding at least the pool's canary
// nodes and its failed nodes; others are ignored). The threshold comes first: a pool at it holds, canary or not.
func Decide(self string, m *Mark, nodes []*corev1.Node) Turn {
	byName := map[string]*corev1.Node{}
	var failed []string
	for _, n := range nodes {
		byName[n.Name] = n
		// a node whose change was reverted (nodestate.Reverted) failed too: back on its old driver and in service,
		// but the pool's new driver did not validate there
		failedHere := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) == nodestate.UpgradeFailed || nodestate.Reverted(n)
		if n.Name == self || !failedHere || n.Labels[nodestate.UpgradeSkipLabel] == "true" {
			continue
		}
		// a failed node counts for the pool its own mark names; an unreadable mark counts as this pool's, so
		// damage never lifts a hold
		if pm, err := Read(n); err != nil || (pm != nil && pm.Pool == m.Pool) {
			failed = append(failed, n.Name)
		}
	}
	slices.Sort(failed)
	if m.MaxFailures > 0 && len(failed) >= m.MaxFailures {
		return Turn{Waiting: fmt.Sprintf("pool %s holds: %d of its nodes failed their driver change (%s), its threshold is %d; "+
			"`kube-gpu-stack upgrade retry NODE` retries one, labelling it %s=true leaves it out",
			m.Pool, len(failed), strings.Join(failed, ", "), m.MaxFailures, nodestate.UpgradeSkipLabel)}
	}
	if m.IsCanary(self) {
		return Turn{Go: true}
	}
	var pending []string
	for _, name := range sortedKeys(m.Canary) {
		if !validated(byName[name], m) {
			pending = append(pending, name)
		}
	}
	if len(pending) > 0 {
		return Turn{Pending: pending, Waiting: fmt.Sprintf("waiting for the canary of pool %s to validate its new driver: %s",
			m.Pool, strings.Join(pending, ", "))}
	}
	return Turn{Go: true}
}

// validated: the canary is upgrade-done under this plan or a later one (see Mark.Plan: a later plan that
// re-marked the canary, as a second upgrade mid-rollout does, supersedes this one for it), or the admin left it out
// of driver changes (nodestate.UpgradeSkipLabel) since. A canary done under an earlier plan is a state read from
// before this plan.
//
// A canary whose Node object was deleted and registered again lost its mark; it vouches for the plan once it is
// upgrade-done (its validator Ready since: the gate marks nothing else done) with the driver the plan gives it
// recorded on it, or the pool would wait for it for good.
func validated(n *corev1.Node, m *Mark) bool {
	if n == nil || nodestate.Reverted(n) {
		return false // a reverted canary is upgrade-done with its old driver: it vouches for nothing
	}
	done := n.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeDone)
	cm, err := Read(n)
	if err == nil && cm == nil {
		want := m.Canary[n.Name]
		return done && want != "" && n.Annotations[nodestate.DriverDigestAnnotation] == want
	}
	if err != nil || !NotBefore(cm, m) {
		return false
	}
	return done || n.Labels[nodestate.UpgradeSkipLabel] == "true"
}

// NotBefore says whether plan a is plan b or a later one: by Seq, which the cluster orders (a mark without one is
// earlier than any with one), and between two marks without one by their time; an unreadable time is neither.
func NotBefore(a, b *Mark) bool {
	if a.Seq > 0 || b.Seq > 0 {
		return a.Seq >= b.Seq
	}
	ta, errA := time.Parse(time.RFC3339Nano, a.Plan)
	tb, errB := time.Parse(time.RFC3339Nano, b.Plan)
	return errA == nil && errB == nil && !ta.Before(tb)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
