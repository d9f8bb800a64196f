package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// scene is one scenario's share of the package's install: the nodes' fixture hosts and the driver tag its upgrade
// rolls out.
type scene struct {
	hosts map[string]*kmodtest.Fixture
	tag   string
	// helmCutOff: the helm client itself lost the API server during the upgrade, so its result is only reported.
	helmCutOff bool
	// started is when the scenario's (last) upgrade started.
	started time.Time
}

// TestFaults installs the chart once on nine simulated GPU nodes (fixture hosts, a GPU and a CPU workload on each)
// and then runs each scenario as a driver upgrade to a tag of its own, starting from every node upgrade-done and
// schedulable. During each a recorder checks the rollout's invariants on every node event; at the end every node
// must be upgrade-done, not cordoned by us (the admin's cordon kept), with nothing paused and no pause record, the
// admin's labels kept, the new driver loaded on its fixture host, and its GPU workload back.
func TestFaults(t *testing.T) {
	hosts := map[string]*kmodtest.Fixture{}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		hosts[n] = kmodtest.New(t)
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: hosts[n]})
	}
	startWorkloads(t)
	began := time.Now()
	if _, err := target().Install(t.Context(), profile(), settings("580.10.01")...); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed in %s", time.Since(began).Round(100*time.Millisecond))
	scenarios := []struct {
		name string
		run  func(*testing.T, *scene)
	}{
		{"SIGTERM after every step", sigtermEveryStep},
		{"second helm upgrade mid-rollout", secondUpgrade},
		{"node reboot mid-upgrade", reboot},
		{"PDB relaxed while the manager waits", pdbRelaxed},
		{"admin cordon, uncordon and gpu.deploy label mid-eviction", adminMidEviction},
		{"API faults through a proxy", apiFaults(false)},
		{"API faults through a proxy once the plan is done", apiFaults(true)},
		// last: a helm client cut off by the restart may leave the release pending, which no later upgrade passes
		{"API server and etcd restart mid-rollout", apiServerRestart},
	}
	for i, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			sc := &scene{hosts: hosts, tag: fmt.Sprintf("600.%02d.01", i+1)}
			sc.clean(t)
			start := time.Now()
			s.run(t, sc)
			t.Logf("scenario took %s", time.Since(start).Round(100*time.Millisecond))
		})
	}
}

// clean makes sure the scenario starts from a clean pool: a node a previous scenario left upgrade-failed is
// retried (as the admin would), then every node must be upgrade-done, schedulable, with its GPU workload running.
func (sc *scene) clean(t *testing.T) {
	t.Helper()
	for n, h := range sc.hosts {
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: h})
	}
	rollouttest.WaitFor(t, 2*time.Minute, "a clean pool before the scenario (after the previous one)", func() (bool, string) {
		for _, hook := range []string{"pre-upgrade", "validation-gate"} {
			if n := stand.InFlight(hook); n > 0 {
				return false, fmt.Sprintf("%d %s hooks of an earlier release still running", n, hook)
			}
		}
		if retried := retryFailed(t); len(retried) > 0 {
			t.Logf("retried %v, left upgrade-failed by the previous scenario", retried)
		}
		if ok, why, _, _ := rolledOut(t); !ok {
			return false, why
		}
		running := runningGPU(t)
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if node := rollouttest.Node(t, kube.Client, n); node.Spec.Unschedulable || !running[n] {
				return false, fmt.Sprintf("node %s: unschedulable=%v, GPU workload running=%v", n, node.Spec.Unschedulable, running[n])
			}
		}
		return true, ""
	})
}

// upgrade starts `helm upgrade` to the scene's tag in the background.
func (sc *scene) upgrade(t *testing.T, extra ...string) *upgrade {
	sc.started = time.Now()
	return startUpgrade(t.Context(), settings(sc.tag, extra...))
}

