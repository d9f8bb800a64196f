package releasecheck

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func gpuNode(name string, labels map[string]string) *corev1.Node {
	l := map[string]string{GPUPresentLabel: "true", "pool": "a"}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

// daemonSet selects GPU nodes (and, when extra is given, nodes with that label too).
func daemonSet(name, component string, match ...corev1.NodeSelectorRequirement) *appsv1.DaemonSet {
	reqs := append([]corev1.NodeSelectorRequirement{{Key: GPUPresentLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}, match...)
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), Labels: map[string]string{componentLabel: component}},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{
			NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}}}}}}},
	}
}

func pod(ds *appsv1.DaemonSet, node, revision string, isReady bool) *corev1.Pod {
	yes := true
	st := corev1.ConditionFalse
	if isReady {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-" + node, Labels: map[string]string{appsv1.DefaultDaemonSetUniqueLabelKey: revision},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, InitContainers: []corev1.Container{{Name: "driver-validation"}, {Name: "toolkit-validation"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "driver-validation", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}},
				{Name: "toolkit-validation", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			}},
	}
}

func TestEvaluate(t *testing.T) {
	plugin := daemonSet("nvidia-device-plugin-daemonset", "device-plugin")
	validator := daemonSet("nvidia-operator-validator", "operator-validator")
	driver := daemonSet("nvidia-driver-default-ubuntu22.04", "driver")
	a, b := gpuNode("a", nil), gpuNode("b", nil)
	cpu := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}
	pools := []driverpools.Pool{{Name: "default", Source: "container", NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}
	revs := map[types.UID]string{plugin.UID: "r2", validator.UID: "r1", driver.UID: "r1"}
	all := []*appsv1.DaemonSet{plugin, validator, driver}
	readyEverywhere := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(plugin, "b", "r2", true), pod(validator, "a", "r1", true),
		pod(validator, "b", "r1", true), pod(driver, "a", "r1", true), pod(driver, "b", "r1", true)}

	t.Run("all ready passes", func(t *testing.T) {
		r, err := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{a, b, cpu}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		if err != nil || !r.Passed() || r.Summary[Ready] != 6 || len(r.Nodes) != 2 {
			t.Fatalf("want 6 ready cells on 2 nodes, got %v %v:\n%s", err, r.Summary, r.Table())
		}
	})

	t.Run("old revision and init crash wait with reasons", func(t *testing.T) {
		pods := []*corev1.Pod{pod(plugin, "a", "r1", true), pod(validator, "a", "r1", false), pod(driver, "a", "r1", true)}
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{a}, DaemonSets: all, Pods: pods, Revisions: revs})
		table := r.Table()
		for _, want := range []string{"device-plugin waiting: pod nvidia-device-plugin-daemonset-a runs an old revision",
			"operator-validator waiting: pod nvidia-operator-validator-a: Init:1/2 toolkit-validation CrashLoopBackOff"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
		if r.Settled() {
			t.Error("a report with waiting cells is settled")
		}
		r.Expire(4 * time.Minute)
		if !r.Settled() || r.Passed() || !strings.Contains(r.Table(), "failed: timed out after 4m0s: pod nvidia-operator-validator-a") {
			t.Errorf("expired report:\n%s", r.Table())
		}
	})

	// a native sidecar (the toolkit's runtime-config-keeper) runs for the pod's life: a pod held back by its next
	// init container names that one, not the sidecar
	t.Run("a running native sidecar holds nothing back", func(t *testing.T) {
		p := pod(validator, "a", "r1", false)
		always, started := corev1.ContainerRestartPolicyAlways, true
		p.Spec.InitContainers = append([]corev1.Container{{Name: "runtime-config-keeper", RestartPolicy: &always}}, p.Spec.InitContainers...)
		p.Status.InitContainerStatuses = append([]corev1.ContainerStatus{{Name: "runtime-config-keeper", Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}, p.Status.InitContainerStatuses...)
		slimmed, _ := slim(p.DeepCopy())
		for _, q := range []*corev1.Pod{p, slimmed.(*corev1.Pod)} {
			if got := describe(q); got != "Init:2/3 toolkit-validation CrashLoopBackOff" {
				t.Errorf("describe = %q, want the validation that holds the pod back", got)
			}
		}
	})

	t.Run("a failed validation fails its node with the reason", func(t *testing.T) {
		bad := gpuNode("b", nil)
		bad.Annotations = map[string]string{nodestate.ValidationAnnotationPrefix + "driver": "failed: nvidia-smi exited 9"}
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{a, bad}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		if !r.Settled() || r.Passed() || !strings.Contains(r.Table(), "b operator-validator failed: validation driver: nvidia-smi exited 9") {
			t.Errorf("want node b failed with the driver reason:\n%s", r.Table())
		}
	})

	t.Run("a driver pod on an upgrade-failed node fails with the reason; a cordoned node keeps its cells", func(t *testing.T) {
		failed := gpuNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
		failed.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "evict GPU pods: PDB ml/train"}
		cordoned := gpuNode("a", nil)
		cordoned.Spec.Unschedulable = true
		cordoned.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}}
		pods := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(validator, "a", "r1", true), pod(driver, "a", "r1", true),
			pod(plugin, "b", "r2", true), pod(validator, "b", "r1", true), pod(driver, "b", "r1", false)}
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{cordoned, failed}, DaemonSets: all, Pods: pods, Revisions: revs})
		if !r.Settled() || r.Passed() || r.Summary[Ready] != 5 ||
			!strings.Contains(r.Table(), "b driver failed: driver upgrade failed: evict GPU pods: PDB ml/train; fix it, then run `kube-gpu-stack upgrade retry b`") {
			t.Errorf("want node b's driver failed with the reason and a's three cells ready:\n%s", r.Table())
		}
	})

	t.Run("a Ready driver pod does not end a driver change the plan marked", func(t *testing.T) {
		// every driver pod Ready with the new template, but the nodes still where the plan put them
		marked := gpuNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
		inFlight := gpuNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.ValidationRequired)})
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{marked, inFlight}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		table := r.Table()
		if r.Passed() || r.Settled() || r.Summary[Waiting] != 2 {
			t.Fatalf("want both driver cells waiting and the check going on:\n%s", table)
		}
		for _, want := range []string{"a driver waiting: driver change not over: node is upgrade-required",
			"b driver waiting: driver change not over: node is validation-required"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
		// a node held for a slot says so: the driver manager's reason, as upgrade status shows it
		marked.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "waiting for a slot of pool default: 1 of its nodes, its maxUnavailable, are out of service"}
		r, _ = Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{marked, inFlight}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		if want := "a driver waiting: driver change not over: node is upgrade-required: waiting for a slot of pool default"; !strings.Contains(r.Table(), want) {
			t.Errorf("table lacks %q:\n%s", want, r.Table())
		}
		done := gpuNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)})
		r, _ = Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{done, b}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		if !r.Passed() {
			t.Errorf("upgrade-done nodes with Ready pods must pass:\n%s", r.Table())
		}
	})

	t.Run("an upgrade-failed node fails the check at once, though other nodes still wait", func(t *testing.T) {
		failed := gpuNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
		failed.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "no operator-validator pod on the node became Ready within 10m0s"}
		waiting := gpuNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
		// a's driver pod Ready (a sidecar that turned Ready on a failed node), b's still the old revision
		pods := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(validator, "a", "r1", true), pod(driver, "a", "r1", true),
			pod(plugin, "b", "r2", true), pod(validator, "b", "r1", true), pod(driver, "b", "r0", true)}
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{failed, waiting}, DaemonSets: all, Pods: pods, Revisions: revs})
		table := r.Table()
		if !r.Settled() || r.Passed() || r.Verdict() != "failed" || !slices.Equal(r.FailedUpgrades, []string{"a"}) {
			t.Fatalf("want the check settled and failed on node a, got failed upgrades %v:\n%s", r.FailedUpgrades, table)
		}
		for _, want := range []string{"a driver failed: driver upgrade failed: no operator-validator pod on the node became Ready within 10m0s; fix it, then run `kube-gpu-stack upgrade retry a`",
			"b driver waiting: driver change not over: node is upgrade-required (pod nvidia-driver-default-ubuntu22.04-b runs an old revision"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
	})

	t.Run("an OnDelete pool's marked node waits for the admin, not the release", func(t *testing.T) {
		onDelete := driver.DeepCopy()
		onDelete.Spec.UpdateStrategy.Type = appsv1.OnDeleteDaemonSetStrategyType
		marked := gpuNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
		pods := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(validator, "a", "r1", true), pod(onDelete, "a", "r0", true)}
		r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{marked}, DaemonSets: []*appsv1.DaemonSet{plugin, validator, onDelete}, Pods: pods, Revisions: revs})
		if !r.Passed() {
			t.Errorf("want passed:\n%s", r.Table())
		}
	})

	// the driver DaemonSets are OnDelete in every pool: with autoUpgrade the old pod's gate carries the change on
	// (--replace-outdated), so the release waits for it; with --on-request the admin starts each node
	t.Run("an OnDelete driver pool whose gates replace their pods is the release's to wait for", func(t *testing.T) {
		for _, tc := range []struct {
			args   []string
			passed bool
		}{{[]string{"--replace-outdated"}, false}, {[]string{"--replace-outdated", "--on-request"}, true}} {
			replacing := driver.DeepCopy()
			replacing.Spec.UpdateStrategy.Type = appsv1.OnDeleteDaemonSetStrategyType
			replacing.Spec.Template.Spec.Containers = append(replacing.Spec.Template.Spec.Containers,
				corev1.Container{Name: "driver-upgrade-gate", Command: []string{"driver-manager", "uncordon-when-valid"}, Args: tc.args})
			marked := gpuNode("a", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeRequired)})
			pods := []*corev1.Pod{pod(plugin, "a", "r2", true), pod(validator, "a", "r1", true), pod(replacing, "a", "r0", true)}
			r, _ := Evaluate("gpu", "ns", pools, Snapshot{Nodes: []*corev1.Node{marked}, DaemonSets: []*appsv1.DaemonSet{plugin, validator, replacing}, Pods: pods, Revisions: revs})
			if r.Passed() != tc.passed {
				t.Errorf("gate args %v: passed %v, want %v:\n%s", tc.args, r.Passed(), tc.passed, r.Table())
			}
		}
	})

	t.Run("FailedCreate carries the admission message", func(t *testing.T) {
		ev := &corev1.Event{Reason: "FailedCreate", Message: `pods "x" is forbidden: exceeded quota: critical-pods`,
			InvolvedObject: corev1.ObjectReference{Kind: "DaemonSet", UID: plugin.UID}}
		r, _ := Evaluate("gpu", "ns", nil, Snapshot{Nodes: []*corev1.Node{a}, DaemonSets: []*appsv1.DaemonSet{plugin}, Events: []*corev1.Event{ev}})
		if !strings.Contains(r.Table(), "no pod: FailedCreate: pods \"x\" is forbidden: exceeded quota: critical-pods") {
			t.Errorf("table:\n%s", r.Table())
		}
	})

	t.Run("cluster problems", func(t *testing.T) {
		r, _ := Evaluate("gpu", "ns", nil, Snapshot{Nodes: []*corev1.Node{cpu}, DaemonSets: all})
		if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Message, "no node is labelled nvidia.com/gpu.present=true") {
			t.Errorf("problems %v", r.Problems)
		}
		stray := gpuNode("stray", map[string]string{"pool": "z"})
		two := append(pools, driverpools.Pool{Name: "extra", Source: "host", NodeSelectorTerms: pools[0].NodeSelectorTerms})
		r, _ = Evaluate("gpu", "ns", two, Snapshot{Nodes: []*corev1.Node{a, stray}, DaemonSets: all, Pods: readyEverywhere, Revisions: revs})
		table := r.Table()
		for _, want := range []string{"GPU node stray: no driver pool selects it", "GPU node a: selected by driver pools default and extra"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
		}
	})
}

