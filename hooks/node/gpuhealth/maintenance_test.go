package gpuhealth

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// scriptedMonitor reports each verdict sent to it, as a monitor whose GPUs change.
type scriptedMonitor chan Verdict

func (m scriptedMonitor) Watch(ctx context.Context, _ string, _ Policy, _ func(string, ...any), report func(Verdict) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case v := <-m:
			if err := report(v); err != nil {
				return err
			}
		}
	}
}

// While a planned driver or MIG change is under way the agent reports Maintenance, whatever the GPUs say, and
// the latest verdict again once it is over: a fault the change left behind still reaches the Node.
func TestMaintenanceHoldsVerdictsUntilTheChangeIsOver(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node",
		Labels: map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)}}})
	gpus := make(scriptedMonitor)
	o := Options{NodeName: "gpu-node", Client: client, Policy: Policy{ConditionType: DefaultConditionType},
		HostRoot: writeLib(t, t.TempDir()), DriverInstallDir: t.TempDir(), Monitor: gpus}
	o.Complete()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var log syncbuffer.Buffer
	go func() { done <- o.Run(ctx, &log) }()
	defer func() { cancel(); <-done }()

	healthy := Verdict{Status: corev1.ConditionTrue, Reason: ReasonHealthy, Message: "all 2 GPUs healthy"}
	lost := Verdict{Status: corev1.ConditionFalse, Reason: ReasonGPULost, Message: "GPU 0: the GPU fell off the bus"}
	fatal := Verdict{Status: corev1.ConditionFalse, Reason: ReasonFatalXid, Message: "GPU 1: Xid 79"}
	gpus <- healthy
	expect(t, client, &log, corev1.ConditionTrue, ReasonHealthy)

	for _, change := range []struct {
		name          string
		label, value  string
		end           string
		during, after Verdict
		afterReason   string
		afterStatus   corev1.ConditionStatus
	}{
		{name: "driver change", label: nodestate.UpgradeStateLabel, value: string(nodestate.CordonRequired),
			end: string(nodestate.UpgradeDone), during: lost, after: healthy, afterStatus: corev1.ConditionTrue, afterReason: ReasonHealthy},
		{name: "MIG reconfiguration", label: nodestate.MIGConfigStateLabel, value: "pending",
			end: "success", during: lost, after: fatal, afterStatus: corev1.ConditionFalse, afterReason: ReasonFatalXid},
	} {
		t.Run(change.name, func(t *testing.T) {
			setLabel(t, client, change.label, change.value)
			expect(t, client, &log, corev1.ConditionUnknown, nodestate.MaintenanceReason)
			gpus <- change.during // the GPUs' errors while the change runs are not faults
			gpus <- change.after
			time.Sleep(50 * time.Millisecond)
			expect(t, client, &log, corev1.ConditionUnknown, nodestate.MaintenanceReason)
			setLabel(t, client, change.label, change.end)
			expect(t, client, &log, change.afterStatus, change.afterReason)
		})
	}
	// a Maintenance mark left by a driver manager stopped before its cordon (the node never entered the change) is
	// written over with the agent's verdict
	if err := nodecondition.Set(t.Context(), client, "gpu-node", corev1.NodeCondition{Type: DefaultConditionType,
		Status: corev1.ConditionUnknown, Reason: nodestate.MaintenanceReason, Message: nodestate.MaintenanceMessage(nodestate.DriverChange)}); err != nil {
		t.Fatal(err)
	}
	expect(t, client, &log, corev1.ConditionFalse, ReasonFatalXid)

	// a driver change that failed is a fault to look at, not maintenance
	gpus <- healthy
	expect(t, client, &log, corev1.ConditionTrue, ReasonHealthy)
	setLabel(t, client, nodestate.UpgradeStateLabel, string(nodestate.UpgradeFailed))
	gpus <- lost
	expect(t, client, &log, corev1.ConditionFalse, ReasonGPULost)
}

func setLabel(t *testing.T, client kubernetes.Interface, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := client.CoreV1().Nodes().Patch(t.Context(), "gpu-node", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, client kubernetes.Interface, log *syncbuffer.Buffer, status corev1.ConditionStatus, reason string) {
	t.Helper()
	var got corev1.NodeCondition
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, "gpu-node", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got, _ = nodecondition.Find(n, DefaultConditionType)
		return got.Status == status && got.Reason == reason, nil
	})
	if err != nil {
		t.Fatalf("condition %s %s: %s, want %s %s; log:\n%s", got.Status, got.Reason, got.Message, status, reason, log.String())
	}
}