// finish waits for the rollout to settle, then checks the recorder's invariants, that no node failed on the way,
// the release's result and every node's end state.
func (sc *scene) finish(t *testing.T, rec *recorder, u *upgrade, want endState) {
	t.Helper()
	// until helm applies the new driver DaemonSet (after the pre-upgrade plan, which may crawl through API faults),
	// every driver pod is of the current template and the pool looks settled: wait for the new template first
	rollouttest.WaitFor(t, 2*time.Minute, "the driver DaemonSet on tag "+sc.tag+", or the helm upgrade ended", func() (bool, string) {
		select {
		case <-u.done:
			return true, ""
		default:
		}
		ds, err := kube.Client.AppsV1().DaemonSets(namespace).Get(t.Context(), driverDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		image := ds.Spec.Template.Spec.Containers[0].Image
		// driverDaemonSet's OS follows the tag
		return strings.HasSuffix(image, ":"+sc.tag+"-ubuntu22.04"), "driver image " + image
	})
	settled := settle(t, 150*time.Second)
	// the gate passes at once after a finished rollout; after one stopped on a failed node it fails at the latest
	// when its timeout (hooks.validation.timeoutSeconds) passes, ending the release before the next scenario
	helmErr := u.wait(3 * time.Minute)
	rec.stop()
	if !rec.sawOutOfService() && helmErr != nil {
		t.Fatalf("the release failed before any node's driver changed: %v%s", helmErr, failedHooks(sc.started))
	}
	rec.assertInvariants(t)
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if slices.Contains(rec.states(n), nodestate.UpgradeFailed) {
			node := rollouttest.Node(t, kube.Client, n)
			t.Errorf("node %s went through upgrade-failed (%v); now %s, reason %q", n, rec.states(n),
				node.Labels[nodestate.UpgradeStateLabel], node.Annotations[nodestate.UpgradeReasonAnnotation])
		}
	}
	switch {
	case settled && helmErr != nil && !sc.helmCutOff:
		t.Errorf("every node finished, but the release failed: %v", helmErr)
	case helmErr != nil:
		t.Logf("helm upgrade: %v", helmErr)
	default:
		t.Log("helm upgrade passed")
	}
	assertEndState(t, sc.hosts, want)
	if t.Failed() {
		logFailedRuns(t, sc.started)
	}
}

// logFailedRuns logs the runs of the stack's code that failed since start (why a scenario failed), each distinct
// output once per node (a refusing manager repeats itself on every restart).
func logFailedRuns(t *testing.T, start time.Time) {
	seen := map[string]int{}
	var order []string
	for _, r := range stand.Runs() {
		if r.ExitCode == 0 || r.Started.Before(start) {
			continue
		}
		key := fmt.Sprintf("%s on %s (exit %d):\n%s", r.Component, r.Node, r.ExitCode, r.Output)
		if seen[key] == 0 {
			order = append(order, key)
		}
		seen[key]++
	}
	for _, key := range order {
		t.Logf("%d× %s", seen[key], key)
	}
}

// failedHooks is the output of the hook runs that failed since start.
func failedHooks(start time.Time) string {
	var b strings.Builder
	for _, r := range stand.Runs() {
		if r.ExitCode != 0 && !r.Started.Before(start) && r.Component != kubelet.DriverManagerRun && r.Component != kubelet.UncordonRun {
			fmt.Fprintf(&b, "\n%s (exit %d):\n%s", r.Component, r.ExitCode, r.Output)
		}
	}
	return b.String()
}

// driverPodOn is the name of the live driver pod on node ("" when none).
func driverPodOn(t *testing.T, node string) string {
	t.Helper()
	pods, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver",
		FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	return ""
}

// stopOnce asks for the driver pod's stop after step, the first time only.
func stopOnce(step string) func(string) bool {
	var done atomic.Bool
	return func(s string) bool { return s == step && !done.Swap(true) }
}

