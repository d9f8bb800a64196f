package drainbench

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// The API server refuses a merge patch whose metadata.resourceVersion is no longer the node's (409), which is
// what nodestate.Update relies on: the write computed from a read an admin's change has overtaken is refused, and
// computed again from the admin's node.
func TestNodeUpdateRecomputesOnTheServersConflict(t *testing.T) {
	const name = "update-conflict"
	addGPUNode(t, name, map[string]string{nodestate.DeployLabelPrefix + "dcgm-exporter": "true"})
	dcgm := nodestate.DeployLabelPrefix + "dcgm-exporter"
	computed := 0
	n, err := nodestate.Update(t.Context(), kube.Client, name, func(n *corev1.Node) (nodestate.Patch, error) {
		if computed++; computed == 1 {
			patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"false"}}}`, dcgm)
			if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return nodestate.Pause(n, []string{"dcgm-exporter", "device-plugin"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if computed != 2 {
		t.Fatalf("computed %d times; want the server's conflict and one recompute", computed)
	}
	if n.Labels[dcgm] != "false" || n.Labels[nodestate.DeployLabelPrefix+"device-plugin"] != nodestate.Paused {
		t.Fatalf("labels %v: want the admin's false kept and the device plugin paused", n.Labels)
	}
	// and the premise, directly: a stale resourceVersion in a merge patch is a Conflict
	stale := fmt.Appendf(nil, `{"metadata":{"resourceVersion":"1","labels":{"x":"y"}}}`)
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), name, types.MergePatchType, stale, metav1.PatchOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale patch: err = %v, want Conflict", err)
	}
}

// An admin sets an operand switch to false while the driver manager waits on a budget to evict a GPU pod: the
// pause written after the eviction keeps the admin's false, and so does the restore.
func TestAdminSwitchChangedMidEvictionSurvives(t *testing.T) {
	plugin, validator := nodestate.DeployLabelPrefix+"device-plugin", nodestate.DeployLabelPrefix+"operator-validator"
	n := newDMNode(t, "dm-admin-switch", map[string]string{plugin: "true", validator: "true"},
		podSpec{name: "held", gpu: true, labels: map[string]string{"app": "held"}})
	b := pdb(t, n.owner.Namespace, "held", 1)
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() { done <- n.options(t, &counter{}).Run(t.Context(), &out) }()
	deadline := time.Now().Add(30 * time.Second)
	for upgradeState(n.node(t)) != nodestate.PodDeletionRequired {
		if time.Now().After(deadline) {
			t.Fatalf("node never reached %s", nodestate.PodDeletionRequired)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the eviction is refused meanwhile
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"false"}}}`, plugin)
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	relax := []byte(`{"spec":{"minAvailable":0}}`)
	if _, err := kube.Client.PolicyV1().PodDisruptionBudgets(n.owner.Namespace).Patch(t.Context(), b.Name, types.MergePatchType, relax, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the driver manager did not finish after the budget was relaxed")
	}
	node := n.node(t)
	if node.Labels[plugin] != "false" || node.Labels[validator] != "true" {
		t.Fatalf("device-plugin=%q operator-validator=%q: want the admin's false kept, the validator restored", node.Labels[plugin], node.Labels[validator])
	}
	if _, ok := node.Annotations[nodestate.PausedLabelsAnnotation]; ok || upgradeState(node) != nodestate.ValidationRequired {
		t.Fatalf("state %q, annotations %v", upgradeState(node), node.Annotations)
	}
}
