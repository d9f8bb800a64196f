package rollout

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/refusal"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	namespace  = "gpu-operator"
	release    = "gpu"
	workloadNS = "ml"
	// maxUnavailable is the driver pool's rollout bound.
	maxUnavailable = 2
	// pdbNode's GPU workload has a PodDisruptionBudget that never allows an eviction; adminNode is cordoned by
	// the admin before anything is installed.
	pdbNode   = "gpu-01"
	adminNode = "gpu-02"
	// evictionTimeout bounds the driver manager's GPU pod eviction, in seconds.
	evictionTimeout = 6
	newDriverTag    = "600.10.01"
	// driverDaemonSet is the pool's driver DaemonSet for the nodes' OS (the others have no node).
	driverDaemonSet = "nvidia-driver-daemonset-ubuntu2204"
)

func profile() []string {
	return []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
}

// settings are the release's values on top of the profile. These scenarios prove the DaemonSet's own bound, so
// they turn the pool's canary and failure threshold off; canary_test.go proves those.
func settings(extra ...string) []string {
	return append([]string{
		fmt.Sprintf("driver.upgradePolicy.maxUnavailable=%d", maxUnavailable),
		"driver.upgradePolicy.canary=0", "driver.upgradePolicy.maxFailures=0",
		fmt.Sprintf("driver.manager.gpuPodDeletion.timeoutSeconds=%d", evictionTimeout),
	}, extra...)
}

func target() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: 3 * time.Minute}
}

// killPlan kills the driver manager of one node right after each of its steps, once, during the upgrade.
func killPlan() map[string]string {
	plan := map[string]string{}
	for i, step := range drivermanager.Steps {
		plan[fmt.Sprintf("gpu-%02d", i+3)] = step
	}
	return plan
}