// sigtermEveryStep: on eight nodes the driver pod is stopped (deleted: its manager's context ends, as on SIGTERM)
// right after one of the manager's steps each, and on the ninth while its upgrade gate waits for the validator;
// the DaemonSet's next pod resumes from what the stopped one left.
func sigtermEveryStep(t *testing.T, sc *scene) {
	plan := map[string]string{}
	for i, step := range drivermanager.Steps {
		plan[rollouttest.GPUNodeNames(nodes)[i+1]] = step
	}
	for n, step := range plan {
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: sc.hosts[n], Stop: stopOnce(step)})
	}
	// on the ninth node the pod stops while its upgrade gate waits for the validator: the validator's driver check
	// waits from the moment the manager is done until the test lets it pass
	const gated = "gpu-01"
	var hold atomic.Bool
	stand.SetDriverHost(gated, kubelet.DriverHost{Fixture: sc.hosts[gated], Stop: func(step string) bool {
		if step == drivermanager.Steps[len(drivermanager.Steps)-1] && !hold.Swap(true) {
			stand.SetOutcome(gated, "driver", nodestate.Validation{State: nodestate.CheckWaiting, Reason: "held by the test"})
		}
		return false
	}})
	t.Cleanup(stand.Reset)
	rec := recordNodes(t)
	start := time.Now()
	u := sc.upgrade(t)
	rollouttest.WaitFor(t, 90*time.Second, "the upgrade gate on "+gated+" waiting for the validator", func() (bool, string) {
		st := rollouttest.Node(t, kube.Client, gated).Labels[nodestate.UpgradeStateLabel]
		return hold.Load() && st == string(nodestate.ValidationRequired), st
	})
	time.Sleep(time.Second)
	gatedPod := driverPodOn(t, gated)
	if err := kube.Client.CoreV1().Pods(namespace).Delete(t.Context(), gatedPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, 30*time.Second, "the next driver pod's gate on "+gated, func() (bool, string) {
		p := driverPodOn(t, gated)
		return p != "" && p != gatedPod, p
	})
	time.Sleep(time.Second)
	stand.SetOutcome(gated, "driver", nodestate.Validation{State: nodestate.CheckReady})
	sc.finish(t, rec, u, endState{})
	gateStopped := false
	for _, r := range stand.Runs() {
		if r.Component == kubelet.UncordonRun && r.Pod == gatedPod && strings.Contains(r.Output, "stopped") {
			gateStopped = true
		}
	}
	if !gateStopped {
		t.Errorf("the upgrade gate of %s on %s did not report a stop while it waited for the validator", gatedPod, gated)
	}
	for node, step := range plan {
		stopped, later := "", false
		for _, r := range stand.Runs() {
			if r.Component != kubelet.DriverManagerRun || r.Started.Before(start) || r.Node != node {
				continue
			}
			if strings.Contains(r.Output, "stopped") && strings.Contains(r.Output, "after step "+step) {
				stopped = r.Pod
			} else if stopped != "" && r.Pod != stopped && r.ExitCode == 0 {
				later = true
			}
		}
		if stopped == "" || !later {
			t.Errorf("node %s: driver pod stopped after %s: %q; a later pod's manager succeeded: %v", node, step, stopped, later)
			for _, r := range stand.Runs() {
				if r.Component == kubelet.DriverManagerRun && !r.Started.Before(start) && r.Node == node {
					t.Logf("driver manager of %s (exit %d):\n%s", r.Pod, r.ExitCode, r.Output)
				}
			}
		}
	}
}

// secondUpgrade: a `helm upgrade` to one tag that does not wait (no gate), and while its rollout is under way a
// second one to another tag, which the rollout then carries to every node.
func secondUpgrade(t *testing.T, sc *scene) {
	rec := recordNodes(t)
	first := startUpgrade(t.Context(), settings(sc.tag+"-first", "hooks.validation.enabled=false"))
	if err := first.wait(2 * time.Minute); err != nil {
		t.Fatalf("first helm upgrade: %v", err)
	}
	mid := rec.firstIn(t, time.Minute, nodestate.PodRestartRequired, nodestate.ValidationRequired)
	t.Logf("second helm upgrade while %s is %s", mid, rollouttest.Node(t, kube.Client, mid).Labels[nodestate.UpgradeStateLabel])
	u := sc.upgrade(t)
	sc.finish(t, rec, u, endState{})
}

