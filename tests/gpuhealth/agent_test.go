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
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/agenttest"
)

func startAgent(t *testing.T, node string, gpus *gpuhealthtest.GPUs) *agenttest.Agent {
	t.Helper()
	host := t.TempDir()
	lib := filepath.Join(host, "usr/lib/x86_64-linux-gnu", gpuhealth.NVMLLibrary)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	return agenttest.Start(t, gpuhealth.Options{NodeName: node, Client: kube.Client, Policy: agenttest.Policy, HostRoot: host,
		DriverInstallDir: t.TempDir(), Monitor: gpuhealth.NVMLMonitor{Open: gpus.Open, Poll: 20 * time.Millisecond}})
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
	if n := agenttest.WaitNode(t, kube.Client, node, "healthy", agenttest.Status(corev1.ConditionTrue, gpuhealth.ReasonHealthy)); agenttest.Tainted(n, *agenttest.Policy.Taint) {
		t.Fatalf("a healthy node is tainted: %+v", n.Spec.Taints)
	}
	gpus.Xid(0, 13) // application tier
	gpus.Xid(1, 79)
	n := agenttest.WaitNode(t, kube.Client, node, "unhealthy and tainted", func(n *corev1.Node) bool {
		return agenttest.Status(corev1.ConditionFalse, gpuhealth.ReasonFatalXid)(n) && agenttest.Tainted(n, *agenttest.Policy.Taint)
	})
	if msg := agenttest.Condition(n).Message; !strings.Contains(msg, "GPU 1 ("+gpus.UUIDs[1]+"): Xid 79") || strings.Contains(msg, "Xid 13") {
		t.Fatalf("message %q", msg)
	}
	a.Stop(t)
	if !strings.Contains(a.String(), "Xid 13 (application)") {
		t.Fatalf("the application Xid was not read:\n%s", a)
	}
	// A stopped agent leaves its verdict: a pod stopping is no news about the GPU.
	if n := agenttest.WaitNode(t, kube.Client, node, "still unhealthy", agenttest.Status(corev1.ConditionFalse, gpuhealth.ReasonFatalXid)); !agenttest.Tainted(n, *agenttest.Policy.Taint) {
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
	n = agenttest.WaitNode(t, kube.Client, node, "healthy and untainted", func(n *corev1.Node) bool {
		return agenttest.Status(corev1.ConditionTrue, gpuhealth.ReasonHealthy)(n) && !agenttest.Tainted(n, *agenttest.Policy.Taint)
	})
	a.Stop(t)
	if !agenttest.Tainted(n, admin) {
		t.Fatalf("the admin's taint went too: %+v", n.Spec.Taints)
	}
}