// TestRollingDriverUpgrade installs the chart on ten simulated GPU nodes, each with a fixture host, GPU and
// non-GPU workloads, one GPU workload under a PodDisruptionBudget that never allows an eviction and one node
// cordoned by the admin; then:
//
//  1. a driver upgrade without hooks.preUpgrade.force is refused by the pre-upgrade hook, changing nothing;
//  2. with force, the DaemonSet controller rolls the driver pods while the driver manager (killed once after
//     each of its steps on seven nodes) moves each node through the upgrade states: never more than
//     maxUnavailable nodes in flight or cordoned by us, GPU pods evicted and non-GPU pods left alone, the admin's
//     cordon kept, and the PDB node failing alone within the eviction timeout, restored, with its reason, while
//     the others finish; the post-upgrade gate names it;
//  3. `upgrade retry` of that node, once its PDB is relaxed, finishes it;
//  4. uninstall leaves every node as it was before the install.
func TestRollingDriverUpgrade(t *testing.T) {
	ctx := t.Context()
	client := kube.Client
	hosts := map[string]*kmodtest.Fixture{}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		hosts[n] = kmodtest.New(t)
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: hosts[n]})
	}
	startWorkloads(t)
	cordon(t, adminNode)
	before, err := cluster.SnapshotNodes(ctx, client)
	if err != nil {
		t.Fatal(err)
	}

	// install: every node gets its first driver and validates with it
	if _, err := target().Install(ctx, profile(), settings()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	oldDigest := recordedDigests(t, hosts)[pdbNode]
	for node, d := range recordedDigests(t, hosts) {
		if d == "" || d != oldDigest {
			t.Fatalf("after install node %s runs driver config %q, want %q on every node", node, d, oldDigest)
		}
	}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if st := rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) {
			t.Errorf("after install node %s is %q, want upgrade-done", n, st)
		}
	}
	gpuPods, otherPods := workloadPods(t)

	// 1. refused: nothing changes
	t.Run("unsafe upgrade is refused", func(t *testing.T) {
		snap, _ := cluster.SnapshotNodes(ctx, client)
		gen := driverGeneration(t)
		start := time.Now()
		_, err := target().Upgrade(ctx, profile(), settings("driver.image.tag="+newDriverTag)...)
		if err == nil {
			t.Fatal("the upgrade went ahead although a PDB never lets a GPU pod go")
		}
		run := lastRun(t, "pre-upgrade", start)
		if run.ExitCode == 0 || !strings.Contains(run.Output, "PodDisruptionBudget train-"+pdbNode) || !strings.Contains(run.Output, "hooks.preUpgrade.force") {
			t.Errorf("pre-upgrade (exit %d) does not name the blocking PDB and the way out:\n%s", run.ExitCode, run.Output)
		}
		after, _ := cluster.SnapshotNodes(ctx, client)
		if changes := cluster.NodeChanges(snap, after); changes != "" {
			t.Errorf("a refused upgrade changed nodes:\n%s", changes)
		}
		if g := driverGeneration(t); g != gen {
			t.Errorf("a refused upgrade changed the driver DaemonSet: generation %d -> %d", gen, g)
		}
		// stock helm >= 3.22 prints the failed hook's log after BackoffLimitExceeded (helm.sh/hook-output-log-policy):
		// the hook pod's log, read through the API server as helm reads it, names the refusal
		hookPods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + stackcli.PreUpgradeJob})
		if err != nil || len(hookPods.Items) == 0 {
			t.Fatalf("the pre-upgrade hook's pods: %v (%d)", err, len(hookPods.Items))
		}
		logged, err := client.CoreV1().Pods(namespace).GetLogs(hookPods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil || !strings.Contains(string(logged), "PodDisruptionBudget train-"+pdbNode) {
			t.Errorf("the pre-upgrade hook's log as helm reads it (%v) does not name the blocking PDB:\n%s", err, logged)
		}
		// older helm says only BackoffLimitExceeded: the reason is on the hook's Job, and in `status`
		ev, err := refusal.Last(ctx, client, namespace, stackcli.PreUpgradeJob)
		if err != nil || ev == nil || !strings.Contains(ev.Message, "PodDisruptionBudget train-"+pdbNode) {
			t.Errorf("the refusal recorded on Job %s: %v, %v; want an Event naming the PDB", stackcli.PreUpgradeJob, ev, err)
		}
		var out bytes.Buffer
		cmd := stackcli.NewCommand(&out)
		cmd.SetArgs([]string{"status", "--kubeconfig", kube.Kubeconfig, "-n", namespace, "--release", release})
		if err := cmd.ExecuteContext(ctx); err != nil || !strings.Contains(out.String(), "The last upgrade was refused") ||
			!strings.Contains(out.String(), "PodDisruptionBudget train-"+pdbNode) {
			t.Errorf("status (%v) does not show the refusal:\n%s", err, out.String())
		}
		// --watch redraws the live view until Ctrl-C, which ends it with no error
		wctx, stop := context.WithTimeout(ctx, 3*time.Second)
		defer stop()
		out.Reset()
		cmd = stackcli.NewCommand(&out)
		cmd.SetArgs([]string{"status", "--watch", "--interval", "500ms", "--kubeconfig", kube.Kubeconfig, "-n", namespace, "--release", release})
		if err := cmd.ExecuteContext(wctx); err != nil || strings.Count(out.String(), "nodes by driver upgrade state: ") < 2 ||
			!strings.Contains(out.String(), "The last upgrade was refused") {
			t.Errorf("status --watch (%v) drew fewer than two frames with the states and the refusal:\n%s", err, out.String())
		}
	})

	// 2. the rollout
	for node, step := range killPlan() {
		stand.SetDriverHost(node, kubelet.DriverHost{Fixture: hosts[node], Kill: killOnce(step)})
	}
	rec := recordNodes(t)
	start := time.Now()
	tg := target()
	tg.NoWait = true // Helm's own wait would only say "timed out"; the gate says which node failed and why
	_, upErr := tg.Upgrade(ctx, profile(), settings("driver.image.tag="+newDriverTag, "hooks.preUpgrade.force=true")...)
	upgraded := slices.DeleteFunc(rollouttest.GPUNodeNames(nodes), func(n string) bool { return n == pdbNode })
	rollouttest.WaitFor(t, 3*time.Minute, "every node but the PDB node upgrade-done with its driver pod Ready", func() (bool, string) {
		return rolledOut(t, upgraded)
	})
	rec.stop()
	newDigest := recordedDigests(t, hosts)[adminNode]
	t.Logf("rollout of %d nodes (one failing) in %s; at most %d in flight, %d cordoned by the upgrade at once",
		len(upgraded)+1, time.Since(start).Round(100*time.Millisecond), rec.maxInFlight, rec.maxCordoned)

	t.Run("the gate fails the release naming the failed node", func(t *testing.T) {
		if upErr == nil {
			t.Fatal("helm upgrade succeeded although a node failed its driver change")
		}
		gate := lastRun(t, "validation-gate", start)
		for _, want := range []string{pdbNode + " driver failed: driver upgrade failed: evict GPU pods", "upgrade retry " + pdbNode, adminNode} {
			if gate.ExitCode == 0 || !strings.Contains(gate.Output, want) {
				t.Errorf("gate (exit %d) lacks %q:\n%s", gate.ExitCode, want, gate.Output)
			}
		}
		plan := lastRun(t, "pre-upgrade", start)
		if plan.ExitCode != 0 || !strings.Contains(plan.Output, fmt.Sprintf("pre-upgrade: %d GPU nodes marked upgrade-required", len(upgraded)+1)) {
			t.Errorf("pre-upgrade (exit %d):\n%s", plan.ExitCode, plan.Output)
		}
	})

	t.Run("every old driver stopped on an emptied node", func(t *testing.T) {
		assertDriversStoppedOnEmptiedNodes(t, start)
	})

	t.Run("never more than maxUnavailable nodes in flight or cordoned", func(t *testing.T) {
		if rec.maxInFlight > maxUnavailable || rec.maxCordoned > maxUnavailable {
			t.Errorf("at one moment %d nodes were in flight and %d cordoned by the upgrade, want at most %d:\n%s",
				rec.maxInFlight, rec.maxCordoned, maxUnavailable, rec.worst)
		}
		if rec.maxInFlight == 0 {
			t.Error("the recorder saw no node in flight: the rollout was not observed")
		}
	})

	t.Run("every upgraded node passed through the states", func(t *testing.T) {
		want := []nodestate.UpgradeState{nodestate.UpgradeRequired, nodestate.CordonRequired, nodestate.PodDeletionRequired,
			nodestate.PodRestartRequired, nodestate.ValidationRequired, nodestate.UncordonRequired, nodestate.UpgradeDone}
		for _, n := range upgraded {
			if got := rec.states(n); !subsequence(want, got) {
				t.Errorf("node %s went through %v, want %v in that order", n, got, want)
			}
			if d := recordedDigests(t, hosts)[n]; d != newDigest || d == oldDigest {
				t.Errorf("node %s runs driver config %s, want the new %s", n, d, newDigest)
			}
			node := rollouttest.Node(t, kube.Client, n)
			if node.Spec.Unschedulable != (n == adminNode) || nodestate.CordonedByUs(node) {
				t.Errorf("node %s: unschedulable=%v cordoned-by-us=%v, want unschedulable only on the admin's node %s",
					n, node.Spec.Unschedulable, nodestate.CordonedByUs(node), adminNode)
			}
			assertNothingPaused(t, node)
		}
	})

	t.Run("the PDB node failed alone, restored, with its reason", func(t *testing.T) {
		node := rollouttest.Node(t, kube.Client, pdbNode)
		want := []nodestate.UpgradeState{nodestate.UpgradeRequired, nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.UpgradeFailed}
		if got := rec.states(pdbNode); !subsequence(want, got) {
			t.Errorf("node %s went through %v, want %v in that order", pdbNode, got, want)
		}
		if st := node.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeFailed) {
			t.Errorf("state %q, want upgrade-failed", st)
		}
		if reason := node.Annotations[nodestate.UpgradeReasonAnnotation]; !strings.Contains(reason, "train-"+pdbNode) || !strings.Contains(reason, fmt.Sprintf("%ds", evictionTimeout)) {
			t.Errorf("reason %q does not name the pod the PDB keeps and the timeout", reason)
		}
		if node.Spec.Unschedulable || nodestate.CordonedByUs(node) {
			t.Error("the failed node is still cordoned")
		}
		assertNothingPaused(t, node)
		if d := recordedDigests(t, hosts)[pdbNode]; d != oldDigest || len(hosts[pdbNode].LoadedModules()) == 0 {
			t.Errorf("the failed node's driver: config %s, modules %v; want the old driver %s kept loaded", d, hosts[pdbNode].LoadedModules(), oldDigest)
		}
		// the emptying failed in the old driver pod, which stays: its driver never got a stop
		for _, st := range stand.DriverStops() {
			if st.Node == pdbNode && st.At.After(start) {
				t.Errorf("the failed node's old driver pod %s was stopped; it must keep serving until `upgrade retry`", st.Pod)
			}
		}
	})

	t.Run("GPU pods evicted, others left alone", func(t *testing.T) {
		gpuAfter, otherAfter := workloadPods(t)
		for node, uid := range gpuPods {
			moved := gpuAfter[node] != uid
			if moved != (node != pdbNode) {
				t.Errorf("GPU workload on %s: evicted=%v, want %v", node, moved, node != pdbNode)
			}
		}
		for node, uid := range otherPods {
			if otherAfter[node] != uid {
				t.Errorf("the non-GPU workload on %s was evicted", node)
			}
		}
		// the evicted GPU pods come back on their nodes, except on the node the admin keeps cordoned
		rollouttest.WaitFor(t, time.Minute, "GPU workloads back on their uncordoned nodes", func() (bool, string) {
			running := runningGPU(t)
			for _, n := range rollouttest.GPUNodeNames(nodes) {
				if running[n] != (n != adminNode) {
					return false, fmt.Sprintf("GPU workload running on %s: %v", n, running[n])
				}
			}
			return true, ""
		})
	})

	t.Run("a driver manager killed after each step converged", func(t *testing.T) {
		for node, step := range killPlan() {
			killed, later := false, false
			for _, r := range stand.Runs() {
				if r.Component != kubelet.DriverManagerRun || !r.Started.After(start) || r.Node != node {
					continue
				}
				if strings.Contains(r.Output, "killed after "+step) {
					killed = true
				} else if killed && r.ExitCode == 0 {
					later = true
				}
			}
			if !killed || !later {
				t.Errorf("node %s: killed after %s = %v, a later run succeeded = %v", node, step, killed, later)
			}
		}
	})

	// 3. retry once the PDB lets go
	t.Run("upgrade retry finishes the failed node", func(t *testing.T) {
		if err := client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(ctx, "train-"+pdbNode, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd := stackcli.NewCommand(&out)
		cmd.SetArgs([]string{"upgrade", "retry", pdbNode, "--kubeconfig", kube.Kubeconfig, "-n", namespace, "--release", release})
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Fatalf("upgrade retry: %v\n%s", err, out.String())
		}
		rollouttest.WaitFor(t, time.Minute, pdbNode+" upgrade-done", func() (bool, string) { return rolledOut(t, []string{pdbNode}) })
		if d := recordedDigests(t, hosts)[pdbNode]; d != newDigest {
			t.Errorf("after retry %s runs driver config %s, want %s", pdbNode, d, newDigest)
		}
		if n := rollouttest.Node(t, kube.Client, pdbNode); n.Spec.Unschedulable {
			t.Error("still cordoned after retry")
		}
	})

	// 4. uninstall
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
	// the driver managers took a Lease per node; the cleanup removes them with the rest
	leases, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: nodestate.DriverManagerLeaseLabel})
	switch {
	case err != nil:
		t.Error(err)
	case len(leases.Items) > 0:
		t.Errorf("uninstall left %d driver-manager leases, e.g. %s", len(leases.Items), leases.Items[0].Name)
	}
	if t.Failed() {
		logRuns(t, start)
	}
}