// reboot: a node reboots right after its manager paused the operands (cordoned, GPU pods evicted, switches
// paused, driver still loaded): its modules are gone and /run emptied, and the pod's containers restart.
func reboot(t *testing.T, sc *scene) {
	const node = "gpu-03"
	var done atomic.Bool
	stand.SetDriverHost(node, kubelet.DriverHost{Fixture: sc.hosts[node], Kill: func(step string) error {
		if step != "pause" || done.Swap(true) {
			return nil
		}
		sc.hosts[node].Reboot()
		return errors.New("node rebooted after pause")
	}})
	rec := recordNodes(t)
	start := time.Now()
	u := sc.upgrade(t)
	sc.finish(t, rec, u, endState{})
	if !done.Load() {
		t.Fatalf("node %s never reached the pause step", node)
	}
	resumed := false
	for _, r := range stand.Runs() {
		if r.Component == kubelet.DriverManagerRun && r.Node == node && r.Started.After(start) && r.ExitCode == 0 && strings.Contains(r.Output, "no NVIDIA driver loaded") {
			resumed = true
		}
	}
	if !resumed {
		t.Errorf("no driver manager run on %s found the rebooted node without a driver and went on", node)
	}
}

// blockEviction puts a PodDisruptionBudget that allows no eviction on node's GPU workload and returns its name;
// it is removed when the test ends.
func blockEviction(t *testing.T, node string) string {
	t.Helper()
	ctx := t.Context()
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "train-" + node, Namespace: workloadNS},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train", "node": node}}},
	}
	if _, err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(context.Background(), pdb.Name, metav1.DeleteOptions{})
	})
	rollouttest.WaitFor(t, 30*time.Second, "the PDB observed", func() (bool, string) {
		p, err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil || p.Status.ExpectedPods != 1 || p.Status.CurrentHealthy != 1 {
			return false, fmt.Sprintf("PDB status %+v", p.Status)
		}
		return true, ""
	})
	return pdb.Name
}

// relax lets the PDB's pod go.
func relax(t *testing.T, pdb string) {
	t.Helper()
	patch := []byte(`{"spec":{"minAvailable":0}}`)
	if _, err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Patch(t.Context(), pdb, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvicting waits until node is pod-deletion-required and stays there a moment: its manager waits on the PDB.
func waitEvicting(t *testing.T, node string) {
	t.Helper()
	// the node's turn comes after the canary and the batches the DaemonSet picks before it
	rollouttest.WaitFor(t, 3*time.Minute, node+" evicting", func() (bool, string) {
		st := rollouttest.Node(t, kube.Client, node).Labels[nodestate.UpgradeStateLabel]
		return st == string(nodestate.PodDeletionRequired), st
	})
	time.Sleep(2 * time.Second)
	if st := rollouttest.Node(t, kube.Client, node).Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.PodDeletionRequired) {
		t.Fatalf("%s left pod-deletion-required while its PDB allows nothing: %s", node, st)
	}
}

// pdbRelaxed: a PDB allows no eviction of a node's GPU workload (the upgrade forced past the plan's refusal); while
// the manager waits on it the PDB is relaxed, and the eviction goes on and the node finishes, within the
// eviction timeout.
func pdbRelaxed(t *testing.T, sc *scene) {
	const node = "gpu-04"
	pdb := blockEviction(t, node)
	rec := recordNodes(t)
	u := sc.upgrade(t, "hooks.preUpgrade.force=true")
	waitEvicting(t, node)
	relaxed := time.Now()
	relax(t, pdb)
	rollouttest.WaitFor(t, time.Duration(evictionTimeout)*time.Second, node+" past the eviction", func() (bool, string) {
		st := rollouttest.Node(t, kube.Client, node).Labels[nodestate.UpgradeStateLabel]
		return st != string(nodestate.PodDeletionRequired), st
	})
	t.Logf("%s evicted %s after the PDB was relaxed", node, time.Since(relaxed).Round(10*time.Millisecond))
	sc.finish(t, rec, u, endState{})
}

// adminMidEviction: while a node's manager waits on a PDB, the admin sets nvidia.com/gpu.deploy.dcgm-exporter=false
// on it, cordons a node whose upgrade has not started, and uncordons a node the admin had cordoned before the
// upgrade; then the PDB is relaxed. The admin's label and cordon must survive the pause and resume, and the node
// the admin uncordoned stays schedulable.
func adminMidEviction(t *testing.T, sc *scene) {
	const node, uncordoned = "gpu-05", "gpu-07"
	const label = nodestate.DeployLabelPrefix + "dcgm-exporter"
	pdb := blockEviction(t, node)
	patchNode(t, uncordoned, `{"spec":{"unschedulable":true}}`)
	var cordoned string
	t.Cleanup(func() {
		patchNode(t, node, fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, label))
		patchNode(t, uncordoned, `{"spec":{"unschedulable":false}}`)
		if cordoned != "" {
			patchNode(t, cordoned, `{"spec":{"unschedulable":false}}`)
		}
	})
	rec := recordNodes(t)
	u := sc.upgrade(t, "hooks.preUpgrade.force=true")
	waitEvicting(t, node)
	// a node whose upgrade has not started, else (the evicting node came last) one that finished
	for _, want := range []nodestate.UpgradeState{nodestate.UpgradeRequired, nodestate.UpgradeDone} {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if cordoned == "" && n != node && n != uncordoned && rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel] == string(want) {
				cordoned = n
			}
		}
	}
	if cordoned == "" {
		t.Fatalf("no node waiting for its upgrade or done while %s evicts:\n%s", node, nodeTable(t))
	}
	patchNode(t, node, fmt.Sprintf(`{"metadata":{"labels":{%q:"false"}}}`, label))
	patchNode(t, cordoned, `{"spec":{"unschedulable":true}}`)
	patchNode(t, uncordoned, `{"spec":{"unschedulable":false}}`)
	t.Logf("mid-eviction of %s: the admin set %s=false on it, cordoned %s (%s), uncordoned %s", node, label, cordoned,
		rollouttest.Node(t, kube.Client, cordoned).Labels[nodestate.UpgradeStateLabel], uncordoned)
	relax(t, pdb)
	sc.finish(t, rec, u, endState{adminCordoned: map[string]bool{cordoned: true}, labels: map[string]map[string]string{node: {label: "false"}}})
}

