package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestFailedCanaryGoesBackToItsLastValidatedDriver installs the chart on the ten GPU nodes of one pool with the
// defaults' canary of one and failure threshold of one (upgradePolicy.revert on, its default), then upgrades to a
// driver that installs but never validates:
//
//  1. the release fails, naming the canary and that it was reverted; the canary's gate, at its validation timeout,
//     labels the node for the revert DaemonSet the plan kept, and the node goes back by itself to the driver that
//     validated there before: that driver installs again and validates, and only then is the node uncordoned,
//     upgrade-done, back in service; `upgrade status` says it was reverted and why; no other node of the pool was
//     ever cordoned or left upgrade-required (the pool holds at the reverted canary);
//  2. the driver fixed, `upgrade retry` of the canary takes it back from the revert DaemonSet: the canary changes,
//     validates, the pool widens, and every node ends upgrade-done with the new driver, no node under a revert
//     DaemonSet;
//
// uninstall leaves every node as before, and no revert DaemonSet behind.
func TestFailedCanaryGoesBackToItsLastValidatedDriver(t *testing.T) {
	const (
		brokenTag         = "600.40.01"
		validationTimeout = 15 // seconds: short, yet about twice what a good driver takes to validate on a loaded 2-core machine
		fault             = "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
	)
	ctx := t.Context()
	client := kube.Client
	hosts := freshNodes(t, 0)
	before, err := cluster.SnapshotNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	set := func(extra ...string) []string {
		return settings(append([]string{fmt.Sprintf("driver.upgradePolicy.validationTimeoutSeconds=%d", validationTimeout),
			"driver.upgradePolicy.canary=1", "driver.upgradePolicy.maxFailures=1"}, extra...)...)
	}
	if _, err := target().Install(ctx, profile(), set()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	names := rollouttest.GPUNodeNames(nodes)
	slices.Sort(names)
	canaryNode := names[0]
	oldDigest := recordedDigests(t, hosts)[canaryNode]

	// 1. the canary's new driver never validates
	stand.SetDriverFault(brokenTag, fault)
	t.Cleanup(func() { stand.SetDriverFault(brokenTag, "") })
	rec := recordNodes(t)
	revs := recordRevisions(t)
	start := time.Now()
	released := make(chan error, 1)
	go func() {
		tg := target()
		tg.NoWait = true
		_, err := tg.Upgrade(ctx, profile(), set("driver.image.tag="+brokenTag)...)
		released <- err
	}()
	rollouttest.WaitFor(t, 3*time.Minute, "the canary back on its old driver, validated and in service", func() (bool, string) {
		n := rollouttest.Node(t, kube.Client, canaryNode)
		st := n.Labels[nodestate.UpgradeStateLabel]
		return nodestate.Reverted(n) && st == string(nodestate.UpgradeDone) && !n.Spec.Unschedulable,
			fmt.Sprintf("%s is %s, reverted %v, unschedulable %v", canaryNode, st, nodestate.Reverted(n), n.Spec.Unschedulable)
	})
	var releaseErr error
	select {
	case releaseErr = <-released:
	case <-time.After(2 * time.Minute):
		t.Fatal("the release did not end")
	}
	time.Sleep(3 * time.Second) // a node that would wrongly go on has had the time to cordon
	rec.stop()

	t.Run("the release fails, naming the reverted canary", func(t *testing.T) {
		if releaseErr == nil || !strings.Contains(releaseErr.Error(), "post-upgrade hooks failed") {
			t.Fatalf("release result: %v; want its post-upgrade gate failed", releaseErr)
		}
		gate := lastRun(t, "validation-gate", start)
		if !strings.Contains(gate.Output, canaryNode+" driver failed: driver upgrade failed and reverted: driver config") {
			t.Errorf("the gate's table does not say the canary was reverted:\n%s", gate.Output)
		}
	})

	t.Run("the canary validates its old driver before it is uncordoned", func(t *testing.T) {
		n := rollouttest.Node(t, kube.Client, canaryNode)
		r, err := nodestate.ReadRevert(n)
		if err != nil || r == nil || r.To != oldDigest || r.DaemonSet != revertset.Name(driverDaemonSet, oldDigest) {
			t.Fatalf("revert record %+v (%v), want back to %s by %s", r, err, nodestate.ShortDigest(oldDigest), revertset.Name(driverDaemonSet, oldDigest))
		}
		if got := recordedDigests(t, hosts)[canaryNode]; got != oldDigest || len(hosts[canaryNode].LoadedModules()) == 0 {
			t.Errorf("the canary's host runs config %s (modules %v), want the old driver %s loaded again", got, hosts[canaryNode].LoadedModules(), oldDigest)
		}
		// from its cordon for the new driver, the node went through the revert and a validation of the old driver
		// before upgrade-done lifted the cordon
		got := rec.states(canaryNode)
		want := []nodestate.UpgradeState{nodestate.PodRestartRequired, nodestate.ValidationRequired, nodestate.UncordonRequired, nodestate.UpgradeDone}
		if i := slices.Index(got, nodestate.PodRestartRequired); i < 0 || !slices.Equal(lastStates(got[i:], len(want)), want) {
			t.Errorf("canary states %v, want its revert to end %v", got, want)
		}
		if at := revs.first(canaryNode, nodestate.UpgradeDone, start); at == 0 {
			t.Errorf("the canary never reached upgrade-done after the revert")
		}
		revertedAt, err := time.Parse(time.RFC3339, r.At)
		if err != nil {
			t.Fatal(err)
		}
		validated := false
		for _, ready := range stand.ValidatorReadies(canaryNode) {
			validated = validated || !ready.Before(revertedAt)
		}
		if !validated {
			t.Errorf("no validator turned Ready on the canary since its revert (%s): it was uncordoned unvalidated", r.At)
		}
		ready := driverPodsReady(t)
		if p := ready[canaryNode]; strings.Contains(p.image, ":"+brokenTag) || !p.ready {
			t.Errorf("the canary's driver pod %+v, want the old driver's, Ready", p)
		}
		ds, err := client.AppsV1().DaemonSets(namespace).Get(ctx, revertset.Name(driverDaemonSet, oldDigest), metav1.GetOptions{})
		if err != nil || len(ds.OwnerReferences) != 1 || ds.OwnerReferences[0].Name != driverDaemonSet {
			t.Errorf("revert DaemonSet: %v, owners %v; want it owned by %s", err, ownersOf(ds), driverDaemonSet)
		}
		status := kubeGPUStack(t, "upgrade", "status")
		if !strings.Contains(status, "upgrade-done (reverted)") || !strings.Contains(status, "failed validation") {
			t.Errorf("upgrade status does not show the revert:\n%s", status)
		}
	})

	t.Run("the pool holds at the reverted canary", func(t *testing.T) {
		digests := recordedDigests(t, hosts)
		for _, n := range names[1:] {
			node := rollouttest.Node(t, kube.Client, n)
			if got := rec.states(n); slices.ContainsFunc(got, func(s nodestate.UpgradeState) bool {
				return s != nodestate.UpgradeDone && s != nodestate.UpgradeRequired
			}) {
				t.Errorf("node %s went through %v, want only upgrade-required", n, got)
			}
			if node.Spec.Unschedulable || digests[n] != oldDigest {
				t.Errorf("node %s: unschedulable=%v driver config %s, want untouched with the old driver", n, node.Spec.Unschedulable, digests[n])
			}
			if reason := node.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(reason, "pool default holds: 1 of its nodes failed their driver change ("+canaryNode+")") {
				t.Errorf("node %s waits with reason %q, want the pool's hold at the reverted canary", n, reason)
			}
		}
	})
	if t.Failed() {
		logRuns(t, start)
		t.FailNow()
	}

	// 2. fixed: the canary retried from its revert DaemonSet, then the pool
	stand.SetDriverFault(brokenTag, "")
	retried := time.Now()
	kubeGPUStack(t, "upgrade", "retry", canaryNode)
	rollouttest.WaitFor(t, 4*time.Minute, "every node upgrade-done with the new driver", func() (bool, string) {
		for _, n := range names {
			node := rollouttest.Node(t, kube.Client, n)
			if st := node.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) || node.Labels[nodestate.RevertLabel] != "" || node.Spec.Unschedulable {
				return false, fmt.Sprintf("%s is %s (revert label %q, unschedulable %v)", n, st, node.Labels[nodestate.RevertLabel], node.Spec.Unschedulable)
			}
		}
		ready := driverPodsReady(t)
		for _, n := range names {
			if p := ready[n]; !strings.Contains(p.image, ":"+brokenTag) || !p.ready {
				return false, fmt.Sprintf("%s driver pod %+v", n, p)
			}
		}
		return true, ""
	})
	revs.stop()
	t.Run("after the retry the canary goes first and every node runs the new driver", func(t *testing.T) {
		canaryDone := revs.first(canaryNode, nodestate.UpgradeDone, retried)
		for _, n := range names[1:] {
			if c := revs.first(n, nodestate.CordonRequired, retried); c == 0 || c < canaryDone {
				t.Errorf("node %s cordon-required at revision %d, the retried canary's upgrade-done at %d", n, c, canaryDone)
			}
		}
		digests := recordedDigests(t, hosts)
		for _, n := range names {
			if digests[n] == oldDigest {
				t.Errorf("node %s still runs the old driver config", n)
			}
		}
	})

	t.Run("every driver stopped on an emptied node, the failed one included", func(t *testing.T) {
		assertDriversStoppedOnEmptiedNodes(t, start)
	})

	if err := target().Uninstall(); err != nil {
		t.Fatal(err)
	}
	t.Run("uninstall leaves every node as before and no revert DaemonSet", func(t *testing.T) {
		rollouttest.WaitFor(t, time.Minute, "the release's DaemonSets gone", func() (bool, string) {
			dss, err := client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			var left []string
			for _, ds := range dss.Items {
				left = append(left, ds.Name)
			}
			return len(left) == 0, fmt.Sprintf("left: %v", left)
		})
		after, err := cluster.SnapshotNodes(ctx, client)
		if err != nil {
			t.Fatal(err)
		}
		if changes := cluster.NodeChanges(before, after); changes != "" {
			t.Errorf("uninstall left nodes changed:\n%s", changes)
		}
	})
	if t.Failed() {
		logRuns(t, start)
	}
}

// lastStates is the last n of states (all of them when fewer).
func lastStates(states []nodestate.UpgradeState, n int) []nodestate.UpgradeState {
	return states[max(0, len(states)-n):]
}

func ownersOf(ds *appsv1.DaemonSet) []string {
	if ds == nil {
		return nil
	}
	var out []string
	for _, o := range ds.OwnerReferences {
		out = append(out, o.Kind+"/"+o.Name)
	}
	return out
}
