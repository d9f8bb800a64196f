package rollout

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestUninstallAfterARefusedUpgradeLeavesNothing: Helm uninstalls from the last revision's manifest, and a refused
// upgrade's revision (the plan refused: a node is upgrade-failed) is the last. That revision drops operands the
// earlier one ran (the DCGM exporter, GFD): their ServiceAccounts, ConfigMaps, Services and cluster-scoped RBAC are
// in no manifest Helm deletes. Uninstall must leave nothing of the release all the same.
func TestUninstallAfterARefusedUpgradeLeavesNothing(t *testing.T) {
	ctx := t.Context()
	freshNodes(t, 0)
	if _, err := target().Install(ctx, profile(), settings()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	if left := releaseObjects(t); len(left) == 0 {
		t.Fatal("no object carries the release's label after the install: the check below would prove nothing")
	}
	failed := rollouttest.Node(t, kube.Client, rollouttest.GPUNodeNames(nodes)[0])
	failed.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeFailed)
	if failed.Annotations == nil {
		failed.Annotations = map[string]string{}
	}
	failed.Annotations[nodestate.UpgradeReasonAnnotation] = "set by the test"
	if _, err := kube.Client.CoreV1().Nodes().Update(ctx, failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := target().Upgrade(ctx, profile(), settings("dcgmExporter.enabled=false", "gfd.enabled=false")...); err == nil ||
		!strings.Contains(err.Error(), "pre-upgrade") {
		t.Fatalf("the upgrade went ahead (%v), want the plan's refusal", err)
	}
	start := time.Now()
	if err := target().Uninstall(); err != nil {
		for _, r := range stand.Runs() {
			if !r.Started.Before(start) && r.Component == "cleanup" {
				t.Logf("cleanup %s (exit %d, ended %v):\n%s", r.Pod, r.ExitCode, r.Ended, r.Output)
			}
		}
		t.Fatal(err)
	}
	if left := releaseObjects(t); len(left) > 0 {
		t.Errorf("uninstall left %d objects of the release:\n%s", len(left), strings.Join(left, "\n"))
	}
}

// releaseObjects lists every object of any listable kind that carries the release's instance label, but those the
// chart keeps on uninstall.
func releaseObjects(t *testing.T) []string {
	t.Helper()
	disco, err := discovery.NewDiscoveryClientForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disco.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		t.Fatal(err)
	}
	var out []string
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if !slices.Contains(r.Verbs, "list") || strings.Contains(r.Name, "/") || r.Kind == "Event" {
				continue
			}
			items, err := dyn.Resource(gv.WithResource(r.Name)).List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
			if err != nil {
				continue
			}
			for _, it := range items.Items {
				// the CRDs stay by design (helm.sh/resource-policy: keep: deleting one deletes every object of it)
				if it.GetDeletionTimestamp() != nil || it.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
					continue
				}
				out = append(out, r.Kind+" "+strings.TrimPrefix(it.GetNamespace()+"/", "/")+it.GetName())
			}
		}
	}
	slices.Sort(out)
	return out
}