// killOnce fails the driver manager's AfterStep at step, the first time only.
func killOnce(step string) func(string) error {
	var done atomic.Bool
	return func(s string) error {
		if s == step && !done.Swap(true) {
			return fmt.Errorf("killed after %s", step)
		}
		return nil
	}
}

func cordon(t *testing.T, name string) {
	t.Helper()
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// the node lifecycle controller follows with the unschedulable taint: part of the state before the install
	rollouttest.WaitFor(t, 30*time.Second, "the unschedulable taint on "+name, func() (bool, string) {
		for _, taint := range rollouttest.Node(t, kube.Client, name).Spec.Taints {
			if taint.Key == corev1.TaintNodeUnschedulable {
				return true, ""
			}
		}
		return false, "no taint yet"
	})
}

func assertNothingPaused(t *testing.T, node *corev1.Node) {
	t.Helper()
	if v, ok := node.Annotations[nodestate.PausedLabelsAnnotation]; ok {
		t.Errorf("node %s still records paused operands: %s", node.Name, v)
	}
	for k, v := range node.Labels {
		if strings.HasPrefix(k, nodestate.DeployLabelPrefix) && v == nodestate.Paused {
			t.Errorf("node %s: %s=%s left paused", node.Name, k, v)
		}
	}
}

func recordedDigests(t *testing.T, hosts map[string]*kmodtest.Fixture) map[string]string {
	t.Helper()
	out := map[string]string{}
	for n, f := range hosts {
		d, _, err := f.Host().RecordedDigest()
		if err != nil {
			t.Fatal(err)
		}
		out[n] = d
	}
	return out
}

