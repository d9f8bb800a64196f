package canary

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

var mark = &Mark{Pool: "a100", Plan: "2026-09-01T12:00:00.5Z", Canary: map[string]string{"c": "d2"}, MaxFailures: 1}

func node(name string, state nodestate.UpgradeState, m string, labels ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{nodestate.UpgradeStateLabel: string(state)},
		Annotations: map[string]string{}}}
	if m != "" {
		n.Annotations[MarkAnnotation] = m
	}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

// digest records on n the driver config its driver manager kept or handed it to.
func digest(n *corev1.Node, d string) *corev1.Node {
	n.Annotations[nodestate.DriverDigestAnnotation] = d
	return n
}

// reverted puts n under a revert DaemonSet, its record kept.
func reverted(n *corev1.Node) *corev1.Node {
	n.Labels[nodestate.RevertLabel] = "111111111111"
	n.Annotations[nodestate.RevertedAnnotation] = `{"from":"d2","to":"d1","daemonSet":"x-revert-d1","reason":"no validator","at":"2026-09-01T12:10:00Z"}`
	return n
}

func TestDecide(t *testing.T) {
	this := mark.Format()
	earlier := Mark{Pool: "a100", Plan: "2026-09-01T11:00:00Z", Canary: map[string]string{"c": "d1"}, MaxFailures: 1}.Format()
	later := Mark{Pool: "a100", Plan: "2026-09-01T12:05:00Z", Canary: map[string]string{"c": "d3"}, MaxFailures: 1}.Format()
	other := Mark{Pool: "h100", Plan: "2026-09-01T12:00:00.5Z", MaxFailures: 1}.Format()
	for _, tc := range []struct {
		name  string
		self  string
		nodes []*corev1.Node
		goes  bool
		why   string
	}{
		{"canary goes", "c", []*corev1.Node{node("c", nodestate.UpgradeRequired, this)}, true, ""},
		{"canary in flight", "n", []*corev1.Node{node("c", nodestate.PodRestartRequired, this)}, false, "waiting for the canary of pool a100"},
		{"canary gone from the cluster", "n", nil, false, "waiting for the canary"},
		{"canary validated", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this)}, true, ""},
		{"canary done under an earlier plan (a stale read)", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, earlier)}, false, "waiting for the canary"},
		{"canary done under a later plan that re-marked it (a second upgrade)", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, later)}, true, ""},
		{"canary in flight under a later plan", "n", []*corev1.Node{node("c", nodestate.CordonRequired, later)}, false, "waiting for the canary"},
		{"canary done, its mark unreadable", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, "{")}, false, "waiting for the canary"},
		// a canary whose Node was deleted and registered again lost its mark: it vouches once done with the plan's driver
		{"canary registered again, done with the plan's driver", "n", []*corev1.Node{digest(node("c", nodestate.UpgradeDone, ""), "d2")}, true, ""},
		{"canary registered again, done with another driver", "n", []*corev1.Node{digest(node("c", nodestate.UpgradeDone, ""), "d1")}, false, "waiting for the canary"},
		{"canary registered again, revalidating", "n", []*corev1.Node{digest(node("c", nodestate.ValidationRequired, ""), "d2")}, false, "waiting for the canary"},
		{"canary left out by the admin", "n", []*corev1.Node{node("c", nodestate.UpgradeRequired, this, nodestate.UpgradeSkipLabel, "true")}, true, ""},
		{"threshold holds the canary too", "c", []*corev1.Node{node("c", nodestate.UpgradeRequired, this), node("f", nodestate.UpgradeFailed, this)}, false, "pool a100 holds: 1 of its nodes failed"},
		{"a failed node of another pool does not count", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), node("f", nodestate.UpgradeFailed, other)}, true, ""},
		// a reverted node (back on its old driver, upgrade-done, in service) failed the pool's new driver all the same
		{"a reverted canary holds the pool", "n", []*corev1.Node{reverted(node("c", nodestate.UpgradeDone, this))}, false, "pool a100 holds: 1 of its nodes failed their driver change (c)"},
		{"a reverted node of the pool counts as failed", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), reverted(node("f", nodestate.UpgradeDone, this))}, false, "holds"},
		{"a reverted node of another pool does not count", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), reverted(node("f", nodestate.UpgradeDone, other))}, true, ""},
		{"a node kept on a revert DaemonSet, its record dropped (its pool went back), is no failure", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), node("f", nodestate.UpgradeDone, this, nodestate.RevertLabel, "111111111111")}, true, ""},
		{"a failed node with an unreadable mark counts", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), node("f", nodestate.UpgradeFailed, "{")}, false, "holds"},
		{"a failed node left out (skip) does not count", "n", []*corev1.Node{node("c", nodestate.UpgradeDone, this), node("f", nodestate.UpgradeFailed, this, nodestate.UpgradeSkipLabel, "true")}, true, ""},
	} {
		turn := Decide(tc.self, mark, tc.nodes)
		if turn.Go != tc.goes || !strings.Contains(turn.Waiting, tc.why) {
			t.Errorf("%s: %+v, want go=%v and %q", tc.name, turn, tc.goes, tc.why)
		}
	}
	noThreshold := &Mark{Pool: "a100", Plan: "2026-09-01T12:00:00.5Z", Canary: map[string]string{"c": "d2"}}
	if turn := Decide("c", noThreshold, []*corev1.Node{node("f", nodestate.UpgradeFailed, this), node("g", nodestate.UpgradeFailed, this)}); !turn.Go {
		t.Errorf("maxFailures 0 holds: %+v", turn)
	}
	// without a threshold, a reverted canary still never vouches: the pool halts at it
	if turn := Decide("n", noThreshold, []*corev1.Node{reverted(node("c", nodestate.UpgradeDone, this))}); turn.Go || !strings.Contains(turn.Waiting, "waiting for the canary") {
		t.Errorf("maxFailures 0, reverted canary: %+v, want the pool waiting for its canary", turn)
	}
}

