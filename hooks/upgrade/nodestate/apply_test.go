package nodestate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry/apiretrytest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate/nodestatetest"
)

var nodesGR = schema.GroupResource{Resource: "nodes"}

// transient are the errors a client sees while the API server or etcd restarts, throttles or drops connections.
var transient = func() map[string]error {
	errs := apiretrytest.Transient()
	errs["429"] = apierrors.NewTooManyRequests("slow down", 1)
	return errs
}()

func node(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: labels}}
}

// failFirst makes the first n requests of verb on nodes fail with err.
func failFirst(c *fake.Clientset, verb string, n int, err error) *int {
	calls := 0
	c.PrependReactor(verb, "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if calls++; calls <= n {
			return true, nil, err
		}
		return false, nil, nil
	})
	return &calls
}

func TestApplyRetriesTransientErrors(t *testing.T) {
	for name, terr := range transient {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(node(nil))
			failFirst(c, "patch", 5, terr)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p := nodestate.Cordon(node(nil), "driver-upgrade")
			n, err := nodestate.Apply(ctx, c, "gpu-1", p)
			if err != nil {
				t.Fatalf("Apply after 5 × %s: %v", name, err)
			}
			if !n.Spec.Unschedulable {
				t.Fatal("not cordoned")
			}
		})
	}
}

func TestApplyFailsAtOnceOnALastingError(t *testing.T) {
	c := fake.NewClientset(node(nil))
	calls := failFirst(c, "patch", 100, apierrors.NewForbidden(nodesGR, "gpu-1", errors.New("not this node")))
	_, err := nodestate.Apply(context.Background(), c, "gpu-1", nodestate.Cordon(node(nil), "x"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not this node") || *calls != 1 {
		t.Fatalf("err = %v after %d calls; want the Forbidden at once", err, *calls)
	}
}

func TestApplyGivesUpAtTheDeadlineWithTheLastError(t *testing.T) {
	c := fake.NewClientset(node(nil))
	failFirst(c, "patch", 1000, apierrors.NewInternalError(errors.New("etcdserver: request timed out")))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := nodestate.Apply(ctx, c, "gpu-1", nodestate.Cordon(node(nil), "x"))
	if err == nil || !strings.Contains(err.Error(), "etcdserver: request timed out") || !apierrors.IsInternalError(err) {
		t.Fatalf("err = %v; want the last server error, not a bare deadline", err)
	}
}

// The resourceVersion check of the fake (nodestatetest.Versioned) is what the tests below rely on: a write with a
// stale version is refused, as the API server refuses it.
func TestVersionedFakeRefusesAStaleWrite(t *testing.T) {
	c := fake.NewClientset(node(nil))
	nodestatetest.Versioned(c)
	n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if err != nil || n.ResourceVersion == "" {
		t.Fatalf("node %v, err %v: no resourceVersion", n, err)
	}
	stale := n.DeepCopy()
	n.Labels = map[string]string{"a": "1"}
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stale.Labels = map[string]string{"a": "2"}
	if _, err := c.CoreV1().Nodes().Update(context.Background(), stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale update: err = %v, want Conflict", err)
	}
}

// An admin sets a gpu.deploy switch to false between the read a pause is computed from and its write: the write
// is refused, the pause is computed again from the admin's node, and the admin's value survives, unrecorded (a
// resume leaves it).
func TestUpdateRecomputesOnConflictAndKeepsTheAdminsChange(t *testing.T) {
	dcgm := nodestate.DeployLabelPrefix + "dcgm-exporter"
	plugin := nodestate.DeployLabelPrefix + "device-plugin"
	c := fake.NewClientset(node(map[string]string{dcgm: "true", plugin: "true"}))
	v := nodestatetest.Versioned(c)
	computed := 0
	n, err := nodestate.Update(context.Background(), c, "gpu-1", func(n *corev1.Node) (nodestate.Patch, error) {
		if computed++; computed == 1 {
			// the admin's change lands after this read
			if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels[dcgm] = "false" }); err != nil {
				t.Fatal(err)
			}
		}
		return nodestate.Pause(n, []string{"dcgm-exporter", "device-plugin"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if computed != 2 || v.Conflicts != 1 {
		t.Fatalf("computed %d times, %d conflicts; want a conflict and one recompute", computed, v.Conflicts)
	}
	if n.Labels[dcgm] != "false" || n.Labels[plugin] != nodestate.Paused {
		t.Fatalf("labels %v; want the admin's false kept and the device plugin paused", n.Labels)
	}
	n, err = nodestate.Update(context.Background(), c, "gpu-1", nodestate.Resume)
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels[dcgm] != "false" || n.Labels[plugin] != "true" {
		t.Fatalf("after resume: labels %v; want dcgm-exporter=false (the admin's), device-plugin=true", n.Labels)
	}
	if _, ok := n.Annotations[nodestate.PausedLabelsAnnotation]; ok {
		t.Fatal("pause record left")
	}
}

func TestUpdateRetriesTransientReadsAndWrites(t *testing.T) {
	c := fake.NewClientset(node(nil))
	nodestatetest.Versioned(c)
	failFirst(c, "get", 2, transient["503"])
	failFirst(c, "patch", 2, transient["connection reset"])
	n, err := nodestate.Update(context.Background(), c, "gpu-1", func(n *corev1.Node) (nodestate.Patch, error) {
		return nodestate.Cordon(n, "x"), nil
	})
	if err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node %v, err %v; want cordoned after the retries", n, err)
	}
}

func TestUpdateFailsAtOnceWhenComputeFails(t *testing.T) {
	c := fake.NewClientset(node(nil))
	calls := 0
	_, err := nodestate.Update(context.Background(), c, "gpu-1", func(*corev1.Node) (nodestate.Patch, error) {
		calls++
		return nodestate.Patch{}, errors.New("malformed record")
	})
	if err == nil || !strings.Contains(err.Error(), "malformed record") || calls != 1 {
		t.Fatalf("err = %v after %d computes", err, calls)
	}
}

// countVerbs counts the requests of each verb on nodes.
func countVerbs(c *fake.Clientset) map[string]int {
	calls := map[string]int{}
	c.PrependReactor("*", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		calls[a.GetVerb()]++
		return false, nil, nil
	})
	return calls
}

// A node nobody wrote since the caller's last read takes the change in one request, with that read's version.
func TestUpdateFromAnUnchangedNodeSendsOnlyThePatch(t *testing.T) {
	c := fake.NewClientset(node(nil))
	nodestatetest.Versioned(c)
	known, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	calls := countVerbs(c)
	n, err := nodestate.UpdateFrom(context.Background(), c, "gpu-1", known, func(n *corev1.Node) (nodestate.Patch, error) {
		return nodestate.Cordon(n, "x"), nil
	})
	if err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node %v, err %v; want cordoned", n, err)
	}
	if calls["get"] != 0 || calls["patch"] != 1 {
		t.Fatalf("requests %v; want the patch alone", calls)
	}
}

