package gitops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// The Argo CD Application of these tests: its name is the Helm release name Argo CD renders with, and its
// destination namespace the release namespace. Both differ from the other tests' so nothing is shared.
const (
	argoApp       = "gpu-stack"
	argoNamespace = "gpu-stack-argocd"
)

// Argo CD's sync phases, in the order it runs them.
const (
	preSync  = "PreSync"
	syncNow  = "Sync"
	postSync = "PostSync"
)

var phaseOrder = map[string]int{preSync: -1, syncNow: 0, postSync: 1}

// kindOrder is the order Argo CD (gitops-engine's sync tasks, after Helm's kind sorter) applies kinds in within one
// phase and wave; a kind not listed goes last.
var kindOrder = func() map[string]int {
	kinds := []string{"Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
		"PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
		"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
		"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
		"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
		"Ingress", "APIService"}
	m := map[string]int{}
	for i, k := range kinds {
		m[k] = i - len(kinds) // below zero, so unlisted kinds (zero) sort last
	}
	return m
}()

// Annotations Argo CD reads.
const (
	argoHookAnnotation     = "argocd.argoproj.io/hook"
	argoWaveAnnotation     = "argocd.argoproj.io/sync-wave"
	argoTrackingAnnotation = "argocd.argoproj.io/tracking-id"
	helmHookAnnotation     = "helm.sh/hook"
	helmWeightAnnotation   = "helm.sh/hook-weight"
	helmDeleteAnnotation   = "helm.sh/hook-delete-policy"
)

