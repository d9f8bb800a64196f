package rollout

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestCanaryThenWidenAndTheFailureThreshold installs the chart on the ten GPU nodes of one pool with a canary of
// one, maxFailures 1 and maxUnavailable 3 (upgradePolicy.revert off: a failed node stays upgrade-failed; revert_test.go
// proves the revert), then:
//
//  1. upgrades to a driver that never validates: the plan names gpu-01 the canary; it changes alone and fails, and
//     the pool stops at that one node: no other node is ever cordoned or leaves upgrade-required, their old drivers
//     stay loaded, and those whose new driver pod the DaemonSet already started wait un-Ready, saying why;
//  2. fixes the driver, makes one waiting node's driver busy (a stray process) and retries the canary: the canary
//     goes first (its upgrade-done comes before any other node's cordon, by etcd revision), then the pool widens;
//     the busy node fails, and at that threshold the rest of the pool holds, untouched;
//  3. the admin frees that node and retries it: every node ends upgrade-done with the new driver;
//
// never more than maxUnavailable nodes out (in flight, cordoned or failed) at once; uninstall leaves every node as
// before.
func TestCanaryThenWidenAndTheFailureThreshold(t *testing.T) {
	const (
		brokenTag         = "600.30.01"
		validationTimeout = 15 // seconds: short, yet about twice what a good driver takes to validate on a loaded 2-core machine
		canaryMax         = 3  // the pool's maxUnavailable here
		fault             = "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
		strayPID          = 31337
	)
	ctx := t.Context()
	client := kube.Client
	hosts := freshNodes(t, 0) // an admin's cordon from an earlier test lifted: here every cordon must be the upgrade's
	if err := client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(ctx, "train-"+pdbNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	before, err := cluster.SnapshotNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	set := func(extra ...string) []string {
		return settings(append([]string{fmt.Sprintf("driver.upgradePolicy.validationTimeoutSeconds=%d", validationTimeout),
			"driver.upgradePolicy.canary=1", "driver.upgradePolicy.maxFailures=1", fmt.Sprintf("driver.upgradePolicy.maxUnavailable=%d", canaryMax),
			"driver.upgradePolicy.revert=false"}, extra...)...)
	}
	if _, err := target().Install(ctx, profile(), set()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	names := rollouttest.GPUNodeNames(nodes)
	slices.Sort(names)
	canaryNode := names[0]
	oldDigest := recordedDigests(t, hosts)[canaryNode]

	// 1. the canary's driver never validates
	stand.SetDriverFault(brokenTag, fault)
	t.Cleanup(func() { stand.SetDriverFault(brokenTag, "") })
	rec := recordNodes(t)
	revs := recordRevisions(t)
	start := time.Now()
	tg := target()
	tg.NoWait = true
	_, _ = tg.Upgrade(ctx, profile(), set("driver.image.tag="+brokenTag)...)
	rollouttest.WaitFor(t, 2*time.Minute, "the canary upgrade-failed by its gate's timeout", func() (bool, string) {
		failed := nodesIn(t, nodestate.UpgradeFailed)
		return slices.Contains(failed, canaryNode) && gateTimedOut(canaryNode, start), fmt.Sprintf("upgrade-failed: %v", failed)
	})
	time.Sleep(3 * time.Second) // a node that would wrongly go on has had the time to cordon
	var waiting []string
	t.Run("a failing canary stops the pool at one node", func(t *testing.T) {
		plan := lastRun(t, "pre-upgrade", start)
		if want := "pool default canary: " + canaryNode + " (" + driverDaemonSet + ")"; !strings.Contains(plan.Output, want) {
			t.Errorf("the plan does not name the canary (%q):\n%s", want, plan.Output)
		}
		if failed := nodesIn(t, nodestate.UpgradeFailed); len(failed) != 1 {
			t.Errorf("upgrade-failed nodes %v, want only the canary %s", failed, canaryNode)
		}
		ready := driverPodsReady(t)
		digests := recordedDigests(t, hosts)
		for _, n := range names[1:] {
			node := rollouttest.Node(t, kube.Client, n)
			if got := rec.states(n); slices.ContainsFunc(got, func(s nodestate.UpgradeState) bool {
				return s != nodestate.UpgradeDone && s != nodestate.UpgradeRequired
			}) {
				t.Errorf("node %s went through %v, want only upgrade-required", n, got)
			}
			if node.Spec.Unschedulable || digests[n] != oldDigest || len(hosts[n].LoadedModules()) == 0 {
				t.Errorf("node %s: unschedulable=%v driver config %s modules %v, want untouched with the old driver", n, node.Spec.Unschedulable, digests[n], hosts[n].LoadedModules())
			}
			// the old driver pod waits, in service: its upgrade gate holds the node's change (the DaemonSet is
			// OnDelete, and nothing else replaces it)
			if p := ready[n]; strings.Contains(p.image, ":"+brokenTag) || !p.ready {
				t.Errorf("node %s: driver pod %s (Ready %v) while the pool holds, want its old pod serving", n, p.image, p.ready)
			}
			if reason := node.Annotations[nodestate.UpgradeReasonAnnotation]; strings.Contains(reason, "pool default holds") {
				waiting = append(waiting, n)
			} else {
				t.Errorf("node %s waits with reason %q, want the pool's hold", n, reason)
			}
		}
		if len(waiting) == 0 {
			t.Error("no node waits for its turn: the wait was not exercised")
		}
		t.Logf("after %s: canary %s failed, waiting %v", time.Since(start).Round(100*time.Millisecond), canaryNode, waiting)
	})
	if t.Failed() || len(waiting) == 0 {
		logRuns(t, start)
		t.FailNow()
	}

	// 2. fixed; one waiting node's driver busy; the canary retried
	busy := waiting[0]
	hosts[busy].Use("nvidia", 1)
	hosts[busy].OpenDevice(strayPID, "stray-cuda-app", "/dev/nvidia0")
	// the busy node goes first after the canary: which waiting node takes a free slot first is a race between their
	// gates, so the others are held back (the skip label) until it failed, then let go, to meet the threshold
	for _, n := range waiting[1:] {
		labelSkip(t, n, "true")
	}
	stand.SetDriverFault(brokenTag, "")
	retried := time.Now()
	kubeGPUStack(t, "upgrade", "retry", canaryNode)
	rollouttest.WaitFor(t, 3*time.Minute, busy+" upgrade-failed (busy driver)", func() (bool, string) {
		st := rollouttest.Node(t, kube.Client, busy).Labels[nodestate.UpgradeStateLabel]
		return st == string(nodestate.UpgradeFailed), busy + " is " + st
	})
	for _, n := range waiting[1:] {
		labelSkip(t, n, "")
	}
	rollouttest.WaitFor(t, 3*time.Minute, busy+" upgrade-failed (busy driver) and the rollout settled", func() (bool, string) {
		if st := rollouttest.Node(t, kube.Client, busy).Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeFailed) {
			return false, busy + " is " + st
		}
		for _, n := range names {
			if st := nodestate.UpgradeState(rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]); st != nodestate.UpgradeDone &&
				st != nodestate.UpgradeRequired && st != nodestate.UpgradeFailed {
				return false, n + " is " + string(st)
			}
		}
		return true, ""
	})
	time.Sleep(3 * time.Second)
	t.Run("the canary goes first, then the pool widens, and at the threshold it holds", func(t *testing.T) {
		canaryDone := revs.first(canaryNode, nodestate.UpgradeDone, retried)
		if canaryDone == 0 {
			t.Fatalf("the retried canary never reached upgrade-done")
		}
		failedAt := revs.first(busy, nodestate.UpgradeFailed, retried)
		ready := driverPodsReady(t)
		var held, holding []string // holding: held by the threshold itself, their old driver pod serving
		for _, n := range names[1:] {
			if c := revs.first(n, nodestate.CordonRequired, retried); c != 0 && c < canaryDone {
				t.Errorf("node %s cordon-required at revision %d, before the canary's upgrade-done at %d", n, c, canaryDone)
			}
			node := rollouttest.Node(t, kube.Client, n)
			if node.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeRequired) {
				if node.Spec.Unschedulable || len(hosts[n].LoadedModules()) == 0 {
					t.Errorf("held node %s: unschedulable=%v modules %v, want untouched", n, node.Spec.Unschedulable, hosts[n].LoadedModules())
				}
				held = append(held, n)
				if p := ready[n]; !strings.Contains(p.image, ":"+brokenTag) && p.ready &&
					strings.Contains(node.Annotations[nodestate.UpgradeReasonAnnotation], "pool default holds: 1 of its nodes failed their driver change ("+busy+")") {
					holding = append(holding, n)
				}
			}
		}
		// every node not yet changed waits at the threshold, its old driver pod in service
		if len(holding) == 0 {
			t.Errorf("no node's new driver pod waits at the threshold after %s failed (revision %d); held %v", busy, failedAt, held)
		}
		time.Sleep(2 * time.Second)
		for _, n := range held {
			if st := rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeRequired) {
				t.Errorf("held node %s moved on to %s while the pool is at its threshold", n, st)
			}
		}
		t.Logf("canary done at revision %d, %s failed at %d; held %v, of which waiting at the threshold %v", canaryDone, busy, failedAt, held, holding)
	})

	// 3. the admin frees the busy node and retries it: the pool finishes
	hosts[busy].Use("nvidia", -1)
	if err := os.RemoveAll(filepath.Join(hosts[busy].Root, "proc", strconv.Itoa(strayPID))); err != nil {
		t.Fatal(err)
	}
	kubeGPUStack(t, "upgrade", "retry", busy)
	rollouttest.WaitFor(t, 3*time.Minute, "every node upgrade-done with the new driver pod Ready", func() (bool, string) {
		return rolledOut(t, names)
	})
	rec.stop()
	revs.stop()
	t.Run("never more than maxUnavailable out, and every node on the new driver", func(t *testing.T) {
		if rec.maxInFlight > canaryMax || rec.maxCordoned > canaryMax || revs.maxOut > canaryMax {
			t.Errorf("%d in flight, %d cordoned, %d out counting failed at once, want at most %d: %s / %s",
				rec.maxInFlight, rec.maxCordoned, revs.maxOut, canaryMax, rec.worst, revs.worst)
		}
		digests := recordedDigests(t, hosts)
		for _, n := range names {
			if digests[n] == oldDigest || digests[n] != digests[canaryNode] {
				t.Errorf("node %s runs driver config %s, want the new %s", n, digests[n], digests[canaryNode])
			}
			if node := rollouttest.Node(t, kube.Client, n); node.Spec.Unschedulable {
				t.Errorf("node %s still cordoned", n)
			}
		}
	})

	// 4. helm rollback to the install's revision: going back to the old driver is a driver change like any other,
	// planned (pre-rollback: canary, slots) and gated (post-rollback)
	rec, revs = recordNodes(t), recordRevisions(t)
	rolledBack := time.Now()
	rbErr := target().Rollback(1)
	rollouttest.WaitFor(t, 3*time.Minute, "every node back on the old driver, upgrade-done", func() (bool, string) {
		if ok, why := rolledOut(t, names); !ok {
			return false, why
		}
		for n, d := range recordedDigests(t, hosts) {
			if d != oldDigest {
				return false, n + " runs driver config " + d
			}
		}
		return true, ""
	})
	rec.stop()
	revs.stop()
	t.Run("helm rollback is planned and gated like an upgrade", func(t *testing.T) {
		if rbErr != nil {
			t.Errorf("helm rollback: %v", rbErr)
		}
		plan, ok := stand.LastRun("pre-upgrade", rolledBack)
		if !ok || plan.ExitCode != 0 || !strings.Contains(plan.Output, "pool default canary: "+canaryNode) ||
			!strings.Contains(plan.Output, fmt.Sprintf("pre-upgrade: %d GPU nodes marked upgrade-required", len(names))) {
			t.Errorf("no plan ran before the rollback (exit %d):\n%s", plan.ExitCode, plan.Output)
		}
		if gate, ok := stand.LastRun("validation-gate", rolledBack); !ok || gate.ExitCode != 0 {
			t.Errorf("no passing gate after the rollback (exit %d):\n%s", gate.ExitCode, gate.Output)
		}
		canaryDone := revs.first(canaryNode, nodestate.UpgradeDone, rolledBack)
		for _, n := range names[1:] {
			if c := revs.first(n, nodestate.CordonRequired, rolledBack); c == 0 || c < canaryDone {
				t.Errorf("node %s cordon-required at revision %d, the canary's upgrade-done at %d: want after it", n, c, canaryDone)
			}
		}
		if rec.maxCordoned > canaryMax || revs.maxOut > canaryMax {
			t.Errorf("%d cordoned, %d out at once during the rollback, want at most %d: %s / %s", rec.maxCordoned, revs.maxOut, canaryMax, rec.worst, revs.worst)
		}
	})
	t.Run("every old driver stopped on an emptied node, rollback included", func(t *testing.T) {
		assertDriversStoppedOnEmptiedNodes(t, start)
	})

	if err := target().Uninstall(); err != nil {
		t.Fatal(err)
	}
	after, err := cluster.SnapshotNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	if changes := cluster.NodeChanges(before, after); changes != "" {
		t.Errorf("uninstall left nodes changed:\n%s", changes)
	}
	if t.Failed() {
		logRuns(t, start)
	}
}

