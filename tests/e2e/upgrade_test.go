package e2e

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// renderedDriverPools is the DRIVER_POOLS env the chart gives its hooks for the mixed profile.
func renderedDriverPools(t *testing.T) string {
	t.Helper()
	stream, err := chartrender.RenderRepo(t.Context(), []string{mixedProfile()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(stream, "\n---\n") {
		var job batchv1.Job
		if err := yaml.Unmarshal([]byte(doc), &job); err != nil || job.Kind != "Job" {
			continue
		}
		for _, c := range job.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.Name == "DRIVER_POOLS" {
					return e.Value
				}
			}
		}
	}
	t.Fatal("no hook Job carries DRIVER_POOLS")
	return ""
}

// TestPreUpgradeOnAnEmptyClusterChangesNothing: Argo CD runs pre-upgrade hooks as PreSync on the first sync too;
// with no release installed there is no driver to change, so the hook succeeds and touches no node.
func TestPreUpgradeOnAnEmptyClusterChangesNothing(t *testing.T) {
	e := use(t)
	before := e.snapshotNodes(t)
	var out bytes.Buffer
	cmd := stackcli.NewCommand(&out)
	cmd.SetArgs([]string{"pre-upgrade", "--kubeconfig", e.kube.Kubeconfig, "-n", e.target().Namespace, "--release", e.target().Release,
		"--driver-pools", renderedDriverPools(t)})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("pre-upgrade on an empty cluster: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "nothing to do") {
		t.Errorf("output:\n%s", out.String())
	}
	if changes := cluster.NodeChanges(before, e.snapshotNodes(t)); changes != "" {
		t.Errorf("the pre-upgrade hook changed nodes:\n%s", changes)
	}
}

// chartOnlyUpgradeTouchesNoDriver: on the installed mixed profile, a new chart version with an unrelated values
// change leaves every driver pod running (same pod, never restarted) and evicts no GPU workload.
func (e *env) chartOnlyUpgradeTouchesNoDriver(t *testing.T) {
	const node = "container-ubuntu2204"
	workload := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "training", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "c", Image: "cuda", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
	}
	w, err := e.kube.Client.CoreV1().Pods("default").Create(t.Context(), workload, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.kube.Client.CoreV1().Pods("default").Delete(t.Context(), w.Name, metav1.DeleteOptions{}) }()
	drivers := func() map[string]types.UID {
		pods, err := e.kube.Client.CoreV1().Pods(e.target().Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]types.UID{}
		for _, p := range pods.Items {
			out[p.Spec.NodeName] = p.UID
		}
		return out
	}
	generations := func() map[string]int64 {
		gens, err := install.DriverGenerations(t.Context(), e.kube.Client, e.target().Namespace)
		if err != nil {
			t.Fatal(err)
		}
		return gens
	}
	before, genBefore := drivers(), generations()
	if len(before) == 0 {
		t.Fatal("no driver pods before the upgrade")
	}
	tg := e.target()
	tg.ChartVersion = "0.0.1-next"
	start := time.Now()
	if _, err := tg.Upgrade(t.Context(), []string{mixedProfile()}, "dcgmExporter.resources.requests.cpu=50m"); err != nil {
		t.Fatal(err)
	}
	if r := e.lastRun(t, "pre-upgrade", start); r.ExitCode != 0 || !strings.Contains(r.Output, "nothing to do") {
		t.Errorf("pre-upgrade hook (exit %d) planned a driver change for a chart-only upgrade:\n%s", r.ExitCode, r.Output)
	}
	// an unchanged pod template leaves every driver DaemonSet's generation where it was: nothing to roll
	if genAfter := generations(); !maps.Equal(genBefore, genAfter) {
		t.Errorf("driver DaemonSets changed on a chart-only upgrade: generations %v -> %v", genBefore, genAfter)
	}
	time.Sleep(2 * time.Second) // a DaemonSet rollout would have started by now
	if after := drivers(); !maps.Equal(before, after) {
		t.Errorf("driver pods changed on a chart-only upgrade:\nbefore %v\nafter  %v", before, after)
	}
	if got, err := e.kube.Client.CoreV1().Pods("default").Get(t.Context(), w.Name, metav1.GetOptions{}); err != nil || got.UID != w.UID || got.DeletionTimestamp != nil {
		t.Errorf("the GPU workload did not survive the chart-only upgrade: %v", err)
	}
}

// driverVersionUpgradeIsPlannedAndMarked: on the installed mixed profile, changing the driver version makes the
// pre-upgrade hook plan every node running a driver of the changed pool, in batches of the pool's maxUnavailable,
// and mark them upgrade-required before Helm applies the new DaemonSets (the lifecycle's uninstall then clears the
// marks).
func (e *env) driverVersionUpgradeIsPlannedAndMarked(t *testing.T) {
	drivers, err := e.kube.Client.CoreV1().Pods(e.target().Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil || len(drivers.Items) == 0 {
		t.Fatalf("no driver pods: %v", err)
	}
	start := time.Now()
	// these nodes have no host, so no driver manager moves the marked nodes on: the post-upgrade gate would rightly
	// wait for them to reach upgrade-done (tests/rollout runs the whole change)
	if _, err := e.target().Upgrade(t.Context(), []string{mixedProfile()}, "driver.image.tag=600.10.01", "hooks.validation.enabled=false"); err != nil {
		t.Fatal(err)
	}
	run := e.lastRun(t, "pre-upgrade", start)
	if run.ExitCode != 0 || !strings.Contains(run.Output, "nvidia-driver-daemonset-ubuntu2204 (pool default) batch 1: ") {
		t.Fatalf("pre-upgrade (exit %d):\n%s", run.ExitCode, run.Output)
	}
	t.Logf("pre-upgrade plan:\n%s", run.Output)
	for _, p := range drivers.Items {
		n, err := e.kube.Client.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Labels["nvidia.com/gpu-driver-upgrade-state"]; got != "upgrade-required" {
			t.Errorf("node %s (driver pod %s): state %q, want upgrade-required", n.Name, p.Name, got)
		}
	}
}
