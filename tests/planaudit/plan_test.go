package planaudit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/placementplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/draplugin"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	namespace  = "gpu-operator"
	release    = "gpu"
	workloadNS = "ml"
	// chartVersion is the release's chart version before the chart-only bump.
	chartVersion = "1.0.0"
)

// change is one row of the matrix: the values (files under testdata, --set) and chart version upgraded to.
type change struct {
	name         string
	files, set   []string
	chartVersion string
}

// what a change did, or is predicted to do
type outcome struct {
	Cordoned []string // nodes
	Evicted  []string // GPU pods, namespace/name
	Restarts []string // the release's pods deleted, namespace/name
}

func (o outcome) String() string {
	return fmt.Sprintf("cordoned %v, evicted %v, restarted %d %v", o.Cordoned, o.Evicted, len(o.Restarts), o.Restarts)
}

// TestPlanPredictsWhatHappens: for each change in the matrix, the plan's prediction per node (cordon, GPU pods
// evicted, the release's pods restarted) equals what the audit log shows the upgrade did. The matrix runs in order
// on one release, each change keeping the ones before: a chart-only bump, another operand's image, a label on every
// operand pod, a driver change of one pool, a switch of the other pool from the device plugin to DRA, and a role change
// (sandbox workloads turned on, gpu-04 labelled vm-passthrough since the start).
func TestPlanPredictsWhatHappens(t *testing.T) {
	ctx := t.Context()
	for _, n := range gpuNodes() {
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: kmodtest.New(t)})
	}
	if err := workloads.Deploy(ctx, kube.Client, workloadNS, gpuNodes()); err != nil {
		t.Fatal(err)
	}
	// the DRA kubelet plugin, once a pool switches to DRA: its slices, which the post-upgrade gate waits for
	pluginErrs := make(chan error, 16)
	go draplugin.Play(ctx, kube.Client, namespace, pluginErrs)
	base := []string{"driver.upgradePolicy.maxUnavailable=100%", "driver.upgradePolicy.canary=0", "driver.upgradePolicy.maxFailures=0",
		"driver.manager.gpuPodDeletion.timeoutSeconds=10", "hooks.preUpgrade.force=true"}
	start := change{name: "install", files: []string{"pools.yaml"}, set: base, chartVersion: chartVersion}
	if _, err := target(start).Install(ctx, valueFiles(start), start.set...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target(start).Uninstall(); err != nil {
			t.Error(err)
		}
	})
	settle(t)

	// each change keeps the ones before it
	image := append(slices.Clone(base), "devicePlugin.image.tag=v0.20.1")
	label := append(slices.Clone(image), "global.podLabels.team=ml")
	matrix := []change{
		{name: "chart-only bump", files: []string{"pools.yaml"}, set: base, chartVersion: "1.0.1"},
		{name: "another operand's image", files: []string{"pools.yaml"}, set: image, chartVersion: "1.0.1"},
		{name: "a label change", files: []string{"pools.yaml"}, set: label, chartVersion: "1.0.1"},
		{name: "driver change of one pool", files: []string{"pool-a-new-driver.yaml"}, set: label, chartVersion: "1.0.1"},
		{name: "DRA switch of one pool", files: []string{"pool-b-dra.yaml"}, set: label, chartVersion: "1.0.1"},
		{name: "a role change", files: []string{"pool-b-dra.yaml"}, set: append(slices.Clone(label), "global.sandboxWorkloads.enabled=true"), chartVersion: "1.0.1"},
	}
	var report []string
	for _, c := range matrix {
		predicted := plan(t, c)
		before := releasePods(t)
		from := time.Now()
		if _, err := target(c).Upgrade(ctx, valueFiles(c), c.set...); err != nil {
			t.Fatalf("%s: helm upgrade: %v", c.name, err)
		}
		settle(t)
		happened := audited(t, from, before)
		report = append(report, fmt.Sprintf("%-26s predicted: %s\n%-26s happened:  %s", c.name, predicted, "", happened))
		if !equal(predicted, happened) {
			t.Errorf("%s: the plan said %s; the audit log shows %s", c.name, predicted, happened)
		}
	}
	t.Logf("the matrix:\n%s", strings.Join(report, "\n"))
}

func gpuNodes() []string {
	var out []string
	for _, n := range nodes {
		if _, ok := n.Status.Capacity["nvidia.com/gpu"]; ok {
			out = append(out, n.Name)
		}
	}
	return out
}

func target(c change) install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: 3 * time.Minute,
		Released: true, ChartVersion: c.chartVersion}
}

func valueFiles(c change) []string {
	out := []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
	for _, f := range c.files {
		out = append(out, filepath.Join("testdata", f))
	}
	return out
}

