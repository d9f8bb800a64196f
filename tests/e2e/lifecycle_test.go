package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

// TestMixedProfileLifecycle follows one install of the mixed profile through an admin's day, one step a subtest:
// the gate passes and reports, the operands run where the role matrix says, `helm test` passes, node labels move
// operands, a chart-only upgrade leaves the drivers alone, a driver version upgrade is planned and marked, and
// uninstall removes the report and leaves every node as it was before the install. Each step would otherwise pay
// an install and an uninstall of its own (most of the package's CPU is the control plane creating and deleting
// operand pods); a step that fails does not stop the ones after it, and uninstall always runs.
func TestMixedProfileLifecycle(t *testing.T) {
	e := use(t)
	e.stand.Reset()
	before := e.snapshotNodes(t)
	start := time.Now()
	rel := e.installProfile(t, mixedProfile())
	t.Run("gate passes and reports", func(t *testing.T) { e.gatePassedAndReported(t, start) })
	t.Run("operands placed by the role matrix", func(t *testing.T) { e.waitForPlacement(t, e.expectedPlacement(t, rel)) })
	t.Run("helm test passes", e.helmTestPasses)
	t.Run("node labels move operands", func(t *testing.T) { e.nodeLabelsMoveOperands(t, rel) })
	t.Run("chart-only upgrade touches no driver", e.chartOnlyUpgradeTouchesNoDriver)
	t.Run("driver version upgrade is planned and marked", e.driverVersionUpgradeIsPlannedAndMarked)
	e.uninstall(t)
	if _, err := e.kube.Client.CoreV1().ConfigMaps(e.target().Namespace).Get(t.Context(), stackcli.DefaultReportConfigMap, metav1.GetOptions{}); err == nil {
		t.Error("uninstall left the report ConfigMap behind")
	}
	e.nodesUnchangedSince(t, before)
}
