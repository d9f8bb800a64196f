package drivermanager

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const healthCondition corev1.NodeConditionType = "nvidia.com/GPUHealthy"

var optOut = Maintenance{Condition: healthCondition, LabelKey: "remediation.example.com/skip", LabelValue: "true"}

// A driver change marks the node before anything on it stops: the health condition Maintenance is written before the
// patch that enters cordon-required (with the opt-out label in it), and the label goes with upgrade-done.
func TestDriverChangeMarksMaintenanceBeforeTheCordon(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	o := e.options(newDigest)
	o.Maintenance = optOut
	if _, err := e.run(o); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, a := range e.client.Actions() {
		p, ok := a.(interface{ GetPatch() []byte })
		if !ok {
			continue
		}
		switch patch := string(p.GetPatch()); {
		case a.GetSubresource() == "status" && strings.Contains(patch, `"reason":"Maintenance"`):
			order = append(order, "condition")
		case strings.Contains(patch, `"`+nodestate.UpgradeStateLabel+`":"cordon-required"`):
			if !strings.Contains(patch, `"remediation.example.com/skip":"true"`) {
				t.Errorf("the opt-out label is not in the cordon-required patch: %s", patch)
			}
			order = append(order, "cordon-required")
		}
	}
	if !slices.Equal(order, []string{"condition", "cordon-required"}) {
		t.Fatalf("writes %v, want the condition first, then cordon-required", order)
	}
	n := e.node()
	if c, _ := nodecondition.Find(n, healthCondition); c.Status != corev1.ConditionUnknown || c.Reason != nodestate.MaintenanceReason {
		t.Fatalf("condition %s %s during the change", c.Status, c.Reason)
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	n = e.node()
	if _, ok := n.Labels[optOut.LabelKey]; ok || n.Annotations[nodestate.MaintenanceLabelAnnotation] != "" || state(n) != nodestate.UpgradeDone {
		t.Fatalf("after the change: state %q, labels %v, annotations %v", state(n), n.Labels, n.Annotations)
	}
	// the condition is the agent's again: the driver manager does not guess the GPUs healthy
	if c, _ := nodecondition.Find(n, healthCondition); c.Reason != nodestate.MaintenanceReason {
		t.Fatalf("condition %s %s after the change, want it left to the agent", c.Status, c.Reason)
	}
}

// A change that fails ends the mark: DriverUpgradeFailed (Unknown) instead of Maintenance, the opt-out label removed,
// and an admin's own label of the same key is never touched.
func TestFailedDriverChangeEndsMaintenance(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	e.host.Use("nvidia", 1)
	e.host.OpenDevice(31337, "stray-cuda-app", "/dev/nvidia0")
	o := e.options(newDigest)
	o.Maintenance = optOut
	if _, err := e.run(o); err == nil {
		t.Fatal("a busy driver did not fail the run")
	}
	n := e.node()
	if c, _ := nodecondition.Find(n, healthCondition); c.Status != corev1.ConditionUnknown || c.Reason != ReasonDriverUpgradeFailed ||
		!strings.Contains(c.Message, "stray-cuda-app") {
		t.Fatalf("condition %s %s %q, want Unknown DriverUpgradeFailed naming the cause", c.Status, c.Reason, c.Message)
	}
	if _, ok := n.Labels[optOut.LabelKey]; ok || state(n) != nodestate.UpgradeFailed {
		t.Fatalf("state %q labels %v", state(n), n.Labels)
	}

	admins := gpuNode(map[string]string{optOut.LabelKey: "admin"})
	e = newEnv(t, admins)
	o = e.options(newDigest)
	o.Maintenance = optOut
	if _, err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if got := e.node().Labels[optOut.LabelKey]; got != "admin" {
		t.Fatalf("the admin's %s became %q", optOut.LabelKey, got)
	}
	validatorReady(t, e, time.Date(2026, 9, 1, 12, 0, 5, 0, time.UTC))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	if got := e.node().Labels[optOut.LabelKey]; got != "admin" {
		t.Fatalf("after the change the admin's %s is %q", optOut.LabelKey, got)
	}
}
