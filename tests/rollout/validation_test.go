package rollout

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestDriverThatNeverValidatesStopsTheRollout installs the chart on the ten GPU nodes with a short
// driver.upgradePolicy.validationTimeoutSeconds and upgradePolicy.revert off (revert_test.go proves the revert), then
// upgrades to a driver that installs but never validates:
//
//  1. the rollout stops at exactly maxUnavailable nodes, upgrade-failed with the gate's timeout as their reason,
//     still cordoned by the upgrade, their driver pods un-Ready (the restarted upgrade gate holds them); no other
//     node is cordoned, evicted or given the new driver; the post-upgrade gate fails at once naming the failed
//     nodes;
//  2. once the driver is fixed, `upgrade retry` of the failed nodes lets the rollout go on: every node ends
//     upgrade-done with the new driver, uncordoned, never more than maxUnavailable in flight; the gate then passes.
func TestDriverThatNeverValidatesStopsTheRollout(t *testing.T) {
	const (
		brokenTag         = "600.20.01"
		validationTimeout = 15 // seconds: short, yet about twice what a good driver takes to validate on a loaded 2-core machine
		fault             = "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
	)
	ctx := t.Context()
	client := kube.Client
	hosts := freshNodes(t, 0) // an admin's cordon from an earlier test lifted: here every cordon must be the upgrade's
	// a PodDisruptionBudget left by an earlier test would make the plan refuse
	if err := client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(ctx, "train-"+pdbNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	before, err := cluster.SnapshotNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	set := func(extra ...string) []string {
		return settings(append([]string{fmt.Sprintf("driver.upgradePolicy.validationTimeoutSeconds=%d", validationTimeout),
			"driver.upgradePolicy.revert=false"}, extra...)...)
	}
	if _, err := target().Install(ctx, profile(), set()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	oldDigest := recordedDigests(t, hosts)[rollouttest.GPUNodeNames(nodes)[0]]
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if st := rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) {
			t.Fatalf("after install node %s is %q, want upgrade-done", n, st)
		}
	}

	// 1. the broken driver
	stand.SetDriverFault(brokenTag, fault)
	t.Cleanup(func() { stand.SetDriverFault(brokenTag, "") })
	rec := recordNodes(t)
	start := time.Now()
	tg := target()
	tg.NoWait = true
	_, upErr := tg.Upgrade(ctx, profile(), set("driver.image.tag="+brokenTag)...)
	var failed []string
	rollouttest.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d nodes upgrade-failed by their upgrade gate's timeout", maxUnavailable), func() (bool, string) {
		failed = nodesIn(t, nodestate.UpgradeFailed)
		if len(failed) < maxUnavailable {
			return false, fmt.Sprintf("upgrade-failed: %v", failed)
		}
		for _, n := range failed {
			if !gateTimedOut(n, start) {
				return false, "the upgrade gate on " + n + " has not ended yet"
			}
		}
		return true, ""
	})
	time.Sleep(3 * time.Second) // the gates restarted; a Ready driver pod would have let the DaemonSet controller go on by now
	failed = nodesIn(t, nodestate.UpgradeFailed)
	t.Logf("rollout stopped at %v after %s", failed, time.Since(start).Round(100*time.Millisecond))

	t.Run("the rollout stops at maxUnavailable failed nodes, cordoned, driver pods un-Ready", func(t *testing.T) {
		if len(failed) != maxUnavailable {
			t.Fatalf("upgrade-failed nodes %v, want exactly %d", failed, maxUnavailable)
		}
		ready := driverPodsReady(t)
		for _, n := range failed {
			node := rollouttest.Node(t, kube.Client, n)
			if reason := node.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(reason, fmt.Sprintf("within %ds", validationTimeout)) {
				t.Errorf("node %s: reason %q does not name the validation timeout", n, reason)
			}
			if !node.Spec.Unschedulable || !nodestate.CordonedByUs(node) {
				t.Errorf("node %s: unschedulable=%v cordoned-by-us=%v, want cordoned by the upgrade", n, node.Spec.Unschedulable, nodestate.CordonedByUs(node))
			}
			if p, ok := ready[n]; !ok || p.ready || !strings.Contains(p.image, ":"+brokenTag) {
				t.Errorf("node %s: driver pod %+v, want the new driver's pod un-Ready", n, p)
			}
		}
	})

	t.Run("no other node touched", func(t *testing.T) {
		ready := driverPodsReady(t)
		digests := recordedDigests(t, hosts)
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if slices.Contains(failed, n) {
				continue
			}
			node := rollouttest.Node(t, kube.Client, n)
			if st := node.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeRequired) {
				t.Errorf("node %s is %q, want still upgrade-required (marked by the plan, not started)", n, st)
			}
			if got := rec.states(n); slices.ContainsFunc(got, func(s nodestate.UpgradeState) bool {
				return s != nodestate.UpgradeDone && s != nodestate.UpgradeRequired
			}) {
				t.Errorf("node %s went through %v", n, got)
			}
			if node.Spec.Unschedulable || digests[n] != oldDigest {
				t.Errorf("node %s: unschedulable=%v driver config %s, want schedulable with the old %s", n, node.Spec.Unschedulable, digests[n], oldDigest)
			}
			if p := ready[n]; !p.ready || strings.Contains(p.image, ":"+brokenTag) {
				t.Errorf("node %s: driver pod %+v, want the old driver's pod Ready", n, p)
			}
		}
		if rec.maxInFlight > maxUnavailable || rec.maxCordoned > maxUnavailable {
			t.Errorf("%d nodes in flight and %d cordoned at once, want at most %d: %s", rec.maxInFlight, rec.maxCordoned, maxUnavailable, rec.worst)
		}
	})

	t.Run("the post-upgrade gate fails at once naming the failed nodes", func(t *testing.T) {
		if upErr == nil {
			t.Fatal("helm upgrade succeeded with a driver that never validates")
		}
		gate := lastRun(t, "validation-gate", start)
		named := 0
		for _, n := range failed {
			if strings.Contains(gate.Output, n+" driver failed: driver upgrade failed: no operator-validator pod on the node became Ready within") &&
				strings.Contains(gate.Output, "upgrade retry "+n) {
				named++
			}
		}
		if gate.ExitCode == 0 || named == 0 {
			t.Errorf("gate (exit %d) names no failed node %v with its reason:\n%s", gate.ExitCode, failed, gate.Output)
		}
		// the gate ends with the first failed node; the rollout's other nodes would only wait out its deadline
		if took := gate.Ended.Sub(gate.Started); took > time.Minute {
			t.Errorf("the gate took %s to fail", took)
		}
		t.Logf("gate failed after %s:\n%s", gate.Ended.Sub(gate.Started).Round(100*time.Millisecond), gate.Output)
		// the live status names every failed node
		out := kubeGPUStack(t, "status", "--live")
		for _, n := range failed {
			if !strings.Contains(out, n+" driver failed: driver upgrade failed") {
				t.Errorf("status --live does not name %s:\n%s", n, out)
			}
		}
	})

	// 2. fixed, retried: the rollout goes on to every node
	stand.SetDriverFault(brokenTag, "")
	retried := time.Now()
	for _, n := range failed {
		kubeGPUStack(t, "upgrade", "retry", n)
	}
	rollouttest.WaitFor(t, 3*time.Minute, "every node upgrade-done with the new driver pod Ready", func() (bool, string) {
		return rolledOut(t, rollouttest.GPUNodeNames(nodes))
	})
	rec.stop()
	t.Logf("after the fix and retry every node upgrade-done in %s", time.Since(retried).Round(100*time.Millisecond))
	for _, n := range failed {
		if !gateHeld(n, start) {
			t.Errorf("no restarted upgrade gate on %s held its driver pod while the node was upgrade-failed", n)
		}
	}

	t.Run("fixed and retried, every node converges", func(t *testing.T) {
		digests := recordedDigests(t, hosts)
		newDigest := digests[failed[0]]
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			node := rollouttest.Node(t, kube.Client, n)
			if node.Spec.Unschedulable || nodestate.CordonedByUs(node) {
				t.Errorf("node %s still cordoned", n)
			}
			assertNothingPaused(t, node)
			if digests[n] != newDigest || newDigest == oldDigest {
				t.Errorf("node %s runs driver config %s, want the new %s", n, digests[n], newDigest)
			}
		}
		if rec.maxInFlight > maxUnavailable || rec.maxCordoned > maxUnavailable {
			t.Errorf("%d nodes in flight and %d cordoned at once, want at most %d: %s", rec.maxInFlight, rec.maxCordoned, maxUnavailable, rec.worst)
		}
		out := kubeGPUStack(t, "check", "--timeout", "60s")
		if !strings.Contains(out, ": passed") {
			t.Errorf("the check does not pass once every node is upgrade-done:\n%s", out)
		}
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

// nodesIn returns the GPU nodes in state, sorted.
func nodesIn(t *testing.T, state nodestate.UpgradeState) []string {
	t.Helper()
	var out []string
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel] == string(state) {
			out = append(out, n)
		}
	}
	return out
}

