package drivermanager

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
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry/apiretrytest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate/nodestatetest"
)

var podsGVR = corev1.SchemeGroupVersion.WithResource("pods")

// withGPUPod puts a GPU workload on the node and serves the Eviction API; evict, when set, is called for each
// eviction request before it is granted (the pod deleted), and may refuse it with an error.
func (e *env) withGPUPod(evict func() error) {
	e.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", UID: "train-1", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "u", Controller: ptrTo(true)}}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": *resourceQty(1)}}}}},
	}
	if err := e.client.Tracker().Add(pod); err != nil {
		e.t.Fatal(err)
	}
	e.client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}, {Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}},
		{GroupVersion: "policy/v1", APIResources: []metav1.APIResource{{Name: "poddisruptionbudgets", Kind: "PodDisruptionBudget"}}},
	}
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if evict != nil {
			if err := evict(); err != nil {
				return true, nil, err
			}
		}
		ev := a.(k8stesting.CreateAction).GetObject()
		m, _ := ev.(metav1.Object)
		return true, ev, e.client.Tracker().Delete(podsGVR, m.GetNamespace(), m.GetName())
	})
}

// failing makes the first n requests of verb on resource (and subresource) fail with err, and counts them.
func (e *env) failing(verb, resource, subresource string, n int, err error) *int {
	calls := 0
	e.client.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != subresource {
			return false, nil, nil
		}
		if calls++; calls <= n {
			return true, nil, err
		}
		return false, nil, nil
	})
	return &calls
}

var nodesGR = schema.GroupResource{Resource: "nodes"}

// transientAPIErrors are what the manager sees while the API server or etcd restarts or drops connections.
var transientAPIErrors = apiretrytest.Transient()

// One failing request of the API server (an etcd timeout, a restart) is retried within the step, never a failed
// node: node reads, node writes and the eviction each fail twice with every transient kind, and the run completes.
func TestTransientAPIErrorsAreRetriedWithinTheStep(t *testing.T) {
	for name, terr := range transientAPIErrors {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gpuNode(nil))
			e.withGPUPod(nil)
			gets := e.failing("get", "nodes", "", 2, terr)
			patches := e.failing("patch", "nodes", "", 2, terr)
			evictions := e.failing("create", "pods", "eviction", 2, terr)
			out, err := e.run(e.options(newDigest))
			if err != nil {
				t.Fatalf("run failed on %s: %v", name, err)
			}
			if *gets < 3 || *patches < 3 || *evictions < 3 {
				t.Fatalf("gets %d, patches %d, evictions %d: some failing request was not retried", *gets, *patches, *evictions)
			}
			n := e.node()
			if state(n) != nodestate.ValidationRequired {
				t.Fatalf("state %q, want validation-required (%s)", state(n), out)
			}
			if _, err := e.client.CoreV1().Pods("ml").Get(context.Background(), "train", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("GPU pod still there: %v", err)
			}
			assertNothingPaused(t, n)
		})
	}
}

// An error that retrying cannot fix fails the step at once, naming it.
func TestLastingAPIErrorFailsAtOnce(t *testing.T) {
	t.Run("eviction forbidden", func(t *testing.T) {
		e := newEnv(t, gpuNode(nil))
		forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/eviction"}, "train", errors.New("RBAC: no eviction rights"))
		e.withGPUPod(func() error { return forbidden })
		start := time.Now()
		_, err := e.run(e.options(newDigest))
		if err == nil || !strings.Contains(err.Error(), "RBAC: no eviction rights") || time.Since(start) > 3*time.Second {
			t.Fatalf("err = %v after %s; want the Forbidden named at once", err, time.Since(start))
		}
		if n := e.node(); state(n) != nodestate.UpgradeFailed || nodestate.CordonedByUs(n) {
			t.Fatalf("state %q, ours %v: want upgrade-failed, uncordoned", state(n), nodestate.CordonedByUs(n))
		}
	})
	t.Run("node patch forbidden", func(t *testing.T) {
		e := newEnv(t, gpuNode(nil))
		calls := e.failing("patch", "nodes", "", 1, apierrors.NewForbidden(nodesGR, nodeName, errors.New("only its own node")))
		start := time.Now()
		_, err := e.run(e.options(newDigest))
		if err == nil || !strings.Contains(err.Error(), "only its own node") || time.Since(start) > 3*time.Second {
			t.Fatalf("err = %v after %s; want the Forbidden named at once", err, time.Since(start))
		}
		if *calls < 1 {
			t.Fatal("no patch sent")
		}
	})
}