// TestArgoCDSyncSequence drives Argo CD's sync of the chart step by step against the local API server, with the
// hook Jobs' real `kube-gpu-stack` commands run by the kubelet stand-in: render as `helm template`, PreSync hooks
// (Helm's pre-upgrade, on every sync), server-side apply of every other object as "argocd-controller" in Argo CD's
// kind order, wait for health, PostSync hooks (the validation gate). It proves that the first sync's pre-upgrade
// plan succeeds and touches no node, that a second sync with the same values changes no object, that a driver
// change is planned, marked and rolled, and that the pre-delete cleanup leaves the nodes as they were.
func TestArgoCDSyncSequence(t *testing.T) {
	removeNFDCRDs(t, dynamicCRDs(t)) // a new cluster: the first sync brings the NFD CRDs
	nodes := addArgoNodes(t)
	// the driver manager and upgrade gate run for every driver pod: the driver upgrade sync's PostSync gate passes
	// only once every node the plan marked reached upgrade-done
	for _, n := range nodes {
		if !strings.HasSuffix(n, "cpu-only") {
			stand.SetDriverHost(n, kubelet.DriverHost{Fixture: kmodtest.New(t)})
		}
	}
	app := newArgoSync(t)
	t.Cleanup(func() { app.deleteAll(t) })
	profile := []string{chartrender.RepoRoot() + "/values/container-only.yaml"}
	// With namespace.create the Namespace is one of the Application's objects, as with Argo CD's CreateNamespace.
	set := []string{"namespace.create=true"}
	initial, err := cluster.SnapshotNodes(t.Context(), kube.Client)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("no Argo CD hook annotations", func(t *testing.T) {
		// One argocd.argoproj.io/hook annotation would make Argo CD ignore that object's Helm hook annotations.
		for _, o := range argoRender(t, profile, set) {
			u := o.unstructured(t)
			if v, ok := u.GetAnnotations()[argoHookAnnotation]; ok {
				t.Errorf("%s %s (%s) has %s=%q", o.gvk.Kind, o.name, o.source, argoHookAnnotation, v)
			}
		}
	})

	var firstGate types.UID
	var firstPreUpgrade types.UID
	t.Run("first sync", func(t *testing.T) {
		start := time.Now()
		rep := app.sync(t, argoRender(t, profile, set), func(phase string) {
			if phase == preSync {
				after, err := cluster.SnapshotNodes(t.Context(), kube.Client)
				if err != nil {
					t.Fatal(err)
				}
				if changes := cluster.NodeChanges(initial, after); changes != "" {
					t.Errorf("the PreSync pre-upgrade hook changed nodes on the first sync:\n%s", changes)
				}
			}
		})
		t.Logf("first sync in %s:\n%s", time.Since(start).Round(time.Millisecond), strings.Join(rep.steps, "\n"))
		run := lastHookRun(t, "pre-upgrade", start)
		if run.ExitCode != 0 || !strings.Contains(run.Output, "nothing to do") {
			t.Errorf("the first sync's pre-upgrade hook (exit %d) did not find nothing to do:\n%s", run.ExitCode, run.Output)
		}
		if gate := lastHookRun(t, "validation-gate", start); gate.ExitCode != 0 {
			t.Errorf("the PostSync gate failed (exit %d):\n%s", gate.ExitCode, gate.Output)
		}
		// Helm's test hook and pre-delete hooks have no sync phase: Argo CD leaves them out of every sync.
		for _, want := range []string{"Pod/kube-gpu-stack-validation-test", "Job/kube-gpu-stack-cleanup"} {
			if !slices.Contains(rep.ignored, want) {
				t.Errorf("%s was not left out of the sync; left out: %v", want, rep.ignored)
			}
		}
		if len(rep.applied) == 0 || !slices.ContainsFunc(rep.applied, func(o renderedObject) bool { return o.gvk.Kind == "DaemonSet" }) {
			t.Fatalf("the sync applied no DaemonSet: %d objects", len(rep.applied))
		}
		firstPreUpgrade, firstGate = rep.hookUIDs["Job/kube-gpu-stack-pre-upgrade"], rep.hookUIDs["Job/kube-gpu-stack-validation-gate"]
	})
	if t.Failed() {
		return
	}

	// The first sync created the NodeFeatureRule as a PostSync hook (its CRD came in the same sync); from the next
	// sync on the cluster serves its API, so it is an ordinary object Argo CD applies in place: never deleted (NFD
	// would drop nvidia.com/gpu.present from every node, and the DaemonSet controller delete every operand pod).
	t.Run("NodeFeatureRule kept across syncs", func(t *testing.T) {
		first, _ := ruleUID(t)
		events := watchRule(t)
		for i := range 2 {
			rep := app.sync(t, argoRender(t, profile, set), nil)
			if _, hook := rep.hookUIDs["NodeFeatureRule/"+ruleName]; hook || !slices.ContainsFunc(rep.applied, func(o renderedObject) bool { return o.name == ruleName }) {
				t.Errorf("sync %d: the rule is not an ordinary Sync-phase object", i+2)
			}
			if uid, _ := ruleUID(t); uid != first {
				t.Errorf("sync %d: rule uid %s, want the first sync's %s", i+2, uid, first)
			}
		}
		if got := events.stop(); slices.Contains(got, watch.Deleted) {
			t.Errorf("the rule was deleted during the syncs: watch events %v", got)
		}
		for _, n := range nodes {
			node, err := kube.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(n, "cpu-only") && node.Labels["nvidia.com/gpu.present"] != "true" {
				t.Errorf("node %s lost nvidia.com/gpu.present", n)
			}
		}
	})

	t.Run("second sync changes nothing", func(t *testing.T) {
		objs := argoRender(t, profile, set)
		before := app.liveVersions(t)
		start := time.Now()
		rep := app.sync(t, objs, nil)
		took := time.Since(start)
		after := app.liveVersions(t)
		for _, id := range slices.Sorted(maps.Keys(before)) {
			if before[id] != after[id] {
				t.Errorf("%s moved on a no-op sync: %s -> %s", id, before[id], after[id])
			}
		}
		if len(before) != len(rep.applied) || len(after) != len(before) {
			t.Errorf("compared %d live objects before and %d after, applied %d", len(before), len(after), len(rep.applied))
		}
		run := lastHookRun(t, "pre-upgrade", start)
		if run.ExitCode != 0 || !strings.Contains(run.Output, "nothing to do") {
			t.Errorf("the second sync's pre-upgrade hook (exit %d) planned something:\n%s", run.ExitCode, run.Output)
		}
		// before-hook-creation: the hooks of the first sync were deleted and created again, so they ran again
		for name, first := range map[string]types.UID{"Job/kube-gpu-stack-pre-upgrade": firstPreUpgrade, "Job/kube-gpu-stack-validation-gate": firstGate} {
			if got := rep.hookUIDs[name]; got == "" || got == first {
				t.Errorf("%s was not re-created (uid %s, first sync %s)", name, got, first)
			}
		}
		t.Logf("no-op second sync of %d objects (%d hooks) in %s; no generation or resourceVersion moved",
			len(rep.applied), len(rep.hookUIDs), took.Round(time.Millisecond))
	})

	t.Run("driver upgrade sync", func(t *testing.T) {
		const tag = "600.10.01"
		objs := argoRender(t, profile, append(slices.Clone(set), "driver.image.tag="+tag))
		driversBefore := app.driverGenerations(t)
		if len(driversBefore) == 0 {
			t.Fatal("no driver DaemonSet before the upgrade")
		}
		start := time.Now()
		var marked []string
		rep := app.sync(t, objs, func(phase string) {
			if phase != preSync {
				return
			}
			// after PreSync, before the new DaemonSets are applied: the plan has marked every GPU node
			for _, n := range nodes {
				node, err := kube.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if node.Labels["nvidia.com/gpu.present"] == "true" {
					if got := node.Labels["nvidia.com/gpu-driver-upgrade-state"]; got != "upgrade-required" {
						t.Errorf("node %s: upgrade state %q after PreSync, want upgrade-required", n, got)
					}
					marked = append(marked, n)
				}
			}
		})
		t.Logf("driver upgrade sync in %s:\n%s", time.Since(start).Round(time.Millisecond), strings.Join(rep.steps, "\n"))
		run := lastHookRun(t, "pre-upgrade", start)
		if run.ExitCode != 0 || !strings.Contains(run.Output, "batch 1: ") {
			t.Errorf("the pre-upgrade hook (exit %d) planned no batch:\n%s", run.ExitCode, run.Output)
		}
		if len(marked) == 0 {
			t.Error("no GPU node to mark")
		}
		driversAfter := app.driverGenerations(t)
		for name, g := range driversBefore {
			if driversAfter[name] <= g {
				t.Errorf("driver DaemonSet %s: generation %d -> %d, want it moved", name, g, driversAfter[name])
			}
		}
		// the sync ends once the pool's canary validated (the PostSync gate); the rest of the pool rolls on, bounded:
		// every GPU node then runs a driver pod of the new version
		var missing []string
		_ = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, err := kube.Client.CoreV1().Pods(argoNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=" + kubelet.DriverComponent})
			if err != nil {
				return false, nil
			}
			rolled := map[string]bool{}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return strings.Contains(c.Image, ":"+tag) }) {
					rolled[p.Spec.NodeName] = true
				}
			}
			missing = slices.DeleteFunc(slices.Clone(marked), func(n string) bool { return rolled[n] })
			return len(missing) == 0, nil
		})
		for _, n := range missing {
			t.Errorf("node %s runs no driver pod of %s 2 minutes after the sync", n, tag)
		}
		if gate := lastHookRun(t, "validation-gate", start); gate.ExitCode != 0 {
			t.Errorf("the PostSync gate failed after the driver change (exit %d):\n%s", gate.ExitCode, gate.Output)
		}
	})

	t.Run("pre-delete cleanup", func(t *testing.T) {
		start := time.Now()
		rep := app.runPhase(t, "pre-delete", argoRender(t, profile, set))
		run := lastHookRun(t, "cleanup", start)
		if run.ExitCode != 0 {
			t.Fatalf("cleanup (exit %d):\n%s", run.ExitCode, run.Output)
		}
		t.Logf("pre-delete:\n%s\n%s", strings.Join(rep.steps, "\n"), run.Output)
		app.deleteAll(t)
		after, err := cluster.SnapshotNodes(t.Context(), kube.Client)
		if err != nil {
			t.Fatal(err)
		}
		if changes := cluster.NodeChanges(initial, after); changes != "" {
			t.Errorf("the nodes are not as before the first sync:\n%s", changes)
		}
	})
}

