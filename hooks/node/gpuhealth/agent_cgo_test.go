//go:build cgo

package gpuhealth

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth/gpuhealthtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// monitor is the real NVML monitor over the mock.
func monitor(g *gpuhealthtest.GPUs) Monitor {
	return NVMLMonitor{Open: g.Open, Poll: 10 * time.Millisecond}
}

var testPolicy = Policy{
	Fatal:         []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120},
	Application:   []uint64{13, 31, 43, 45, 68},
	Watches:       KnownWatches,
	ConditionType: DefaultConditionType,
}

func withTaint(p Policy, effect corev1.TaintEffect) Policy {
	p.Taint = &corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Effect: effect}
	return p
}

// agent is one agent run in the background, as the pod runs it.
type agent struct {
	cancel context.CancelFunc
	done   chan error
	// the agent's log
	syncbuffer.Buffer
}

func startAgent(t *testing.T, client kubernetes.Interface, p Policy, gpus *gpuhealthtest.GPUs) *agent {
	t.Helper()
	o := Options{NodeName: "gpu-node", Client: client, Policy: p, HostRoot: writeLib(t, t.TempDir()), DriverInstallDir: t.TempDir(),
		Monitor: monitor(gpus)}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- o.Run(ctx, a) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *agent) stop(t *testing.T) {
	a.cancel()
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent stopped with %v\nlog:\n%s", err, a)
		}
		a.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatalf("agent did not stop\nlog:\n%s", a)
	}
}

func nodeCondition(t *testing.T, client kubernetes.Interface, ct corev1.NodeConditionType) (*corev1.NodeCondition, []corev1.Taint) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), "gpu-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == ct {
			return &c, n.Spec.Taints
		}
	}
	return nil, n.Spec.Taints
}

// waitCondition waits until the node's condition has status and a message holding each of want.
func waitCondition(t *testing.T, client kubernetes.Interface, a *agent, status corev1.ConditionStatus, reason string, want ...string) *corev1.NodeCondition {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, _ := nodeCondition(t, client, DefaultConditionType)
		if c != nil && c.Status == status && c.Reason == reason && containsAll(c.Message, want) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition %+v, want %s %s %q\nlog:\n%s", c, status, reason, want, a)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func gpuNode(conds []corev1.NodeCondition, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node"}, Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Conditions: append([]corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}, conds...)}}
}

func hasTaint(taints []corev1.Taint, key string, effect corev1.TaintEffect) bool {
	for _, t := range taints {
		if t.Key == key && t.Effect == effect {
			return true
		}
	}
	return false
}

func TestFatalXidSetsConditionFalseAndTaint(t *testing.T) {
	client := fake.NewClientset(gpuNode(nil))
	gpus := gpuhealthtest.New(2)
	a := startAgent(t, client, withTaint(testPolicy, corev1.TaintEffectNoSchedule), gpus)
	waitCondition(t, client, a, corev1.ConditionTrue, ReasonHealthy, "all 2 GPUs healthy")
	if _, taints := nodeCondition(t, client, DefaultConditionType); hasTaint(taints, "nvidia.com/gpu-unhealthy", corev1.TaintEffectNoSchedule) {
		t.Fatalf("a healthy node is tainted: %v", taints)
	}
	if mask := gpus.Registered(1); mask != nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError {
		t.Errorf("GPU 1 registered for events %#x, want Xid and double-bit ECC", mask)
	}

	gpus.Xid(1, 79)
	c := waitCondition(t, client, a, corev1.ConditionFalse, ReasonFatalXid, "GPU 1 (GPU-00000001-0000-0000-0000-000000000000)", "Xid 79")
	if strings.Contains(c.Message, "GPU 0") {
		t.Errorf("the message blames GPU 0: %s", c.Message)
	}
	_, taints := nodeCondition(t, client, DefaultConditionType)
	if !hasTaint(taints, "nvidia.com/gpu-unhealthy", corev1.TaintEffectNoSchedule) {
		t.Fatalf("no taint after a fatal Xid: %v", taints)
	}
	// The kubelet's conditions are left alone.
	if c, _ := nodeCondition(t, client, corev1.NodeReady); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("Ready condition %+v", c)
	}
}