// An admin sets an operand's switch to false while the GPU pods are evicted (minutes, under a PDB): the pause,
// written after the eviction, must be computed from the node as it is then, not from a read before the eviction,
// and the admin's false survives the whole change.
func TestAdminSwitchChangedDuringEvictionSurvives(t *testing.T) {
	dcgm, plugin := nodestate.DeployLabelPrefix+"dcgm-exporter", nodestate.DeployLabelPrefix+"device-plugin"
	e := newEnv(t, gpuNode(map[string]string{dcgm: "true", plugin: "true"}))
	v := nodestatetest.Versioned(e.client)
	e.withGPUPod(func() error {
		return v.Edit(nodeName, func(n *corev1.Node) { n.Labels[dcgm] = "false" })
	})
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	n := e.node()
	if n.Labels[dcgm] != "false" || n.Labels[plugin] != "true" {
		t.Fatalf("dcgm-exporter=%q device-plugin=%q; want the admin's false kept and the device plugin restored", n.Labels[dcgm], n.Labels[plugin])
	}
	assertNothingPaused(t, n)
}

// The same change landing between the manager's read of the node and its write of the pause: the write carries
// the read's resourceVersion, the server refuses it, and the manager computes the pause again.
func TestAdminSwitchChangedBetweenReadAndWriteSurvives(t *testing.T) {
	dcgm, plugin := nodestate.DeployLabelPrefix+"dcgm-exporter", nodestate.DeployLabelPrefix+"device-plugin"
	e := newEnv(t, gpuNode(map[string]string{dcgm: "true", plugin: "true"}))
	v := nodestatetest.Versioned(e.client)
	e.withGPUPod(nil)
	edited := false
	e.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !edited && strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), nodestate.PausedLabelsAnnotation) {
			edited = true
			if err := v.Edit(nodeName, func(n *corev1.Node) { n.Labels[dcgm] = "false" }); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if !edited {
		t.Fatal("no pause was written")
	}
	n := e.node()
	if n.Labels[dcgm] != "false" || n.Labels[plugin] != "true" {
		t.Fatalf("dcgm-exporter=%q device-plugin=%q; want the admin's false kept and the device plugin restored", n.Labels[dcgm], n.Labels[plugin])
	}
	assertNothingPaused(t, n)
}

// Errors that outlast APITimeout fail the step with the server's last error, not a bare deadline, and the node is
// restored and marked failed once the server answers again.
func TestAPIErrorsOutlastingTheTimeoutNameTheLastError(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	etcd := apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	e.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), string(nodestate.CordonRequired)) {
			return true, nil, etcd
		}
		return false, nil, nil
	})
	o := e.options(newDigest)
	o.APITimeout = 500 * time.Millisecond
	start := time.Now()
	_, err := e.run(o)
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %s with APITimeout 500ms", time.Since(start))
	}
	if err == nil || !strings.Contains(err.Error(), "etcdserver: request timed out (still failing after") {
		t.Fatalf("err = %v; want the last server error with how long it was retried", err)
	}
	n := e.node()
	if state(n) != nodestate.UpgradeFailed || !strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], "etcdserver: request timed out") {
		t.Fatalf("state %q, reason %q", state(n), n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
}

// The upgrade gate reads and writes the node through the same retries: a node write failing twice does not fail
// the node.
func TestGateRetriesTransientAPIErrors(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	validatorReady(t, e, e.clock().Add(time.Minute))
	e.failing("get", "nodes", "", 2, transientAPIErrors["connection refused"])
	patches := e.failing("patch", "nodes", "", 2, transientAPIErrors["503"])
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || *patches < 3 {
		t.Fatalf("state %q after %d patches; want upgrade-done", state(n), *patches)
	}
}