// addArgoNodes registers two simulated GPU nodes (Ubuntu 22.04, one driver DaemonSet's worth) and a node without a
// GPU, named for this test, and removes them when it ends.
func addArgoNodes(t *testing.T) []string {
	t.Helper()
	var objs []*corev1.Node
	var names []string
	for _, n := range nodefixtures.Rollout(2) {
		n.Name = "argocd-" + n.Name
		objs = append(objs, n.Object())
		names = append(names, n.Name)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := kube.AddNodes(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range names {
			_ = kube.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	return names
}

// argoRender renders the chart as Argo CD's repo server does: `helm template` with the Application's name as
// the release name, its destination namespace, CRDs included, no cluster (lookup finds nothing) and the
// Kubernetes and API versions given as flags (the cluster's, as Argo CD passes them); hooks included, for Argo CD
// to map to its phases.
func argoRender(t *testing.T, files, set []string) []renderedObject {
	t.Helper()
	rel := renderRelease(t, argoApp, argoNamespace, true, files, set, clusterAPIVersions(t)...)
	stream := rel.Manifest
	for _, h := range rel.Hooks {
		stream += fmt.Sprintf("\n---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	return parseObjects(t, stream)
}

func (o renderedObject) unstructured(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(o.body); err != nil {
		t.Fatalf("%s: %v", o.source, err)
	}
	return &u
}

// id is how the test names an object: Kind/name.
func (o renderedObject) id() string { return o.gvk.Kind + "/" + o.name }

// argoTask is one object of a sync as Argo CD schedules it.
type argoTask struct {
	obj            renderedObject
	phase          string
	wave           int
	hook           bool
	deletePolicies []string
}

// argoTasks sorts a render into Argo CD's tasks for the phases given (a hook can be in several), as gitops-engine
// does: an argocd.argoproj.io/hook annotation decides alone; otherwise Helm's pre-install and pre-upgrade are
// PreSync, post-install and post-upgrade PostSync, and any other Helm hook (test, pre-delete, ...) has no phase and
// is left out; objects that are not hooks are the Sync phase. The wave is argocd.argoproj.io/sync-wave, else the
// Helm hook weight. Order: phase, wave, kind, name; then a Namespace moves ahead of the first object in it.
func argoTasks(t *testing.T, objs []renderedObject, phaseOf func(u *unstructured.Unstructured) []string) (tasks []argoTask, ignored []string) {
	t.Helper()
	for _, o := range objs {
		u := o.unstructured(t)
		phases := phaseOf(u)
		if len(phases) == 0 {
			ignored = append(ignored, o.id())
			continue
		}
		a := u.GetAnnotations()
		wave := 0
		if w, err := strconv.Atoi(a[argoWaveAnnotation]); err == nil {
			wave = w
		} else if w, err := strconv.Atoi(a[helmWeightAnnotation]); err == nil {
			wave = w
		}
		_, argoHook := a[argoHookAnnotation]
		_, helmHook := a[helmHookAnnotation]
		var policies []string
		for _, p := range strings.Split(a[helmDeleteAnnotation], ",") {
			if p = strings.TrimSpace(p); p != "" {
				policies = append(policies, p)
			}
		}
		if len(policies) == 0 {
			policies = []string{"before-hook-creation"} // Argo CD's default for hooks
		}
		for _, p := range phases {
			tasks = append(tasks, argoTask{obj: o, phase: p, wave: wave, hook: argoHook || helmHook, deletePolicies: policies})
		}
	}
	slices.SortStableFunc(tasks, func(a, b argoTask) int {
		if d := phaseOrder[a.phase] - phaseOrder[b.phase]; d != 0 {
			return d
		}
		if d := a.wave - b.wave; d != 0 {
			return d
		}
		if d := kindOrder[a.obj.gvk.Kind] - kindOrder[b.obj.gvk.Kind]; d != 0 {
			return d
		}
		return strings.Compare(a.obj.name, b.obj.name)
	})
	// gitops-engine's adjustDeps: a Namespace goes right before the first object in it, in that object's phase
	// and wave (so a PreSync hook in the release namespace finds it created on the first sync)
	first := map[string]int{}
	for i := 0; i < len(tasks); i++ {
		tk := tasks[i]
		if tk.obj.gvk.Kind == "Namespace" && tk.obj.gvk.Group == "" {
			if at, ok := first[tk.obj.name]; ok {
				tk.phase, tk.wave = tasks[at].phase, tasks[at].wave
				copy(tasks[at+1:i+1], tasks[at:i])
				tasks[at] = tk
				for ns, j := range first {
					if j >= at {
						first[ns] = j + 1
					}
				}
			}
			continue
		}
		if _, ok := first[tk.obj.ns]; !ok && tk.obj.ns != "" {
			first[tk.obj.ns] = i
		}
	}
	return tasks, ignored
}

// syncPhases is Argo CD's phase of an object in a sync.
func syncPhases(u *unstructured.Unstructured) []string {
	a := u.GetAnnotations()
	if v, ok := a[argoHookAnnotation]; ok {
		var out []string
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == preSync || p == syncNow || p == postSync {
				out = append(out, p)
			}
		}
		return out
	}
	v, ok := a[helmHookAnnotation]
	if !ok || v == "crd-install" {
		return []string{syncNow}
	}
	var out []string
	for _, h := range strings.Split(v, ",") {
		switch strings.TrimSpace(h) {
		case "pre-install", "pre-upgrade":
			out = append(out, preSync)
		case "post-install", "post-upgrade":
			out = append(out, postSync)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// argoSync applies an Application's objects as Argo CD's application controller does.
type argoSync struct {
	a *applier
	// applied is every object any sync or phase created, to delete at the end.
	applied map[string]renderedObject
	// current is the Sync phase's objects of the last sync.
	current []renderedObject
}

func newArgoSync(t *testing.T) *argoSync {
	return &argoSync{a: newApplier(t), applied: map[string]renderedObject{}}
}

// syncReport is what one sync did.
type syncReport struct {
	steps    []string // one line per phase and wave
	applied  []renderedObject
	ignored  []string
	hookUIDs map[string]types.UID // hook Kind/name -> the object this sync created
}

// sync runs one sync of objs: each phase's waves in order, every wave's objects applied (hooks deleted first when
// their policy is before-hook-creation) and then waited on until healthy, as Argo CD waits before the next wave
// and before PostSync. afterPhase, if set, is called after each phase.
func (s *argoSync) sync(t *testing.T, objs []renderedObject, afterPhase func(phase string)) syncReport {
	t.Helper()
	tasks, ignored := argoTasks(t, s.withNamespaces(t, objs), syncPhases)
	rep := s.run(t, tasks, afterPhase)
	rep.ignored = ignored
	s.current = rep.applied
	return rep
}

// runPhase runs the objects of one Helm hook event (pre-delete: what an admin runs before deleting the
// Application, as Argo CD does not map that Helm hook) as one phase of waves.
func (s *argoSync) runPhase(t *testing.T, event string, objs []renderedObject) syncReport {
	t.Helper()
	tasks, _ := argoTasks(t, s.withNamespaces(t, objs), func(u *unstructured.Unstructured) []string {
		if slices.Contains(strings.Split(u.GetAnnotations()[helmHookAnnotation], ","), event) {
			return []string{event}
		}
		return nil
	})
	return s.run(t, tasks, nil)
}

func (s *argoSync) run(t *testing.T, tasks []argoTask, afterPhase func(string)) syncReport {
	t.Helper()
	rep := syncReport{hookUIDs: map[string]types.UID{}}
	for i := 0; i < len(tasks); {
		j := i
		for j < len(tasks) && tasks[j].phase == tasks[i].phase && tasks[j].wave == tasks[i].wave {
			j++
		}
		wave := tasks[i:j]
		var ids []string
		for _, tk := range wave {
			if tk.hook && slices.Contains(tk.deletePolicies, "before-hook-creation") {
				s.deleteAndWait(t, tk.obj)
			}
		}
		for _, tk := range wave {
			live := s.apply(t, tk.obj)
			ids = append(ids, tk.obj.id())
			s.applied[tk.obj.gvk.String()+"/"+tk.obj.ns+"/"+tk.obj.name] = tk.obj
			if tk.hook {
				rep.hookUIDs[tk.obj.id()] = live.GetUID()
			} else {
				rep.applied = append(rep.applied, tk.obj)
			}
		}
		waveStart := time.Now()
		for _, tk := range wave {
			s.waitHealthy(t, tk.obj)
		}
		rep.steps = append(rep.steps, fmt.Sprintf("%s wave %d: %d objects, healthy in %s: %s", tasks[i].phase, tasks[i].wave,
			len(wave), time.Since(waveStart).Round(time.Millisecond), strings.Join(ids, ", ")))
		if afterPhase != nil && (j == len(tasks) || tasks[j].phase != tasks[i].phase) {
			afterPhase(tasks[i].phase)
		}
		i = j
	}
	// hook-succeeded: Argo CD deletes those hooks once the whole operation succeeded
	for _, tk := range tasks {
		if tk.hook && slices.Contains(tk.deletePolicies, "hook-succeeded") {
			s.deleteAndWait(t, tk.obj)
		}
	}
	return rep
}

// withNamespaces gives every namespaced object without a namespace the destination namespace, as Argo CD does
// before it syncs. A kind the API server does not serve yet takes its scope from a CRD of the render.
func (s *argoSync) withNamespaces(t *testing.T, objs []renderedObject) []renderedObject {
	t.Helper()
	crdScope := map[string]string{}
	for _, o := range objs {
		if o.gvk.GroupKind() == crdKind {
			u := o.unstructured(t)
			group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind")
			scope, _, _ := unstructured.NestedString(u.Object, "spec", "scope")
			crdScope[group+"/"+kind] = scope
		}
	}
	out := make([]renderedObject, 0, len(objs))
	for _, o := range objs {
		namespaced := false
		if scope, ok := crdScope[o.gvk.Group+"/"+o.gvk.Kind]; ok {
			namespaced = scope == "Namespaced"
		} else if m, err := s.a.mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version); err == nil {
			namespaced = m.Scope.Name() == meta.RESTScopeNameNamespace
		} else {
			t.Fatalf("%s (%s): %v", o.id(), o.source, err)
		}
		if namespaced && o.ns == "" {
			u := o.unstructured(t)
			u.SetNamespace(argoNamespace)
			o = s.reencode(t, o, u)
		}
		// Argo CD 3.x tracks what belongs to an Application with an annotation on every object it applies.
		u := o.unstructured(t)
		a := u.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[argoTrackingAnnotation] = fmt.Sprintf("%s:%s/%s:%s/%s", argoApp, o.gvk.Group, o.gvk.Kind, o.ns, o.name)
		u.SetAnnotations(a)
		out = append(out, s.reencode(t, o, u))
	}
	return out
}

func (s *argoSync) reencode(t *testing.T, o renderedObject, u *unstructured.Unstructured) renderedObject {
	t.Helper()
	body, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	o.body, o.fields, o.ns = body, decodeJSON(t, body), u.GetNamespace()
	return o
}

// apply server-side applies o as Argo CD's controller (field manager argocd-controller, conflicts forced) and
// requires the answer to hold every field as rendered.
func (s *argoSync) apply(t *testing.T, o renderedObject) *unstructured.Unstructured {
	t.Helper()
	res, err := s.a.resource(t.Context(), o)
	if err != nil {
		t.Fatalf("%s (%s): %v", o.id(), o.source, err)
	}
	live, err := res.Patch(t.Context(), o.name, types.ApplyPatchType, o.body, metav1.PatchOptions{FieldManager: fieldManager, Force: new(true)})
	if err != nil {
		t.Fatalf("%s (%s): server-side apply: %v", o.id(), o.source, err)
	}
	var drift []string
	diffFields(".", o.fields, live.Object, &drift)
	for _, d := range drift {
		t.Errorf("%s: %s", o.id(), d)
	}
	return live
}

// deleteAndWait deletes o if it exists and waits until it is gone.
func (s *argoSync) deleteAndWait(t *testing.T, o renderedObject) {
	t.Helper()
	res, err := s.a.resource(t.Context(), o)
	if err != nil {
		t.Fatalf("%s: %v", o.id(), err)
	}
	background := metav1.DeletePropagationBackground
	if err := res.Delete(t.Context(), o.name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete %s: %v", o.id(), err)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := res.Get(ctx, o.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("%s is not gone: %v", o.id(), err)
	}
}

// waitHealthy waits until o is healthy by Argo CD's health checks: a Job complete (failed: the sync fails), a
// DaemonSet rolled out (gitops-engine's check, after kubectl's rollout status), a CRD established; other kinds
// are healthy once applied.
func (s *argoSync) waitHealthy(t *testing.T, o renderedObject) {
	t.Helper()
	res, err := s.a.resource(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var why string
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		live, err := res.Get(ctx, o.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var healthy bool
		healthy, why, err = health(live)
		return healthy, err
	})
	if err != nil {
		t.Fatalf("%s is not healthy (%s): %v", o.id(), why, err)
	}
}

// errDegraded ends a health wait: the object failed for good.
var errDegraded = errors.New("degraded")

func health(live *unstructured.Unstructured) (healthy bool, why string, err error) {
	switch live.GroupVersionKind().GroupKind() {
	case batchv1.SchemeGroupVersion.WithKind("Job").GroupKind():
		var job batchv1.Job
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(live.Object, &job); err != nil {
			return false, "", err
		}
		for _, c := range job.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete:
				return true, "", nil
			case batchv1.JobFailed:
				return false, c.Message, fmt.Errorf("job %s failed: %s: %w", job.Name, c.Message, errDegraded)
			}
		}
		return false, "running", nil
	case appsv1.SchemeGroupVersion.WithKind("DaemonSet").GroupKind():
		var ds appsv1.DaemonSet
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(live.Object, &ds); err != nil {
			return false, "", err
		}
		st := ds.Status
		switch {
		case ds.Generation > st.ObservedGeneration:
			return false, "observed generation behind", nil
		case ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType:
			return true, "", nil
		case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
			return false, fmt.Sprintf("%d of %d updated", st.UpdatedNumberScheduled, st.DesiredNumberScheduled), nil
		case st.NumberAvailable < st.DesiredNumberScheduled:
			return false, fmt.Sprintf("%d of %d available", st.NumberAvailable, st.DesiredNumberScheduled), nil
		}
		return true, "", nil
	case crdKind:
		conds, _, _ := unstructured.NestedSlice(live.Object, "status", "conditions")
		for _, c := range conds {
			if c, _ := c.(map[string]any); c["type"] == "Established" && c["status"] == "True" {
				return true, "", nil
			}
		}
		return false, "not established", nil
	}
	return true, "", nil
}

// liveVersions is every Sync-phase object of the last sync as "generation/resourceVersion", by Kind/name.
func (s *argoSync) liveVersions(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range s.current {
		res, err := s.a.resource(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		live, err := res.Get(t.Context(), o.name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", o.id(), err)
		}
		out[o.id()] = fmt.Sprintf("generation %d, resourceVersion %s", live.GetGeneration(), live.GetResourceVersion())
	}
	return out
}

// driverGenerations is the generation of every driver DaemonSet of the Application.
func (s *argoSync) driverGenerations(t *testing.T) map[string]int64 {
	t.Helper()
	gens, err := install.DriverGenerations(t.Context(), kube.Client, argoNamespace)
	if err != nil {
		t.Fatal(err)
	}
	return gens
}

// deleteAll deletes every object the syncs created, as deleting the Application with cascade does, and waits until
// they and the namespace are gone, so later tests find the cluster as it was. The NFD CRDs go too: Argo CD does
// not read helm.sh/resource-policy.
func (s *argoSync) deleteAll(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	background := metav1.DeletePropagationBackground
	var pending []renderedObject
	for _, o := range s.applied {
		res, err := s.a.resource(ctx, o)
		if err != nil {
			continue // its kind went with its CRD
		}
		if err := res.Delete(ctx, o.name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s: %v", o.id(), err)
			continue
		}
		pending = append(pending, o)
	}
	for _, o := range pending {
		res, err := s.a.resource(ctx, o)
		if err != nil {
			continue
		}
		err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := res.Get(ctx, o.name, metav1.GetOptions{})
			return apierrors.IsNotFound(err) || meta.IsNoMatchError(err), nil
		})
		if err != nil {
			t.Errorf("%s is not gone: %v", o.id(), err)
		}
	}
	s.applied = map[string]renderedObject{}
	s.a.mapper.Reset()
}

// lastHookRun is the kubelet stand-in's last run of a hook component that started after since.
func lastHookRun(t *testing.T, component string, since time.Time) kubelet.Run {
	t.Helper()
	r, ok := stand.LastRun(component, since)
	if !ok {
		t.Fatalf("no %s hook ran since %s", component, since.Format(time.StampMilli))
	}
	return r
}