// A driver change's release succeeds once each changed pool's canary validated: the rest of the pool rolls on,
// bounded by its slots, and is reported as rolling; until then it waits, and a failed canary fails it.
func TestReleasePassesOnceThePoolsCanaryValidated(t *testing.T) {
	driver := daemonSet("nvidia-driver-default-ubuntu22.04", "driver")
	pools := []driverpools.Pool{{Name: "default", Source: "container"}}
	mark := canary.Mark{Pool: "default", Plan: "2026-12-01T00:00:00Z", Seq: 4, Canary: map[string]string{"a": "new"}, MaxFailures: 1, MaxUnavailable: 2}.Format()
	marked := func(name string, state nodestate.UpgradeState) *corev1.Node {
		n := gpuNode(name, map[string]string{nodestate.UpgradeStateLabel: string(state)})
		n.Annotations = map[string]string{canary.MarkAnnotation: mark}
		return n
	}
	snapshot := func(canaryState nodestate.UpgradeState) Snapshot {
		nodes := []*corev1.Node{marked("a", canaryState), marked("b", nodestate.UpgradeRequired), marked("c", nodestate.DrainRequired)}
		pods := []*corev1.Pod{pod(driver, "a", "r2", canaryState == nodestate.UpgradeDone), pod(driver, "b", "r1", true), pod(driver, "c", "r1", false)}
		return Snapshot{Nodes: nodes, DaemonSets: []*appsv1.DaemonSet{driver}, Pods: pods, Revisions: map[types.UID]string{driver.UID: "r2"}}
	}

	r, _ := Evaluate("gpu", "ns", pools, snapshot(nodestate.ValidationRequired))
	if r.Passed() || r.Settled() || r.Summary[Rolling] != 0 {
		t.Fatalf("canary not validated yet: want the check going on, nothing rolling:\n%s", r.Table())
	}

	r, _ = Evaluate("gpu", "ns", pools, snapshot(nodestate.UpgradeDone))
	table := r.Table()
	if !r.Passed() || !r.Settled() || r.Summary[Rolling] != 2 || r.Verdict() != "passed, driver rollout rolling on" {
		t.Fatalf("canary validated: want passed with b and c rolling:\n%s", table)
	}
	for _, want := range []string{"(1 ready, 0 waiting, 0 failed, 2 rolling)",
		"b driver rolling: rolling, bounded: node is upgrade-required; pool default's canary (a) validated the new driver, at most 2 of its nodes out at once",
		"c driver rolling: rolling, bounded: node is drain-required"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}

	failed := snapshot(nodestate.UpgradeFailed)
	failed.Nodes[0].Annotations[nodestate.UpgradeReasonAnnotation] = "no operator-validator pod on the node became Ready"
	r, _ = Evaluate("gpu", "ns", pools, failed)
	if r.Passed() || !r.Settled() || r.Summary[Rolling] != 0 {
		t.Fatalf("failed canary: want the release failed, nothing rolling:\n%s", r.Table())
	}

	// a canary that went back to its old driver by itself (upgrade-done again, Ready) fails the release at once,
	// saying so; nothing of its pool rolls
	reverted := snapshot(nodestate.UpgradeDone)
	reverted.Nodes[0].Labels[nodestate.RevertLabel] = "111111111111"
	reverted.Nodes[0].Annotations[nodestate.RevertedAnnotation] = `{"from":"2222222222222222","to":"1111111111111111","daemonSet":"nvidia-driver-revert","reason":"no operator-validator pod on the node became Ready","at":"2026-12-01T00:10:00Z"}`
	r, _ = Evaluate("gpu", "ns", pools, reverted)
	if r.Passed() || !r.Settled() || r.Summary[Rolling] != 0 || !slices.Equal(r.FailedUpgrades, []string{"a"}) ||
		!strings.Contains(r.Table(), "a driver failed: driver upgrade failed and reverted: driver config 222222222222 failed validation (no operator-validator pod on the node became Ready); back on 111111111111") {
		t.Fatalf("reverted canary: want the release failed on it, nothing rolling (failed %v):\n%s", r.FailedUpgrades, r.Table())
	}

	// a pool without a canary is waited for whole
	noCanary := snapshot(nodestate.UpgradeDone)
	bare := canary.Mark{Pool: "default", Plan: "2026-12-01T00:00:00Z", Seq: 4, Canary: map[string]string{}, MaxUnavailable: 2}.Format()
	for _, n := range noCanary.Nodes {
		n.Annotations[canary.MarkAnnotation] = bare
	}
	r, _ = Evaluate("gpu", "ns", pools, noCanary)
	if r.Passed() || r.Summary[Rolling] != 0 || r.Summary[Waiting] != 2 {
		t.Fatalf("no canary: want b and c waited for:\n%s", r.Table())
	}
}
