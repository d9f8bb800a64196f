package e2e

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecheck"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
)

// shortGate makes a failing gate fail fast, after an install or an upgrade; the passing gate ends as soon as the
// last node is ready anyway.
const shortGate = "hooks.validation.timeoutSeconds=15,hooks.validation.installTimeoutSeconds=15"

func mixedProfile() string { return filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml") }

// lastRun returns the newest hook run of component since t0.
func (e *env) lastRun(t *testing.T, component string, since time.Time) kubelet.Run {
	t.Helper()
	r, ok := e.stand.LastRun(component, since)
	if !ok {
		t.Fatalf("no %s hook ran since %s (runs: %d)", component, since.Format(time.TimeOnly), len(e.stand.Runs()))
	}
	return r
}

func (e *env) reportState(t *testing.T) (string, string) {
	t.Helper()
	cm, err := e.kube.Client.CoreV1().ConfigMaps(e.target().Namespace).Get(t.Context(), stackcli.DefaultReportConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("report ConfigMap: %v", err)
	}
	return cm.Data[releasecheck.ReportStateKey], cm.Data[releasecheck.ReportTextKey]
}

// gatePassedAndReported: the install since start, with every validator passing, ran a post-install hook that passed
// and printed the node × operand table, saved it to the report ConfigMap, and `status` prints it back.
func (e *env) gatePassedAndReported(t *testing.T, start time.Time) {
	run := e.lastRun(t, "validation-gate", start)
	if run.ExitCode != 0 || !strings.Contains(run.Output, ": passed (") || !strings.Contains(run.Output, "container-ubuntu2204") {
		t.Fatalf("gate exit %d, output:\n%s", run.ExitCode, run.Output)
	}
	t.Logf("gate output:\n%s", run.Output)
	// the hook pod's log, as helm and kubectl read it: through the API server from the simulated node
	logs := e.kube.Client.CoreV1().Pods(e.target().Namespace).GetLogs(run.Pod, &corev1.PodLogOptions{Container: run.Container})
	if got, err := logs.DoRaw(t.Context()); err != nil || string(got) != run.Output {
		t.Errorf("the gate pod's log through the API server: %v\n%s\nwant the run's output", err, got)
	}
	tail := int64(1)
	lines := strings.Split(strings.TrimSuffix(run.Output, "\n"), "\n")
	last := e.kube.Client.CoreV1().Pods(e.target().Namespace).GetLogs(run.Pod, &corev1.PodLogOptions{Container: run.Container, TailLines: &tail})
	if got, err := last.DoRaw(t.Context()); err != nil || strings.TrimSuffix(string(got), "\n") != lines[len(lines)-1] {
		t.Errorf("the gate pod's last log line: %v %q, want %q", err, got, lines[len(lines)-1])
	}
	state, text := e.reportState(t)
	if state != "passed" || !strings.Contains(text, "operator-validator") {
		t.Errorf("report ConfigMap state %q:\n%s", state, text)
	}
	var out bytes.Buffer
	cmd := stackcli.NewCommand(&out)
	cmd.SetArgs([]string{"status", "--kubeconfig", e.kube.Kubeconfig, "-n", e.target().Namespace})
	if err := cmd.ExecuteContext(t.Context()); err != nil || out.String() != text {
		t.Errorf("status printed (err %v):\n%s\nwant the saved report:\n%s", err, out.String(), text)
	}
}

// helmTestPasses: `helm test` on the installed release runs the validation test hook, which passes.
func (e *env) helmTestPasses(t *testing.T) {
	testStart := time.Now()
	if _, err := e.target().Test(); err != nil {
		t.Errorf("helm test: %v", err)
	} else if run := e.lastRun(t, "validation-test", testStart); run.ExitCode != 0 {
		t.Errorf("helm test run exit %d:\n%s", run.ExitCode, run.Output)
	}
}

// TestGateFailsOnANodesDriverValidation: one node's driver check fails, so the release fails, naming that node and
// the check's reason, in the hook output and the saved report.
func TestGateFailsOnANodesDriverValidation(t *testing.T) {
	e := useSmall(t)
	e.stand.Reset()
	defer e.stand.Reset()
	const node, reason = "container-rhel9", "nvidia-smi under /run/nvidia/driver failed: exit 9: couldn't communicate with the NVIDIA driver"
	e.stand.SetOutcome(node, "driver", nodestate.Validation{State: nodestate.CheckFailed, Reason: reason})
	tg := e.target()
	tg.KeepFailed = true
	start := time.Now()
	_, err := tg.Install(t.Context(), []string{mixedProfile()}, shortGate)
	defer e.uninstall(t)
	if err == nil || !strings.Contains(err.Error(), "post-install") {
		t.Fatalf("install should fail in its post-install hook, got %v", err)
	}
	run := e.lastRun(t, "validation-gate", start)
	want := node + " operator-validator failed: validation driver: " + reason
	if run.ExitCode == 0 || !strings.Contains(run.Output, want) {
		t.Errorf("gate exit %d; want %q in:\n%s", run.ExitCode, want, run.Output)
	}
	if state, text := e.reportState(t); state != "failed" || !strings.Contains(text, want) {
		t.Errorf("report state %q:\n%s", state, text)
	}
	if took := run.Ended.Sub(run.Started); took > 10*time.Second {
		t.Errorf("a definite failure should end the gate well before its 15s deadline; took %s", took)
	}
}

// TestGateNamesQuotaRejection: a ResourceQuota that admits no system-node-critical pods in the namespace blocks the
// operand DaemonSets; the gate names the admission message instead of timing out silently.
func TestGateNamesQuotaRejection(t *testing.T) {
	e := useSmall(t)
	e.stand.Reset()
	ns := e.target().Namespace
	if _, err := e.kube.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-critical-pods"},
		Spec: corev1.ResourceQuotaSpec{
			Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			ScopeSelector: &corev1.ScopeSelector{MatchExpressions: []corev1.ScopedResourceSelectorRequirement{{
				ScopeName: corev1.ResourceQuotaScopePriorityClass, Operator: corev1.ScopeSelectorOpIn, Values: []string{"system-node-critical"},
			}}},
		},
	}
	if _, err := e.kube.Client.CoreV1().ResourceQuotas(ns).Create(t.Context(), quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = e.kube.Client.CoreV1().ResourceQuotas(ns).Delete(t.Context(), quota.Name, metav1.DeleteOptions{})
	}()
	tg := e.target()
	tg.KeepFailed = true
	tg.NoWait = true // Helm's own --wait would time out before any hook runs, saying only "timed out"
	start := time.Now()
	_, err := tg.Install(t.Context(), []string{mixedProfile()}, shortGate)
	defer e.uninstall(t)
	if err == nil {
		t.Fatal("install should fail while the quota blocks every operand pod")
	}
	run := e.lastRun(t, "validation-gate", start)
	if !strings.Contains(run.Output, "no pod: FailedCreate:") || !strings.Contains(run.Output, "exceeded quota: no-critical-pods") {
		t.Errorf("gate output does not carry the admission message:\n%s", run.Output)
	}
}