func TestRead(t *testing.T) {
	if m, err := Read(node("n", "", "")); m != nil || err != nil {
		t.Errorf("no mark: %v, %v", m, err)
	}
	for _, raw := range []string{"{", `{"pool":"a"}`, `{"pool":"a","plan":"p","maxFailures":-1}`, `[]`} {
		if _, err := Read(node("n", "", raw)); err == nil || !strings.Contains(err.Error(), MarkAnnotation) {
			t.Errorf("%s: err %v", raw, err)
		}
	}
	if m, err := Read(node("n", "", mark.Format())); err != nil || m.Plan != "2026-09-01T12:00:00.5Z" || !m.IsCanary("c") || m.IsCanary("n") {
		t.Errorf("round trip: %+v, %v", m, err)
	}
}

// Plans are ordered by Seq, whatever their times say (the clocks of the pods that ran them may disagree); a mark
// from before Seq is earlier than any that has one.
func TestPlansAreOrderedBySeq(t *testing.T) {
	waiter := &Mark{Pool: "a100", Plan: "2026-09-01T12:00:00Z", Seq: 3, Canary: map[string]string{"c": "d2"}}
	for _, tc := range []struct {
		name   string
		canary Mark
		goes   bool
	}{
		{"same seq, earlier clock", Mark{Pool: "a100", Plan: "2026-09-01T11:00:00Z", Seq: 3}, true},
		{"later seq", Mark{Pool: "a100", Plan: "2026-09-01T11:00:00Z", Seq: 4}, true},
		{"earlier seq, later clock", Mark{Pool: "a100", Plan: "2026-09-01T13:00:00Z", Seq: 2}, false},
		{"no seq, later clock", Mark{Pool: "a100", Plan: "2026-09-01T13:00:00Z"}, false},
	} {
		turn := Decide("n", waiter, []*corev1.Node{node("c", nodestate.UpgradeDone, tc.canary.Format())})
		if turn.Go != tc.goes {
			t.Errorf("%s: go %v (%s), want %v", tc.name, turn.Go, turn.Waiting, tc.goes)
		}
	}
	if !NotBefore(&Mark{Plan: "x", Seq: 1}, &Mark{Plan: "2026-09-01T13:00:00Z"}) || NotBefore(&Mark{Plan: "x"}, &Mark{Plan: "2026-09-01T13:00:00Z"}) {
		t.Error("a mark with a Seq is later than one without; an unreadable time without a Seq is never")
	}
}