// plan runs `kube-gpu-stack plan` for c on the live cluster and sums its rows.
func plan(t *testing.T, c change) outcome {
	t.Helper()
	o := placementplan.Options{RenderOptions: placementplan.RenderOptions{ChartDir: chartrender.ChartDir(), ValueFiles: valueFiles(c),
		Set: c.set, Release: release, Namespace: namespace, ChartVersion: c.chartVersion}, Client: kube.Client, Output: "json"}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := placementplan.Run(t.Context(), o, &out)
	if err != nil {
		t.Fatalf("%s: plan: %v", c.name, err)
	}
	var got outcome
	for _, n := range p.Nodes {
		if n.Cordon == placementplan.CordonYes {
			got.Cordoned = append(got.Cordoned, n.Name)
		}
		for _, e := range n.Evicts {
			got.Evicted = append(got.Evicted, e.Pod)
		}
		got.Restarts = append(got.Restarts, n.Restarts...)
	}
	if len(got.Cordoned) != p.Totals.Cordons || len(got.Evicted) != p.Totals.Evictions || len(got.Restarts) != p.Totals.Restarts {
		t.Errorf("%s: totals %+v do not add up the rows (%s)", c.name, p.Totals, got)
	}
	return sorted(got)
}

// releasePods are the release's pods running before a change (namespace/name).
func releasePods(t *testing.T) map[string]bool {
	t.Helper()
	list, err := kube.Client.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
			out[p.Namespace+"/"+p.Name] = true
		}
	}
	return out
}

// settle waits until every DaemonSet of the release runs its current template on every node it selects (an OnDelete
// one: its pods, whatever their template), Ready,
// no pod of the release is terminating, and no GPU node is in a driver change.
func settle(t *testing.T) {
	t.Helper()
	var why string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		dss, err := kube.Client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, ds := range dss.Items {
			s := ds.Status
			// an OnDelete DaemonSet (the driver's) replaces a pod only for a driver change: a label-only template
			// change leaves its pods as they are
			rolled := s.UpdatedNumberScheduled == s.DesiredNumberScheduled || ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType
			if s.ObservedGeneration != ds.Generation || !rolled || s.NumberAvailable != s.DesiredNumberScheduled {
				why = fmt.Sprintf("DaemonSet %s: %+v", ds.Name, s)
				return false, nil
			}
		}
		pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				why = "pod " + p.Name + " terminating"
				return false, nil
			}
		}
		for _, n := range gpuNodes() {
			node, err := kube.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if st := node.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) || node.Spec.Unschedulable {
				why = fmt.Sprintf("node %s: %s, unschedulable %v", n, st, node.Spec.Unschedulable)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("not settled: %s", why)
	}
}

// audited reads from the audit log what happened since from: nodes patched or updated to unschedulable, pods
// evicted outside the release (GPU workloads), and the release's pods that ran before (before) deleted or evicted.
func audited(t *testing.T, from time.Time, before map[string]bool) outcome {
	t.Helper()
	reqs, err := apiload.Read(auditLog)
	if err != nil {
		t.Fatal(err)
	}
	cordoned, evicted, restarted := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, r := range reqs {
		if r.At.Before(from) || r.Stage != "ResponseComplete" || r.Code >= 300 || r.Code == 0 {
			continue
		}
		pod := r.Namespace + "/" + r.Name
		switch {
		case r.Resource == "nodes" && r.Subresource == "" && (r.Verb == "patch" || r.Verb == "update") && cordons(r.Body):
			cordoned[r.Name] = true
		case r.Resource == "pods" && r.Subresource == "eviction" && r.Verb == "create" && !before[pod]:
			evicted[pod] = true
		case r.Resource == "pods" && r.Subresource == "" && r.Verb == "delete" && before[pod],
			r.Resource == "pods" && r.Subresource == "eviction" && r.Verb == "create" && before[pod]:
			restarted[pod] = true
		}
	}
	return sorted(outcome{Cordoned: slices.Collect(maps.Keys(cordoned)), Evicted: slices.Collect(maps.Keys(evicted)),
		Restarts: slices.Collect(maps.Keys(restarted))})
}

// cordons says whether a node patch or update sets spec.unschedulable true.
func cordons(body json.RawMessage) bool {
	var obj struct {
		Spec struct {
			Unschedulable *bool `json:"unschedulable"`
		} `json:"spec"`
	}
	return json.Unmarshal(body, &obj) == nil && obj.Spec.Unschedulable != nil && *obj.Spec.Unschedulable
}

func sorted(o outcome) outcome {
	for _, s := range []*[]string{&o.Cordoned, &o.Evicted, &o.Restarts} {
		slices.Sort(*s)
		if *s == nil {
			*s = []string{}
		}
	}
	return o
}

func equal(a, b outcome) bool {
	return slices.Equal(a.Cordoned, b.Cordoned) && slices.Equal(a.Evicted, b.Evicted) && slices.Equal(a.Restarts, b.Restarts)
}