// TestGateNamesClusterProblems: no node labelled as a GPU node (NFD missing), and a GPU node whose OS has no
// driver image, are each named.
func TestGateNamesClusterProblems(t *testing.T) {
	e := useSmall(t)
	e.stand.Reset()
	t.Run("uncovered OS", func(t *testing.T) {
		odd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-centos7", Labels: map[string]string{
			releasecheck.GPUPresentLabel:                              "true",
			"feature.node.kubernetes.io/system-os_release.ID":         "centos",
			"feature.node.kubernetes.io/system-os_release.VERSION_ID": "7",
		}}}
		if err := e.kube.AddNodes(t.Context(), odd); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = e.kube.Client.CoreV1().Nodes().Delete(t.Context(), odd.Name, metav1.DeleteOptions{}) }()
		start := time.Now()
		tg := e.target()
		_, err := tg.Install(t.Context(), []string{mixedProfile()}, shortGate)
		if err == nil {
			e.uninstall(t)
			t.Fatal("install should fail with a GPU node no driver DaemonSet covers")
		}
		run := e.lastRun(t, "validation-gate", start)
		if !strings.Contains(run.Output, "GPU node gpu-centos7: pool default has no driver DaemonSet for its OS/kernel") {
			t.Errorf("gate output:\n%s", run.Output)
		}
	})
	t.Run("no GPU node labelled", func(t *testing.T) {
		var labelled []string
		for _, n := range e.nodes {
			if n.Labels[releasecheck.GPUPresentLabel] == "true" {
				labelled = append(labelled, n.Name)
				e.setNodeLabel(t, n.Name, releasecheck.GPUPresentLabel, nil)
			}
		}
		defer func() {
			for _, n := range labelled {
				e.setNodeLabel(t, n, releasecheck.GPUPresentLabel, ptr("true"))
			}
		}()
		start := time.Now()
		if _, err := e.target().Install(t.Context(), []string{mixedProfile()}, shortGate); err == nil {
			e.uninstall(t)
			t.Fatal("install should fail when no node is labelled as a GPU node")
		}
		run := e.lastRun(t, "validation-gate", start)
		if !strings.Contains(run.Output, "no node is labelled nvidia.com/gpu.present=true: NFD is not running") {
			t.Errorf("gate output:\n%s", run.Output)
		}
	})
}