// revisions records, per node, the etcd revision (resourceVersion) of each upgrade state it entered, and the most
// nodes out of service at once counting failed ones (in flight or upgrade-failed).
type revisions struct {
	mu     sync.Mutex
	seen   map[string][]stateAt
	out    map[string]bool
	maxOut int
	worst  string
	cancel context.CancelFunc
	done   chan struct{}
}

type stateAt struct {
	state nodestate.UpgradeState
	rev   int64
	at    time.Time
}

func recordRevisions(t *testing.T) *revisions {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r := &revisions{seen: map[string][]stateAt{}, out: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	w, err := kube.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(r.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted {
				r.observe(n)
			}
		}
	}()
	return r
}

func (r *revisions) observe(n *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	rev, _ := strconv.ParseInt(n.ResourceVersion, 10, 64)
	if s := r.seen[n.Name]; len(s) == 0 || s[len(s)-1].state != st {
		r.seen[n.Name] = append(s, stateAt{st, rev, time.Now()})
	}
	switch st {
	case nodestate.UpgradeDone, nodestate.UpgradeRequired, "":
		delete(r.out, n.Name)
	default:
		r.out[n.Name] = true
	}
	if len(r.out) > r.maxOut {
		r.maxOut, r.worst = len(r.out), fmt.Sprintf("out: %v", slices.Sorted(maps.Keys(r.out)))
	}
}

// first is the revision at which node first entered state after since (0: never).
func (r *revisions) first(node string, state nodestate.UpgradeState, since time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.seen[node] {
		if s.state == state && s.at.After(since) {
			return s.rev
		}
	}
	return 0
}

func (r *revisions) stop() {
	r.cancel()
	<-r.done
}

// labelSkip sets nvidia.com/gpu-driver-upgrade.skip on node to value ("" removes it).
func labelSkip(t *testing.T, node, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = strconv.Quote(value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, nodestate.UpgradeSkipLabel, v)
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
