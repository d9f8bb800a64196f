package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

func TestClusterUp(t *testing.T) {
	e := use(t)
	nodes, err := e.kube.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != len(fixtureNodes) {
		t.Fatalf("%d nodes, want %d", len(nodes.Items), len(fixtureNodes))
	}
}

// TestStopDoesNotWaitForOpenWatches stops a control plane while a client still watches it, as a pool's DRA plugin
// does when the package's first control plane stops: the API server must end the watch and exit, not wait for the
// client until envtest's stop timeout (30 s) kills it, which Stop would write to the cluster's log.
func TestStopDoesNotWaitForOpenWatches(t *testing.T) {
	t.Parallel()
	var log syncbuffer.Buffer
	c, err := cluster.Start(t.Context(), cluster.Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	w, err := c.Client.CoreV1().Pods("").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	c.Stop()
	if _, open := <-w.ResultChan(); open {
		t.Error("the watch got an event, want it closed by the stopping API server")
	}
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.HasPrefix(line, "cluster: stop:") {
			t.Errorf("the API server held its open watch: %s", line)
		}
	}
}

// TestSimulatedPodsAreDeletedOnce deletes a running pod of a simulated node as a controller does (with its grace
// period) and checks that kwok removes it with one delete: kwok's delete first sets the grace period to 0, and a
// pod-delete stage that matched that update too would delete the pod again and get a 404, one wasted request for
// each of the thousands of pods the suites delete.
func TestSimulatedPodsAreDeletedOnce(t *testing.T) {
	e := use(t)
	ctx := t.Context()
	pods := e.kube.Client.CoreV1().Pods("default")
	before := e.podDeletesNotFound(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "deleted-once"},
		Spec:       corev1.PodSpec{NodeName: "cpu-only", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("kwok never ran the pod: %v", err)
	}
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("kwok never removed the deleted pod: %v", err)
	}
	// kwok's second delete, when there is one, follows the removal within milliseconds
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n := e.podDeletesNotFound(t) - before; n != 0 {
			t.Fatalf("the pod was deleted again after it was gone (%v pod deletes answered 404)", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// podDeletesNotFound is how many pod deletes the API server has answered with 404 so far.
func (e *env) podDeletesNotFound(t *testing.T) float64 {
	t.Helper()
	raw, err := e.kube.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["verb"] == "DELETE" && labels["resource"] == "pods" && labels["subresource"] == "" && labels["code"] == "404" {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}
