// Package agenttest runs the GPU health agent (`validator health`) in-process against a local API server and reads
// its verdict there, for the two suites that drive it from its two sources: tests/gpuhealth (NVML, through go-nvml's
// mock) and tests/gpuhealthexporter (the DCGM exporter).
package agenttest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// Policy is the chart's default global.health with the taint on (tests/chart/gpuhealth_test.go checks the render).
var Policy = gpuhealth.Policy{
	Fatal:         []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120},
	Application:   []uint64{13, 31, 43, 45, 68},
	Watches:       gpuhealth.KnownWatches,
	ConditionType: gpuhealth.DefaultConditionType,
	Taint:         &corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Effect: corev1.TaintEffectNoSchedule},
}

// Agent is `validator health` run in-process as its pod runs it; its log is the Buffer.
type Agent struct {
	cancel context.CancelFunc
	done   chan error
	syncbuffer.Buffer
}

// Start completes and validates o and runs the agent until Stop or the test's end.
func Start(t *testing.T, o gpuhealth.Options) *Agent {
	t.Helper()
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &Agent{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- o.Run(ctx, a) }()
	t.Cleanup(cancel)
	return a
}

// Stop stops the agent as its pod's SIGTERM does, and fails the test if it did not end cleanly.
func (a *Agent) Stop(t *testing.T) {
	t.Helper()
	a.cancel()
	select {
	case err := <-a.done:
		if err != nil {
			t.Fatalf("agent: %v\nlog:\n%s", err, a)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop")
	}
}

// WaitNode waits until ok holds for the node as the API server has it.
func WaitNode(t *testing.T, client kubernetes.Interface, node, what string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = n
		return ok(n), nil
	})
	if err != nil {
		t.Fatalf("node %s: not %s within 30s: conditions %+v, taints %+v", node, what, last.Status.Conditions, last.Spec.Taints)
	}
	return last
}

// Condition is the node's GPU health condition (Policy's type), nil when it has none.
func Condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == Policy.ConditionType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// Tainted says whether the node has a taint of taint's key and effect.
func Tainted(n *corev1.Node, taint corev1.Taint) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == taint.Key && t.Effect == taint.Effect {
			return true
		}
	}
	return false
}

// Status holds for a node whose condition has status s and reason.
func Status(s corev1.ConditionStatus, reason string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c := Condition(n)
		return c != nil && c.Status == s && c.Reason == reason
	}
}