// gateTimedOut reports whether an upgrade gate on node, started since, ended with its validation timeout (the
// stand-in then restarts it, as the kubelet restarts a sidecar).
func gateTimedOut(node string, since time.Time) bool {
	for _, r := range stand.Runs() {
		if r.Component == kubelet.UncordonRun && r.Node == node && r.Started.After(since) && r.ExitCode != 0 &&
			strings.Contains(r.Output, "became Ready within") {
			return true
		}
	}
	return false
}

// gateHeld reports whether a restarted upgrade gate on node held its driver pod un-Ready while the node was
// upgrade-failed (its run is recorded when it ends: when `upgrade retry` deleted the pod).
func gateHeld(node string, since time.Time) bool {
	for _, r := range stand.Runs() {
		if r.Component == kubelet.UncordonRun && r.Node == node && r.Started.After(since) && strings.Contains(r.Output, "holding this driver pod un-Ready") {
			return true
		}
	}
	return false
}

type driverPod struct {
	image string
	ready bool
}

// driverPodsReady returns each node's live driver pod: its driver image and whether it is Ready.
func driverPodsReady(t *testing.T) map[string]driverPod {
	t.Helper()
	pods, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]driverPod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		d := driverPod{image: p.Spec.Containers[0].Image}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				d.ready = c.Status == corev1.ConditionTrue
			}
		}
		out[p.Spec.NodeName] = d
	}
	return out
}

