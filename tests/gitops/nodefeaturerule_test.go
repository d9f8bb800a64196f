package gitops

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// The chart's NodeFeatureRule: NFD labels nvidia.com/gpu.present from it, and every operand selects on that label.
var (
	ruleResource = schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeaturerules"}
	ruleName     = "nvidia-gpu-present"
)

// ruleWatch records every watch event of the rule from the moment it starts.
type ruleWatch struct {
	w      watch.Interface
	mu     sync.Mutex
	events []watch.EventType
	done   chan struct{}
}

// watchRule starts a watch on the rule (its CRD must exist) from its current state.
func watchRule(t *testing.T) *ruleWatch {
	t.Helper()
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Resource(ruleResource)
	list, err := res.List(t.Context(), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", ruleName).String()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := res.Watch(context.Background(), metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", ruleName).String(),
		ResourceVersion: list.GetResourceVersion(),
	})
	if err != nil {
		t.Fatal(err)
	}
	rw := &ruleWatch{w: w, done: make(chan struct{})}
	go func() {
		defer close(rw.done)
		for ev := range w.ResultChan() {
			rw.mu.Lock()
			rw.events = append(rw.events, ev.Type)
			rw.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return rw
}

// stop ends the watch (after a moment for events still in flight) and returns what it saw.
func (rw *ruleWatch) stop() []watch.EventType {
	time.Sleep(time.Second)
	rw.w.Stop()
	<-rw.done
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return slices.Clone(rw.events)
}

// ruleUID is the live rule's UID and whether it carries Helm hook annotations (an object created as a hook and
// adopted by a later upgrade keeps them).
func ruleUID(t *testing.T) (types.UID, bool) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	u, err := dyn.Resource(ruleResource).Get(t.Context(), ruleName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("NodeFeatureRule %s: %v", ruleName, err)
	}
	_, hook := u.GetAnnotations()["helm.sh/hook"]
	return u.GetUID(), hook
}

// clusterAPIVersions is what Argo CD passes `helm template` as --api-versions: every group/version the API server
// serves, and every group/version/Kind.
func clusterAPIVersions(t *testing.T) []string {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range lists {
		out = append(out, l.GroupVersion)
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				out = append(out, l.GroupVersion+"/"+r.Kind)
			}
		}
	}
	return out
}

// TestNodeFeatureRuleSurvivesHelmUpgrades: NFD drops nvidia.com/gpu.present from every node when the rule is
// deleted, and the DaemonSet controller then deletes every operand pod, drivers included. The first install (the
// NFD CRDs arrive in the same release) creates the rule as a post-install hook; every `helm upgrade` after it must
// keep that very object: adopted as a release object, same UID, and no DELETED watch event, and GPU nodes keep
// their label.
func TestNodeFeatureRuleSurvivesHelmUpgrades(t *testing.T) {
	crds := dynamicCRDs(t)
	removeNFDCRDs(t, crds) // the first install must bring the CRDs itself, as on a new cluster
	t.Cleanup(func() { removeNFDCRDs(t, crds) })
	nodes := addArgoNodes(t)
	target := install.Target{Kubeconfig: kube.Kubeconfig, Release: "rule-owner", Namespace: "gpu-rule-owner", Timeout: 2 * time.Minute, NoWait: true}
	values := []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
	// the rule is the only hook this test needs
	set := []string{"hooks.validation.enabled=false", "hooks.test.enabled=false", "hooks.preUpgrade.enabled=false", "hooks.cleanup.enabled=false"}
	if _, err := target.Install(t.Context(), values, set...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Uninstall() })
	first, hook := ruleUID(t)
	if !hook {
		t.Log("the CRD was served at install: the rule was a release object from the start")
	}

	events := watchRule(t)
	for i, extra := range [][]string{nil, {"driver.image.tag=600.10.01"}} {
		rel, err := target.Upgrade(t.Context(), values, append(slices.Clone(set), extra...)...)
		if err != nil {
			t.Fatalf("upgrade %d: %v", i+1, err)
		}
		if !strings.Contains(rel.Manifest, "name: "+ruleName) {
			t.Errorf("upgrade %d: the rule is not a release object (not in the release manifest)", i+1)
		}
		// Helm adopts the existing object with an empty patch, so it keeps the install hook's annotations; Helm
		// reads hooks from the rendered manifest only, where the rule is now a release object
		if uid, _ := ruleUID(t); uid != first {
			t.Errorf("upgrade %d: rule uid %s, want the first install's %s kept", i+1, uid, first)
		}
	}
	if got := events.stop(); slices.Contains(got, watch.Deleted) {
		t.Errorf("the rule was deleted during the upgrades: watch events %v", got)
	}
	for _, n := range nodes {
		node, err := kube.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Labels["nvidia.com/gpu.present"] != "true" && !strings.HasSuffix(n, "cpu-only") {
			t.Errorf("node %s lost nvidia.com/gpu.present", n)
		}
	}
}