// The admin's change lands after the caller's last read: the patch computed from that read is refused, and the
// change is computed again from the node as the admin left it, their switch kept.
func TestUpdateFromAStaleNodeRecomputesFromAFreshRead(t *testing.T) {
	dcgm := nodestate.DeployLabelPrefix + "dcgm-exporter"
	plugin := nodestate.DeployLabelPrefix + "device-plugin"
	c := fake.NewClientset(node(map[string]string{dcgm: "true", plugin: "true"}))
	v := nodestatetest.Versioned(c)
	known, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels[dcgm] = "false" }); err != nil {
		t.Fatal(err)
	}
	n, err := nodestate.UpdateFrom(context.Background(), c, "gpu-1", known, func(n *corev1.Node) (nodestate.Patch, error) {
		return nodestate.Pause(n, []string{"dcgm-exporter", "device-plugin"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if v.Conflicts != 1 || n.Labels[dcgm] != "false" || n.Labels[plugin] != nodestate.Paused {
		t.Fatalf("%d conflicts, labels %v; want the stale patch refused, the admin's false kept, the device plugin paused", v.Conflicts, n.Labels)
	}
	if record := n.Annotations[nodestate.PausedLabelsAnnotation]; strings.Contains(record, dcgm) {
		t.Fatalf("pause record %s names the switch the admin set", record)
	}
}

// Nothing to write, as far as the caller's last read shows, is only believed from a fresh read: the admin may have
// changed what the change is about since.
func TestUpdateFromConfirmsAnEmptyPatchOnAFreshRead(t *testing.T) {
	c := fake.NewClientset(node(map[string]string{"a": "1"}))
	v := nodestatetest.Versioned(c)
	known, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels["a"] = "2" }); err != nil {
		t.Fatal(err)
	}
	// puts label a back to 1: nothing to do on the node the caller knows
	n, err := nodestate.UpdateFrom(context.Background(), c, "gpu-1", known, func(n *corev1.Node) (nodestate.Patch, error) {
		if n.Labels["a"] == "1" {
			return nodestate.Patch{}, nil
		}
		return nodestate.Cordon(n, "a changed"), nil
	})
	if err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node %v, err %v; want the change computed from the fresh read (cordoned)", n, err)
	}
}