// kubeGPUStack runs the kube-gpu-stack CLI against the release and returns its output; an error exit is returned
// as output too (check and status exit non-zero when the stack is not working).
func kubeGPUStack(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := stackcli.NewCommand(&out)
	cmd.SetArgs(append(args, "--kubeconfig", kube.Kubeconfig, "-n", namespace, "--release", release))
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		fmt.Fprintln(&out, "error:", err)
		if args[0] == "upgrade" {
			t.Fatalf("kube-gpu-stack %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	return out.String()
}

// freshNodes gives every GPU node a fresh fixture host, whose driver installs take install, and lifts a cordon an
// earlier test left (here every cordon must be the test's own); with install set, the hosts install at once again
// after the test. It returns the hosts by node.
func freshNodes(t *testing.T, install time.Duration) map[string]*kmodtest.Fixture {
	t.Helper()
	hosts := map[string]*kmodtest.Fixture{}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		hosts[n] = kmodtest.New(t)
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: hosts[n], Install: install})
		if rollouttest.Node(t, kube.Client, n).Spec.Unschedulable {
			uncordon(t, n)
		}
	}
	if install != 0 {
		t.Cleanup(func() {
			for _, n := range rollouttest.GPUNodeNames(nodes) {
				stand.SetDriverHost(n, kubelet.DriverHost{Fixture: kmodtest.New(t)})
			}
		})
	}
	return hosts
}

func uncordon(t *testing.T, name string) {
	t.Helper()
	patch := []byte(`{"spec":{"unschedulable":false}}`)
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