func driverGeneration(t *testing.T) int64 {
	t.Helper()
	ds, err := kube.Client.AppsV1().DaemonSets(namespace).Get(t.Context(), driverDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds.Generation
}

// rolledOut: each node is upgrade-done and its driver pod, of the DaemonSet's current revision, is Ready.
func rolledOut(t *testing.T, names []string) (bool, string) {
	t.Helper()
	ctx := t.Context()
	ds, err := kube.Client.AppsV1().DaemonSets(namespace).Get(ctx, driverDaemonSet, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		return false, err.Error()
	}
	ready := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.Spec.Containers[0].Image == ds.Spec.Template.Spec.Containers[0].Image {
				ready[p.Spec.NodeName] = true
			}
		}
	}
	for _, n := range names {
		node := rollouttest.Node(t, kube.Client, n)
		if st := node.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) || !ready[n] {
			return false, fmt.Sprintf("node %s: %s, new driver pod ready %v", n, st, ready[n])
		}
	}
	return true, ""
}

func lastRun(t *testing.T, component string, since time.Time) kubelet.Run {
	t.Helper()
	r, ok := stand.LastRun(component, since)
	if !ok {
		t.Fatalf("no %s run since %s", component, since.Format(time.TimeOnly))
	}
	return r
}

// logRuns prints the hook and driver-manager runs since t0 (why something failed).
func logRuns(t *testing.T, since time.Time) {
	for _, r := range stand.Runs() {
		if !r.Started.Before(since) && (r.ExitCode != 0 || r.Component != kubelet.DriverManagerRun) {
			t.Logf("%s %s (exit %d):\n%s", r.Component, r.Pod, r.ExitCode, r.Output)
		}
	}
}