// TestUninstallAfterInterruptedUpgradeRestoresNodes: a node left mid-upgrade (operands paused, cordoned by us, a
// state label, validation annotations) and a node an admin cordoned; uninstall's pre-delete hook returns every node
// to its state before install, keeping the admin's cordon.
func TestUninstallAfterInterruptedUpgradeRestoresNodes(t *testing.T) {
	e := useSmall(t)
	e.stand.Reset()
	const mid, admin = "container-ubuntu2204", "container-rhel9"
	// the node lifecycle controller taints a cordoned node and untaints it after; both wait for it, so the
	// snapshot holds the taint and no later test sees it vanish
	e.setUnschedulable(t, admin, true)
	defer e.setUnschedulable(t, admin, false)
	before := e.snapshotNodes(t)
	e.installProfile(t, mixedProfile())
	// what an interrupted driver upgrade leaves: the same patches the driver manager writes
	for _, step := range []func(*corev1.Node) (nodestate.Patch, error){
		func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Cordon(n, "driver upgrade"), nil },
		func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Pause(n, nodestate.PausableOperands) },
		func(n *corev1.Node) (nodestate.Patch, error) {
			return nodestate.SetUpgradeState(n, nodestate.PodRestartRequired, "", time.Now().UTC().Format(time.RFC3339)), nil
		},
	} {
		n, err := e.kube.Client.CoreV1().Nodes().Get(t.Context(), mid, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := step(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nodestate.Apply(t.Context(), e.kube.Client, mid, p); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := e.kube.Client.CoreV1().Nodes().Get(t.Context(), admin, metav1.GetOptions{})
	if _, err := nodestate.Apply(t.Context(), e.kube.Client, admin, nodestate.Cordon(a, "driver upgrade")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.uninstall(t)
	if run := e.lastRun(t, "cleanup", start); run.ExitCode != 0 {
		t.Errorf("pre-delete hook exit %d:\n%s", run.ExitCode, run.Output)
	}
	if changes := cluster.NodeChanges(before, e.snapshotNodes(t)); changes != "" {
		t.Errorf("uninstall after an interrupted upgrade left nodes changed:\n%s", changes)
	}
}

// BenchmarkGateLastReadyToExit measures how long the post-install hook takes to pass after the last node's
// validator turns ready (the anchor re-checks every 5 s): one node's plugin check waits while the gate runs, then
// passes.
func BenchmarkGateLastReadyToExit(b *testing.B) {
	e := primary
	const node = "container-ubuntu2404"
	for b.Loop() {
		e.stand.Reset()
		e.stand.SetOutcome(node, "plugin", nodestate.Validation{State: nodestate.CheckWaiting, Reason: "no nvidia.com/gpu capacity yet"})
		start := time.Now()
		done := make(chan error, 1)
		go func() { _, err := e.target().Install(b.Context(), []string{mixedProfile()}); done <- err }()
		for e.stand.InFlight("validation-gate") == 0 {
			time.Sleep(20 * time.Millisecond) // test-side wait for the hook to start
		}
		time.Sleep(time.Second) // let the gate see the node waiting
		e.stand.SetOutcome(node, "plugin", nodestate.Validation{State: nodestate.CheckReady})
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		var run kubelet.Run
		for _, r := range e.stand.Runs() {
			if r.Component == "validation-gate" && !r.Started.Before(start) {
				run = r
			}
		}
		latency := run.Ended.Sub(e.stand.ReadyAt(node))
		b.ReportMetric(float64(latency.Milliseconds()), "ms-last-ready-to-exit")
		b.Logf("gate exited %s after the last node turned ready", latency.Round(time.Millisecond))
		if err := e.target().Uninstall(); err != nil {
			b.Fatal(err)
		}
	}
}
