package rollout

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// TestHookPodEvictedMidRunIsRunAgain: `kubectl drain` of the node that runs the release's validation gate while the
// gate waits for a driver change. The eviction marks the hook pod with the condition DisruptionTarget, and the Job
// replaces the pod instead of failing (one try is for a failed check, not for a drained node). The `helm upgrade`
// passes once the change validated.
func TestHookPodEvictedMidRunIsRunAgain(t *testing.T) {
	const (
		tag  = "600.40.01"
		gate = "validation-gate"
	)
	ctx := t.Context()
	// each install takes a while, so that the gate still waits when its pod is evicted
	freshNodes(t, 8*time.Second)
	if _, err := target().Install(ctx, profile(), settings()...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target().Uninstall(); err != nil {
			t.Error(err)
		}
	})

	start := time.Now()
	upgraded := make(chan error, 1)
	go func() {
		_, err := target().Upgrade(ctx, profile(), settings("driver.image.tag="+tag)...)
		upgraded <- err
	}()
	var evicted *corev1.Pod
	rollouttest.WaitFor(t, 2*time.Minute, "the validation gate's pod running", func() (bool, string) {
		pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=" + gate})
		if err != nil {
			return false, err.Error()
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.CreationTimestamp.After(start.Add(-time.Second)) && p.Status.Phase == corev1.PodRunning {
				evicted = p
				return true, ""
			}
		}
		return false, "none running yet"
	})
	if err := kube.Client.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: evicted.Name, Namespace: namespace}}); err != nil {
		t.Fatalf("evict the gate's pod %s: %v", evicted.Name, err)
	}
	select {
	case err := <-upgraded:
		if err != nil {
			logRuns(t, start)
			t.Fatalf("the upgrade failed after its gate's pod %s was evicted: %v", evicted.Name, err)
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("the upgrade did not end within 4 minutes")
	}

	var gates []kubelet.Run
	for _, r := range stand.Runs() {
		if r.Component == gate && !r.Started.Before(start) {
			gates = append(gates, r)
		}
	}
	if i := slices.IndexFunc(gates, func(r kubelet.Run) bool { return r.Pod == evicted.Name }); i < 0 || gates[i].ExitCode == 0 {
		t.Errorf("the evicted gate pod %s did not end killed: runs %+v", evicted.Name, gates)
	}
	if len(gates) != 2 || gates[1].Pod == evicted.Name || gates[1].ExitCode != 0 {
		t.Errorf("gate runs since the upgrade %+v, want the evicted one, then one on a new pod that passed", gates)
	}
	rollouttest.WaitFor(t, 3*time.Minute, "the change rolled out", func() (bool, string) { return rolledOut(t, rollouttest.GPUNodeNames(nodes)) })
}
