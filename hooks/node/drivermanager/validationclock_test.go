package drivermanager

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// buildingDriverPod is the node's new driver pod while its driver container builds (not started yet), next to the gate.
func buildingDriverPod(t *testing.T, e *env) *corev1.Pod {
	t.Helper()
	no := false
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: driverPod, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "nvidia-driver-ctr", Started: &no}, {Name: GateContainer, Started: &no}}}}
	p, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The validation clock starts when the driver container has started (its startup probe passed): a build longer
// than the validation timeout, within the driver's startup budget, is no failure.
func TestValidationClockStartsWhenTheDriverStarted(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	pod := buildingDriverPod(t, e)
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, PodName: driverPod, Now: e.clock,
		Timeout: 300 * time.Millisecond, DriverStartup: 5 * time.Second}
	o.Complete()
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() { done <- o.Run(context.Background(), &out) }()
	time.Sleep(600 * time.Millisecond) // the build: twice the validation timeout
	yes := true
	pod.Status.ContainerStatuses[0].Started = &yes
	if _, err := e.client.CoreV1().Pods(namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 1, 0, time.UTC))
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gate: %v\n%s", err, out.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not end")
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
		t.Fatalf("state=%q unschedulable=%v, want upgrade-done and uncordoned", state(n), n.Spec.Unschedulable)
	}
}

// Once the driver started, the validation timeout counts as before; a driver that never starts within its startup
// budget fails the node too, saying so.
func TestValidationClockAfterTheDriverStartedAndABuildThatNeverEnds(t *testing.T) {
	for _, started := range []bool{true, false} {
		e := newEnv(t, gpuNode(nil))
		if _, err := e.run(e.options(newDigest)); err != nil {
			t.Fatal(err)
		}
		pod := buildingDriverPod(t, e)
		if started {
			pod.Status.ContainerStatuses[0].Started = &started
			if _, err := e.client.CoreV1().Pods(namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, PodName: driverPod, Now: e.clock,
			Timeout: 200 * time.Millisecond, DriverStartup: 600 * time.Millisecond}
		o.Complete()
		begin := time.Now()
		err := o.Run(context.Background(), &bytes.Buffer{})
		took := time.Since(begin)
		if err == nil || !strings.Contains(err.Error(), "after the driver container started") {
			t.Fatalf("started=%v: err = %v", started, err)
		}
		if started && took > 550*time.Millisecond || !started && took < 750*time.Millisecond {
			t.Errorf("started=%v: failed after %s; want about the validation timeout once started, the whole budget (800ms) otherwise", started, took)
		}
		if n := e.node(); state(n) != nodestate.UpgradeFailed || !n.Spec.Unschedulable {
			t.Fatalf("started=%v: state=%q unschedulable=%v; want upgrade-failed and still cordoned", started, state(n), n.Spec.Unschedulable)
		}
	}
}
