package gitops

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

const (
	// The Flux test's release and namespace, apart from every other test's.
	fluxRelease   = "flux"
	fluxNamespace = "gpu-flux"
	// fluxGPUNodes is the size of the test's driver pool; with maxUnavailable 1 its rollout takes one node at a
	// time, so kstatus has an upgrade in progress to see.
	fluxGPUNodes = 3
	// fluxDriverTag is the upgrade's new driver version.
	fluxDriverTag = "600.10.01"
)

var daemonSets = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}

// fluxValues are the examples' values (docs/gitops): the default profile, one driver node at a time.
func fluxValues(extra ...string) (files, set []string) {
	return []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")},
		append([]string{"driver.upgradePolicy.maxUnavailable=1"}, extra...)
}

// TestFluxInstallUpgradeReachCurrent does what Flux's helm-controller does with the examples' HelmRelease: the real
// Helm install and upgrade through the SDK, hooks included (disableWait: the post-install/post-upgrade gate is the
// wait), then `helm test` (test.enable). Flux judges health with kstatus, so every object of the release's manifest
// must reach kstatus Current within the chart's documented bound (hooks.validation.timeoutSeconds, how long the
// gate gives the stack to work) of the action's start, after the install and after a driver upgrade. During the
// upgrade every changed driver DaemonSet must be seen InProgress — the populated one with a rollout under way, not
// only an unobserved generation — and then Current, with every driver pod on the new version.
func TestFluxInstallUpgradeReachCurrent(t *testing.T) {
	ctx := t.Context()
	gpuNodes := addFluxNodes(t)
	live := newLiveObjects(t)
	gateBound := gateTimeout(t)
	target := install.Target{Kubeconfig: kube.Kubeconfig, Release: fluxRelease, Namespace: fluxNamespace,
		Timeout: 10 * time.Minute, NoWait: true} // the examples' timeouts and disableWait
	files, set := fluxValues()
	live.clearLeftovers(t, fluxRender(t, files, set))
	t.Cleanup(func() {
		if err := target.Uninstall(); err != nil {
			t.Logf("cleanup: %v", err)
		}
		_ = kube.Client.CoreV1().Namespaces().Delete(context.Background(), fluxNamespace, metav1.DeleteOptions{})
	})

	start := time.Now()
	rel, err := target.Install(ctx, files, set...)
	if err != nil {
		t.Fatal(err)
	}
	installed := time.Since(start)
	objects := parseObjects(t, rel.Manifest)
	current := live.waitCurrent(t, objects, start, gateBound)
	t.Logf("install: helm (hooks, gate) %s; all %d objects of the manifest kstatus Current %s after the start (bound %s)",
		installed.Round(100*time.Millisecond), len(objects), current.Round(100*time.Millisecond), gateBound)

	rec := live.recordDaemonSets(t)
	start = time.Now()
	files, set = fluxValues("driver.image.tag=" + fluxDriverTag)
	rel, err = target.Upgrade(ctx, files, set...)
	if err != nil {
		rec.stop()
		t.Fatal(err)
	}
	upgraded := time.Since(start)
	objects = parseObjects(t, rel.Manifest)
	current = live.waitCurrent(t, objects, start, gateBound)
	samples := rec.stop()
	t.Logf("driver upgrade: helm (pre-upgrade plan, gate) %s; all %d objects kstatus Current %s after the start (bound %s)",
		upgraded.Round(100*time.Millisecond), len(objects), current.Round(100*time.Millisecond), gateBound)

	t.Run("driver DaemonSets pass through InProgress to Current", func(t *testing.T) {
		drivers := driverDaemonSets(objects)
		if len(drivers) == 0 {
			t.Fatal("the release renders no driver DaemonSet")
		}
		var rolled bool
		for _, name := range drivers {
			seen := samples[name]
			t.Logf("%s: %s", name, describeSamples(seen, start))
			if !slices.ContainsFunc(seen, func(s kstatusSample) bool { return s.status == status.InProgressStatus }) {
				t.Errorf("%s was never InProgress during the upgrade", name)
			}
			if len(seen) == 0 || seen[len(seen)-1].status != status.CurrentStatus {
				t.Errorf("%s did not end Current", name)
			}
			rolled = rolled || slices.ContainsFunc(seen, func(s kstatusSample) bool {
				return s.status == status.InProgressStatus && strings.HasPrefix(s.message, "Updated: ") && !strings.HasPrefix(s.message, fmt.Sprintf("Updated: %d/", fluxGPUNodes))
			})
		}
		if !rolled {
			t.Error("no driver DaemonSet was seen InProgress with its rolling update under way (Updated: k/n, k < n)")
		}
	})

	t.Run("every GPU node runs the new driver", func(t *testing.T) {
		pods, err := kube.Client.CoreV1().Pods(fluxNamespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=" + kubelet.DriverComponent})
		if err != nil {
			t.Fatal(err)
		}
		onNew := map[string]bool{}
		for _, p := range pods.Items {
			for _, c := range p.Spec.Containers {
				if p.DeletionTimestamp == nil && strings.Contains(c.Image, "/driver:"+fluxDriverTag+"-") {
					onNew[p.Spec.NodeName] = true
				}
			}
		}
		for _, n := range gpuNodes {
			if !onNew[n] {
				t.Errorf("node %s has no driver pod on %s", n, fluxDriverTag)
			}
		}
	})

	t.Run("helm test passes", func(t *testing.T) {
		start := time.Now()
		if _, err := target.Test(); err != nil {
			t.Fatal(err)
		}
		t.Logf("helm test in %s", time.Since(start).Round(100*time.Millisecond))
	})
}

// gateTimeout is the chart's hooks.validation.timeoutSeconds: how long the stack has, after an install or upgrade,
// to work on every node before the release fails.
func gateTimeout(t *testing.T) time.Duration {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := chartutil.Values(chrt.Values).PathValue("hooks.validation.timeoutSeconds")
	if err != nil {
		t.Fatal(err)
	}
	seconds, ok := v.(float64)
	if !ok {
		t.Fatalf("hooks.validation.timeoutSeconds is %T %v", v, v)
	}
	return time.Duration(seconds) * time.Second
}

// addFluxNodes registers simulated GPU nodes (Ubuntu 22.04, one driver DaemonSet's worth), each with a fixture
// host on which the kubelet stand-in runs the real driver manager and upgrade gate, and a node without a GPU; all
// named for this test and removed when it ends. It returns the GPU nodes' names.
func addFluxNodes(t *testing.T) []string {
	t.Helper()
	var objs []*corev1.Node
	var gpu []string
	for _, n := range nodefixtures.Rollout(fluxGPUNodes) {
		n.Name = "flux-" + n.Name
		objs = append(objs, n.Object())
		if n.GPUs > 0 {
			gpu = append(gpu, n.Name)
			stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: kmodtest.New(t)})
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := kube.AddNodes(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range objs {
			_ = kube.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})
	return gpu
}

// fluxRender renders the release as the SDK's install will, without a cluster, to learn its objects beforehand.
func fluxRender(t *testing.T, files, set []string) []renderedObject {
	t.Helper()
	return parseObjects(t, renderRelease(t, fluxRelease, fluxNamespace, false, files, set).Manifest)
}

// liveObjects reads the live state of rendered objects through the dynamic client.
type liveObjects struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newLiveObjects(t *testing.T) *liveObjects {
	t.Helper()
	dyn, mapper := dynamicClients(t)
	return &liveObjects{dyn: dyn, mapper: mapper}
}

// resource is the client for o's kind, in the release namespace when the kind is namespaced and o names none.
// Discovery is refreshed once for a kind it does not know yet (a CRD the release just created).
func (l *liveObjects) resource(o renderedObject) (dynamic.ResourceInterface, error) {
	m, err := l.mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
	if meta.IsNoMatchError(err) {
		l.mapper.Reset()
		m, err = l.mapper.RESTMapping(o.gvk.GroupKind(), o.gvk.Version)
	}
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return l.dyn.Resource(m.Resource), nil
	}
	ns := o.ns
	if ns == "" {
		ns = fluxNamespace
	}
	return l.dyn.Resource(m.Resource).Namespace(ns), nil
}

