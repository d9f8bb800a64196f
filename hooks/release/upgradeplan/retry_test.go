package upgradeplan

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate/nodestatetest"
)

// `upgrade retry` decides from the node as it is when it writes: a node that left upgrade-failed after the
// command read it (its gate finished it, an admin moved it) is not sent back to upgrade-required.
func TestRetryDecidesFromTheNodeAsWritten(t *testing.T) {
	client := fake.NewClientset(readyNode("gpu-1", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)}))
	v := nodestatetest.Versioned(client)
	edited := false
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !edited {
			edited = true
			if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone) }); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	err := Retry(context.Background(), client, "gpu", "rel", "gpu-1", time.Now(), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "not upgrade-failed") {
		t.Fatalf("err = %v; want a refusal: the node is upgrade-done now", err)
	}
	n, _ := nodestate.Get(context.Background(), client, "gpu-1")
	if got := n.Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.UpgradeDone) {
		t.Fatalf("state %q; the retry clobbered upgrade-done", got)
	}
}

// `upgrade retry` of a node whose old driver pod is still there (emptying the node for the new driver failed and
// was undone: that pod serves the old driver to GPU pods) leaves the pod running, for its upgrade gate to empty
// the node again; a pod of the DaemonSet's current template (its new driver failed) is deleted to start over.
func TestRetryLeavesAnOldDriverPodServing(t *testing.T) {
	for _, tc := range []struct {
		name, pod string
		deleted   bool
	}{{"old pod", "old", false}, {"current pod", "new", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver", Namespace: "gpu", UID: "ds"},
				Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: driverPod("gpu-1", "new").Spec}}}
			pod := driverPod("gpu-1", tc.pod)
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}
			client := fake.NewClientset(readyNode("gpu-1", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)}), ds, pod)
			var out bytes.Buffer
			if err := Retry(context.Background(), client, "gpu", "rel", "gpu-1", time.Now(), &out); err != nil {
				t.Fatal(err)
			}
			_, err := client.CoreV1().Pods("gpu").Get(context.Background(), pod.Name, metav1.GetOptions{})
			if deleted := apierrors.IsNotFound(err); deleted != tc.deleted {
				t.Fatalf("driver pod deleted %v, want %v:\n%s", deleted, tc.deleted, out.String())
			}
			n, _ := nodestate.Get(context.Background(), client, "gpu-1")
			if got := n.Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.UpgradeRequired) {
				t.Fatalf("state %q, want upgrade-required", got)
			}
		})
	}
}