func subsequence[T comparable](want, got []T) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// recorder watches every node and keeps, per node, the sequence of upgrade states it went through, and the most
// nodes in flight (between cordon-required and uncordon-required) and cordoned by the upgrade at one moment.
type recorder struct {
	mu                 sync.Mutex
	seq                map[string][]nodestate.UpgradeState
	inFlight, cordoned map[string]bool
	notReady           map[string]bool
	// pods is each driver pod's last readiness and deletion, as observePod wrote it in the history
	pods                     map[string]string
	maxInFlight, maxCordoned int
	// worst is the moment with the most nodes out, and the changes that led to it
	worst string
	// history is the last historyLen changes of a node's state or of its cordon, oldest first
	history []string
	cancel  context.CancelFunc
	done    chan struct{}
}

func recordNodes(t *testing.T) *recorder {
	t.Helper()
	list, err := kube.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := &recorder{seq: map[string][]nodestate.UpgradeState{}, inFlight: map[string]bool{}, cordoned: map[string]bool{}, notReady: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	for i := range list.Items {
		r.observe(&list.Items[i])
	}
	w, err := kube.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	// the driver pods too: the DaemonSet controller's view of the bound is their readiness and deletion
	pods, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: driverPods})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		r.observePod(&pods.Items[i], false)
	}
	pw, err := kube.Client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: driverPods, ResourceVersion: pods.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	podsDone := make(chan struct{})
	go func() {
		defer close(podsDone)
		defer pw.Stop()
		for ev := range pw.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				r.observePod(p, ev.Type == watch.Deleted)
			}
		}
	}()
	go func() {
		defer close(r.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted {
				r.observe(n)
			}
		}
		<-podsDone
	}()
	return r
}

// driverPods selects the driver DaemonSets' pods.
const driverPods = "app.kubernetes.io/component=driver"

// historyLen is how many node and driver pod changes the recorder keeps to explain its worst moment.
const historyLen = 80

// observePod adds a driver pod's change of readiness or deletion to the history: what the DaemonSet controller
// counts against maxUnavailable.
func (r *recorder) observePod(p *corev1.Pod, gone bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	now := fmt.Sprintf("ready %v, deleting %v, gone %v, template generation %s", ready, p.DeletionTimestamp != nil, gone,
		p.Labels["pod-template-generation"])
	if r.pods == nil {
		r.pods = map[string]string{}
	}
	if r.pods[p.Name] == now {
		return
	}
	r.pods[p.Name] = now
	r.history = append(r.history, fmt.Sprintf("%s   pod %s on %s: %s", time.Now().Format("15:04:05.000"), p.Name, p.Spec.NodeName, now))
	r.history = r.history[max(0, len(r.history)-historyLen):]
}