// clearLeftovers deletes objects the release is about to create that something else left behind (CRDs that
// helm.sh/resource-policy keep or another test's server-side apply left, RuntimeClasses): Helm refuses to
// install over objects without its ownership marks for this release.
func (l *liveObjects) clearLeftovers(t *testing.T, objs []renderedObject) {
	t.Helper()
	ctx := t.Context()
	for _, o := range objs {
		res, err := l.resource(o)
		if meta.IsNoMatchError(err) {
			continue // a kind nobody serves yet: nothing of it can be left
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := res.Get(ctx, o.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		a := got.GetAnnotations()
		if a["meta.helm.sh/release-name"] == fluxRelease && a["meta.helm.sh/release-namespace"] == fluxNamespace {
			continue
		}
		t.Logf("removing %s %s left by another owner", o.gvk.Kind, o.name)
		if err := res.Delete(ctx, o.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := res.Get(ctx, o.name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("%s %s was not deleted: %v", o.gvk.Kind, o.name, err)
		}
	}
	l.mapper.Reset()
}

// waitCurrent polls every object until kstatus computes Current for all of them, failing with each object that is
// not once bound has passed since the action's start; it returns when, after the start, all were Current. What the
// first poll finds behind (right after Helm returned) is logged.
func (l *liveObjects) waitCurrent(t *testing.T, objs []renderedObject, start time.Time, bound time.Duration) time.Duration {
	t.Helper()
	var behind []string
	first := true
	ctx, cancel := context.WithDeadline(t.Context(), start.Add(bound))
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		behind = behind[:0]
		for _, o := range objs {
			res, err := l.resource(o)
			if err != nil {
				return false, err
			}
			u, err := res.Get(ctx, o.name, metav1.GetOptions{})
			if err != nil {
				behind = append(behind, fmt.Sprintf("%s %s: %v", o.gvk.Kind, o.name, err))
				continue
			}
			r, err := status.Compute(u)
			if err != nil {
				return false, fmt.Errorf("kstatus of %s %s: %w", o.gvk.Kind, o.name, err)
			}
			if r.Status != status.CurrentStatus {
				behind = append(behind, fmt.Sprintf("%s %s: %s (%s)", o.gvk.Kind, o.name, r.Status, r.Message))
			}
		}
		if first && len(behind) > 0 {
			t.Logf("not Current yet when Helm returned:\n%s", strings.Join(behind, "\n"))
		}
		first = false
		return len(behind) == 0, nil
	})
	if err != nil {
		t.Fatalf("not every object reached kstatus Current within %s of the start (%v):\n%s", bound, err, strings.Join(behind, "\n"))
	}
	return time.Since(start)
}

// kstatusSample is kstatus's verdict on one observed state of an object.
type kstatusSample struct {
	at      time.Time
	status  status.Status
	message string
}

// daemonSetRecorder computes kstatus for every state of the release's DaemonSets that the API server sends.
type daemonSetRecorder struct {
	mu      sync.Mutex
	samples map[string][]kstatusSample
	w       watch.Interface
	done    chan struct{}
}

func (l *liveObjects) recordDaemonSets(t *testing.T) *daemonSetRecorder {
	t.Helper()
	w, err := l.dyn.Resource(daemonSets).Namespace(fluxNamespace).Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := &daemonSetRecorder{samples: map[string][]kstatusSample{}, w: w, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			s := kstatusSample{at: time.Now()}
			if res, err := status.Compute(u); err != nil {
				s.status, s.message = status.UnknownStatus, err.Error()
			} else {
				s.status, s.message = res.Status, res.Message
			}
			r.mu.Lock()
			r.samples[u.GetName()] = append(r.samples[u.GetName()], s)
			r.mu.Unlock()
		}
	}()
	return r
}

// stop ends the recording and returns the samples by DaemonSet.
func (r *daemonSetRecorder) stop() map[string][]kstatusSample {
	r.w.Stop()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.samples
}

// driverDaemonSets are the names of the manifest's driver DaemonSets.
func driverDaemonSets(objs []renderedObject) []string {
	var out []string
	for _, o := range objs {
		if o.gvk.Kind != "DaemonSet" {
			continue
		}
		component, _, _ := unstructured.NestedString(o.fields, "spec", "template", "metadata", "labels", kubelet.ComponentLabel)
		if component == kubelet.DriverComponent {
			out = append(out, o.name)
		}
	}
	return out
}

// describeSamples lists the distinct verdicts in order, each with its time since start.
func describeSamples(samples []kstatusSample, start time.Time) string {
	var parts []string
	last := ""
	for _, s := range samples {
		v := fmt.Sprintf("%s (%s)", s.status, s.message)
		if v != last {
			parts = append(parts, fmt.Sprintf("+%s %s", s.at.Sub(start).Round(100*time.Millisecond), v))
			last = v
		}
	}
	return strings.Join(parts, " -> ")
}