// apiServerRestart: kube-apiserver and etcd stop (etcd's data kept) while nodes are in flight, and start again
// 3 s later.
func apiServerRestart(t *testing.T, sc *scene) {
	rec := recordNodes(t)
	u := sc.upgrade(t)
	sc.helmCutOff = true
	// once Helm has applied the release and waits on the post-upgrade gate, with a node in flight
	rollouttest.WaitFor(t, time.Minute, "the post-upgrade gate running", func() (bool, string) {
		return stand.InFlight("validation-gate") > 0, "not yet"
	})
	mid := rec.firstIn(t, time.Minute, nodestate.PodDeletionRequired, nodestate.PodRestartRequired, nodestate.ValidationRequired)
	t.Logf("restarting the API server and etcd while %s is %s", mid, rollouttest.Node(t, kube.Client, mid).Labels[nodestate.UpgradeStateLabel])
	began := time.Now()
	if err := kube.Restart(t.Context(), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server back after %s", time.Since(began).Round(100*time.Millisecond))
	sc.finish(t, rec, u, endState{})
}

// apiFaults: the driver manager, the upgrade gate and the hooks reach the API server through a proxy that fails
// 4% of requests with 500 ("etcdserver: request timed out") or 503, 4% with 429 (Retry-After: 1), resets 2% of
// connections and delays 20% by 100 ms; from the start, or (afterPlan) only once the pre-upgrade plan is done and
// a node's driver change has begun, so the driver manager and the gate meet the faults even while a hook would
// not get through them.
func apiFaults(afterPlan bool) func(*testing.T, *scene) {
	return func(t *testing.T, sc *scene) {
		proxy, err := StartProxy(kube.Config)
		if err != nil {
			t.Fatal(err)
		}
		defer proxy.Close()
		if err := stand.UseAPI(proxy.Config, t.TempDir()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = stand.UseAPI(nil, "") }()
		faults := Faults{ServerError: 0.04, TooMany: 0.04, Reset: 0.02, Slow: 0.2, Delay: 100 * time.Millisecond}
		defer proxy.Set(Faults{})
		if !afterPlan {
			proxy.Set(faults)
		}
		rec := recordNodes(t)
		u := sc.upgrade(t)
		if afterPlan {
			rec.firstIn(t, time.Minute, nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.PodRestartRequired)
			proxy.Set(faults)
		}
		sc.finish(t, rec, u, endState{})
		t.Logf("proxy: %v", proxy.Counts())
	}
}