func (r *recorder) observe(n *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	changed := r.cordoned[n.Name] != nodestate.CordonedByUs(n)
	// a node the node lifecycle controller marks NotReady has its pods marked unready, and the DaemonSet controller
	// replaces an unready old pod outside maxUnavailable: the history shows it if it happens
	notReady := !nodeReady(n)
	if notReady != r.notReady[n.Name] {
		r.notReady[n.Name] = notReady
		r.history = append(r.history, fmt.Sprintf("%s %s NotReady: %v", time.Now().Format("15:04:05.000"), n.Name, notReady))
	}
	if s := r.seq[n.Name]; st != "" && (len(s) == 0 || s[len(s)-1] != st) {
		r.seq[n.Name] = append(s, st)
		changed = true
	}
	if changed {
		r.history = append(r.history, fmt.Sprintf("%s %s %s, cordoned by the upgrade: %v",
			time.Now().Format("15:04:05.000"), n.Name, st, nodestate.CordonedByUs(n)))
	}
	r.history = r.history[max(0, len(r.history)-historyLen):]
	switch st {
	case nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired,
		nodestate.ValidationRequired, nodestate.UncordonRequired:
		r.inFlight[n.Name] = true
	default:
		delete(r.inFlight, n.Name)
	}
	if nodestate.CordonedByUs(n) {
		r.cordoned[n.Name] = true
	} else {
		delete(r.cordoned, n.Name)
	}
	if len(r.inFlight) > r.maxInFlight || len(r.cordoned) > r.maxCordoned {
		r.maxInFlight, r.maxCordoned = max(r.maxInFlight, len(r.inFlight)), max(r.maxCordoned, len(r.cordoned))
		r.worst = fmt.Sprintf("in flight %v, cordoned %v, after these node changes:\n%s", slices.Sorted(maps.Keys(r.inFlight)), slices.Sorted(maps.Keys(r.cordoned)),
			strings.Join(r.history, "\n"))
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (r *recorder) states(node string) []nodestate.UpgradeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seq[node])
}

func (r *recorder) stop() {
	r.cancel()
	<-r.done
}

// startWorkloads pins a GPU Deployment and a CPU Deployment to each GPU node, and puts a PDB on pdbNode's GPU one.
func startWorkloads(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	c := kube.Client
	if err := workloads.Deploy(ctx, c, workloadNS, rollouttest.GPUNodeNames(nodes)); err != nil {
		t.Fatal(err)
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "train-" + pdbNode, Namespace: workloadNS},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train", "node": pdbNode}}},
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(workloadNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, time.Minute, "workloads running and the PDB observed", func() (bool, string) {
		running := runningGPU(t)
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if !running[n] {
				return false, "no GPU workload running on " + n
			}
		}
		p, err := c.PolicyV1().PodDisruptionBudgets(workloadNS).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil || p.Status.ExpectedPods != 1 || p.Status.CurrentHealthy != 1 {
			return false, fmt.Sprintf("PDB status %+v", p.Status)
		}
		return true, ""
	})
}

// workloadPods returns each GPU node's running GPU workload pod and non-GPU workload pod.
func workloadPods(t *testing.T) (gpu, other map[string]types.UID) {
	t.Helper()
	gpu, other = map[string]types.UID{}, map[string]types.UID{}
	list, err := kube.Client.CoreV1().Pods(workloadNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" {
			continue
		}
		if p.Labels["app"] == "train" {
			gpu[p.Labels["node"]] = p.UID
		} else {
			other[p.Labels["node"]] = p.UID
		}
	}
	return gpu, other
}

// runningGPU says on which nodes a GPU workload pod is running.
func runningGPU(t *testing.T) map[string]bool {
	t.Helper()
	running, err := workloads.RunningGPU(t.Context(), kube.Client, workloadNS)
	if err != nil {
		t.Fatal(err)
	}
	return running
}

// assertDriversStoppedOnEmptiedNodes fails for every driver container that got its stop since start while a GPU pod
// was still on its node: the upstream driver's shutdown stops nvidia-persistenced and the fabric manager before it
// checks whether the GPUs are in use, so those pods would have lost them. It also fails when no driver stopped.
func assertDriversStoppedOnEmptiedNodes(t *testing.T, since time.Time) {
	t.Helper()
	stopped := 0
	for _, st := range stand.DriverStops() {
		if st.At.Before(since) {
			continue
		}
		stopped++
		if len(st.GPUPods) > 0 {
			t.Errorf("driver pod %s on %s got its stop with GPU pods still on the node: %s", st.Pod, st.Node, strings.Join(st.GPUPods, ", "))
		}
	}
	if stopped == 0 {
		t.Error("no driver container stopped: the rollout replaced no driver pod")
	}
}