func TestApplicationXidKeepsNodeHealthy(t *testing.T) {
	client := fake.NewClientset(gpuNode(nil))
	gpus := gpuhealthtest.New(1)
	a := startAgent(t, client, withTaint(testPolicy, corev1.TaintEffectNoSchedule), gpus)
	before := waitCondition(t, client, a, corev1.ConditionTrue, ReasonHealthy)
	gpus.Xid(0, 13) // application tier
	gpus.Xid(0, 31)
	gpus.Xid(0, 999) // unlisted
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(a.String(), "Xid 999 (unlisted)") {
		if time.Now().After(deadline) {
			t.Fatalf("the Xids were not read\nlog:\n%s", a)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, taints := nodeCondition(t, client, DefaultConditionType)
	if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Fatalf("condition after application Xids: %+v", c)
	}
	if len(taints) != 0 {
		t.Fatalf("taints after application Xids: %v", taints)
	}
	if !strings.Contains(a.String(), "Xid 13 (application)") {
		t.Fatalf("log:\n%s", a)
	}
}

func TestTaintOffByDefault(t *testing.T) {
	client := fake.NewClientset(gpuNode(nil))
	gpus := gpuhealthtest.New(1)
	a := startAgent(t, client, testPolicy, gpus)
	waitCondition(t, client, a, corev1.ConditionTrue, ReasonHealthy)
	gpus.Xid(0, 48)
	waitCondition(t, client, a, corev1.ConditionFalse, ReasonFatalXid, "Xid 48")
	if _, taints := nodeCondition(t, client, DefaultConditionType); len(taints) != 0 {
		t.Fatalf("taints without a taint in the policy: %v", taints)
	}
}

// A False condition and its taint from before a reboot or GPU reset: the agent starts again, probes the GPUs
// afresh and clears both.
func TestHealthyProbeClearsStaleFalseAndTaint(t *testing.T) {
	stale := corev1.NodeCondition{Type: DefaultConditionType, Status: corev1.ConditionFalse, Reason: ReasonFatalXid,
		Message: "GPU 0 (GPU-0000000a): Xid 79", LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))}
	admin := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoSchedule}
	ours := corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Value: ReasonFatalXid, Effect: corev1.TaintEffectNoExecute}
	client := fake.NewClientset(gpuNode([]corev1.NodeCondition{stale}, admin, ours))
	a := startAgent(t, client, withTaint(testPolicy, corev1.TaintEffectNoExecute), gpuhealthtest.New(1))
	c := waitCondition(t, client, a, corev1.ConditionTrue, ReasonHealthy, "all 1 GPUs healthy")
	if !c.LastTransitionTime.After(stale.LastTransitionTime.Time) {
		t.Errorf("lastTransitionTime %v did not move", c.LastTransitionTime)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, taints := nodeCondition(t, client, DefaultConditionType)
		if !hasTaint(taints, ours.Key, ours.Effect) {
			if !hasTaint(taints, admin.Key, admin.Effect) {
				t.Fatalf("the admin's taint went too: %v", taints)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("taints %v\nlog:\n%s", taints, a)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The probe at start judges what a GPU keeps across events: one fallen off the bus, a pending row remap.
func TestProbeFindsLostGPUAndPendingRemap(t *testing.T) {
	client := fake.NewClientset(gpuNode(nil))
	gpus := gpuhealthtest.New(3)
	gpus.Lost[0] = true
	gpus.Pending[2] = true
	a := startAgent(t, client, testPolicy, gpus)
	waitCondition(t, client, a, corev1.ConditionFalse, ReasonGPULost, "GPU 0: the GPU fell off the bus", "GPU 2 (GPU-00000002-0000-0000-0000-000000000000): a row remap is pending")

	// Without the watch, a pending remap is not a fault.
	client = fake.NewClientset(gpuNode(nil))
	gpus = gpuhealthtest.New(1)
	gpus.Pending[0] = true
	p := testPolicy
	p.Watches = []string{WatchECCDoubleBit}
	a = startAgent(t, client, p, gpus)
	waitCondition(t, client, a, corev1.ConditionTrue, ReasonHealthy)
}

// NVML that does not start: Unknown, never healthy, and the taint is left as it was.
func TestNVMLFailureIsUnknown(t *testing.T) {
	ours := corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Value: ReasonFatalXid, Effect: corev1.TaintEffectNoSchedule}
	client := fake.NewClientset(gpuNode(nil, ours))
	gpus := gpuhealthtest.New(1)
	gpus.InitRet = nvml.ERROR_DRIVER_NOT_LOADED
	o := Options{NodeName: "gpu-node", Client: client, Policy: withTaint(testPolicy, corev1.TaintEffectNoSchedule),
		HostRoot: writeLib(t, t.TempDir()), Monitor: monitor(gpus)}
	o.Complete()
	var log bytes.Buffer
	err := o.Run(context.Background(), &log)
	if err == nil || !strings.Contains(err.Error(), "ERROR_DRIVER_NOT_LOADED") {
		t.Fatalf("Run: %v", err)
	}
	c, taints := nodeCondition(t, client, DefaultConditionType)
	if c == nil || c.Status != corev1.ConditionUnknown || c.Reason != ReasonNVMLFailed {
		t.Fatalf("condition %+v", c)
	}
	if !hasTaint(taints, ours.Key, ours.Effect) {
		t.Fatalf("Unknown took the taint off: %v", taints)
	}

	// No library under either root: Unknown too.
	o = Options{NodeName: "gpu-node", Client: client, Policy: testPolicy, HostRoot: t.TempDir(), DriverInstallDir: t.TempDir(), Monitor: monitor(gpus)}
	o.Complete()
	if err := o.Run(context.Background(), &log); err == nil {
		t.Fatal("Run without NVML succeeded")
	}
	if c, _ := nodeCondition(t, client, DefaultConditionType); c.Status != corev1.ConditionUnknown || c.Reason != ReasonNVMLNotFound {
		t.Fatalf("condition %+v", c)
	}
}
