package releasecleanup

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate/nodestatetest"
)

// The cleanup lists every node, then writes each: what it restores is computed from the node as it is at the
// write, so a paused switch an admin set to false after the list keeps the admin's value.
func TestCleanupKeepsAnAdminsChangeAfterTheList(t *testing.T) {
	dcgm, plugin := nodestate.DeployLabelPrefix+"dcgm-exporter", nodestate.DeployLabelPrefix+"device-plugin"
	record, _ := json.Marshal(map[string]string{dcgm: "true", plugin: "true"})
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1",
		Labels:      map[string]string{dcgm: nodestate.Paused, plugin: nodestate.Paused, nodestate.UpgradeStateLabel: "upgrade-done"},
		Annotations: map[string]string{nodestate.PausedLabelsAnnotation: string(record)}}})
	v := nodestatetest.Versioned(client)
	edited := false
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !edited {
			edited = true
			if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels[dcgm] = "false" }); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	o := Options{Client: client, Namespace: "gpu", Release: "rel"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), o, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[dcgm] != "false" || n.Labels[plugin] != "true" {
		t.Fatalf("dcgm-exporter=%q device-plugin=%q; want the admin's false kept, the device plugin restored", n.Labels[dcgm], n.Labels[plugin])
	}
	if _, ok := n.Annotations[nodestate.PausedLabelsAnnotation]; ok || n.Labels[nodestate.UpgradeStateLabel] != "" {
		t.Fatalf("the stack's marks are left: %v %v", n.Labels, n.Annotations)
	}
}

// The driver managers' per-node Leases are the stack's too: the cleanup removes them (and only them) from the
// release namespace, so `helm uninstall` leaves nothing behind.
func TestCleanupRemovesTheDriverManagersLeases(t *testing.T) {
	lease := func(ns, name string, labels map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	ours := map[string]string{nodestate.DriverManagerLeaseLabel: "true"}
	client := fake.NewClientset(
		lease("gpu", "kube-gpu-stack-driver-gpu-1", ours),
		lease("gpu", "kube-gpu-stack-driver-gone-node", ours),
		lease("gpu", "someone-elses-leader-election", nil),
		lease("other", "kube-gpu-stack-driver-gpu-1", ours), // another release's namespace
	)
	o := Options{Client: client, Namespace: "gpu", Release: "rel"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	left, err := client.CoordinationV1().Leases(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range left.Items {
		names = append(names, l.Namespace+"/"+l.Name)
	}
	slices.Sort(names)
	if want := []string{"gpu/someone-elses-leader-election", "other/kube-gpu-stack-driver-gpu-1"}; !slices.Equal(names, want) {
		t.Fatalf("leases left %v, want %v\n%s", names, want, out.String())
	}
}
