//go:build cgo

package gpuhealth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth/gpuhealthtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// policy is the chart's default global.health with the taint on (tests/chart/gpuhealth_test.go checks the render).
var policy = gpuhealth.Policy{
	Fatal:         []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120},
	Application:   []uint64{13, 31, 43, 45, 68},
	Watches:       gpuhealth.KnownWatches,
	ConditionType: gpuhealth.DefaultConditionType,
	Taint:         &corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Effect: corev1.TaintEffectNoSchedule},
}

// runningAgent is `validator health` run in-process as its pod runs it.
type runningAgent struct {
	cancel context.CancelFunc
	done   chan error
	// the agent's log
	syncbuffer.Buffer
}

func startAgent(t *testing.T, node string, gpus *gpuhealthtest.GPUs) *runningAgent {
	t.Helper()
	host := t.TempDir()
	lib := filepath.Join(host, "usr/lib/x86_64-linux-gnu", gpuhealth.NVMLLibrary)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := gpuhealth.Options{NodeName: node, Client: kube.Client, Policy: policy, HostRoot: host, DriverInstallDir: t.TempDir(),
		Monitor: gpuhealth.NVMLMonitor{Open: gpus.Open, Poll: 20 * time.Millisecond}}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &runningAgent{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- o.Run(ctx, a) }()
	return a
}

func (a *runningAgent) stop(t *testing.T) {
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

// waitNode waits until ok holds for the node as the API server has it.
func waitNode(t *testing.T, node, what string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
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

func condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == policy.ConditionType {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func tainted(n *corev1.Node, taint corev1.Taint) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == taint.Key && t.Effect == taint.Effect {
			return true
		}
	}
	return false
}

func status(s corev1.ConditionStatus, reason string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c := condition(n)
		return c != nil && c.Status == s && c.Reason == reason
	}
}

// TestFatalXidSetsTheConditionAndARestartClearsIt: on start the agent sets the condition True; an application
// Xid leaves it so; a fatal Xid makes it False naming the GPU and the Xid, and taints the node; a new start over
// healthy GPUs (the pod after a GPU reset or a reboot) sets it True and lifts the taint, keeping an admin's taint.
// The node is a plain Node: the node lifecycle controller writes it too (Ready Unknown, its not-ready taints), so
// the agent's patches and updates meet a real concurrent writer.
func TestFatalXidSetsTheConditionAndARestartClearsIt(t *testing.T) {
	const node = "gpu-health-a"
	if _, err := kube.Client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	gpus := gpuhealthtest.New(2)
	a := startAgent(t, node, gpus)
	if n := waitNode(t, node, "healthy", status(corev1.ConditionTrue, gpuhealth.ReasonHealthy)); tainted(n, *policy.Taint) {
		t.Fatalf("a healthy node is tainted: %+v", n.Spec.Taints)
	}
	gpus.Xid(0, 13) // application tier
	gpus.Xid(1, 79)
	n := waitNode(t, node, "unhealthy and tainted", func(n *corev1.Node) bool {
		return status(corev1.ConditionFalse, gpuhealth.ReasonFatalXid)(n) && tainted(n, *policy.Taint)
	})
	if msg := condition(n).Message; !strings.Contains(msg, "GPU 1 ("+gpus.UUIDs[1]+"): Xid 79") || strings.Contains(msg, "Xid 13") {
		t.Fatalf("message %q", msg)
	}
	a.stop(t)
	if !strings.Contains(a.String(), "Xid 13 (application)") {
		t.Fatalf("the application Xid was not read:\n%s", a)
	}
	// A stopped agent leaves its verdict: a pod stopping is no news about the GPU.
	if n := waitNode(t, node, "still unhealthy", status(corev1.ConditionFalse, gpuhealth.ReasonFatalXid)); !tainted(n, *policy.Taint) {
		t.Fatalf("the taint went with the agent: %+v", n.Spec.Taints)
	}

	admin := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n.Spec.Taints = append(n.Spec.Taints, admin)
		_, err = kube.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a = startAgent(t, node, gpuhealthtest.New(2))
	n = waitNode(t, node, "healthy and untainted", func(n *corev1.Node) bool {
		return status(corev1.ConditionTrue, gpuhealth.ReasonHealthy)(n) && !tainted(n, *policy.Taint)
	})
	a.stop(t)
	if !tainted(n, admin) {
		t.Fatalf("the admin's taint went too: %+v", n.Spec.Taints)
	}
}
