package nodestate

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

const (
	// MaintenanceReason is the GPU health condition's reason (status Unknown) while a planned driver or MIG change
	// is under way on the node, so that a remediation controller that acts on the condition leaves the node alone.
	MaintenanceReason = "Maintenance"
	// MIGConfigStateLabel is written by the MIG manager: pending while it reconfigures, then success or failed.
	MIGConfigStateLabel = "nvidia.com/mig.config.state"
	// MaintenanceLabelAnnotation records the opt-out label the stack put on the node for a driver change ("key"),
	// so that the end of the change removes that label and never one the admin set.
	MaintenanceLabelAnnotation = AnnotationPrefix + "maintenance-label"
)

// maintenanceStates are the upgrade states of a driver change that has started on the node: from the cordon to the
// validation with the new driver and the uncordon after it. upgrade-required is only queued (the node still serves),
// and upgrade-failed is a fault for someone to look at, not maintenance.
var maintenanceStates = map[UpgradeState]bool{
	CordonRequired: true, PodDeletionRequired: true, DrainRequired: true, PodRestartRequired: true,
	ValidationRequired: true, UncordonRequired: true,
}

// The planned changes UnderMaintenance reports.
const (
	DriverChange = "driver change under way (" + UpgradeStateLabel + ")"
	MIGChange    = "MIG reconfiguration under way (" + MIGConfigStateLabel + "=pending)"
)

// UnderMaintenance says whether a planned change is under way on node (a driver change between its cordon and its
// uncordon, or a MIG reconfiguration the MIG manager reports pending) and which: DriverChange or MIGChange.
func UnderMaintenance(node *corev1.Node) (string, bool) {
	if maintenanceStates[UpgradeState(node.Labels[UpgradeStateLabel])] {
		return DriverChange, true
	}
	if node.Labels[MIGConfigStateLabel] == "pending" {
		return MIGChange, true
	}
	return "", false
}

// MaintenanceMessage is the GPU health condition's message during the planned change why: every writer of the
// Maintenance condition writes the same, so a node's condition does not change back and forth between them.
func MaintenanceMessage(why string) string {
	return "planned change: " + why + "; GPU health is judged again once it is over"
}

// ParseMaintenanceLabel parses "key=value" (empty: none), the label a remediation controller skips a node by.
func ParseMaintenanceLabel(s string) (key, value string, err error) {
	if s == "" {
		return "", "", nil
	}
	key, value, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return "", "", fmt.Errorf("%q is not key=value", s)
	}
	return key, value, nil
}

// BeginMaintenanceLabel returns the patch that puts the opt-out label key=value on node for a driver change,
// recorded in MaintenanceLabelAnnotation. A node that already carries key (the admin's, or a mark left by a run that
// stopped) keeps its value, and only a label this stack put there is recorded.
func BeginMaintenanceLabel(node *corev1.Node, key, value string) Patch {
	var p Patch
	if key == "" {
		return p
	}
	if _, ok := node.Labels[key]; !ok {
		p.label(key, ptr(value))
		p.annotation(MaintenanceLabelAnnotation, ptr(key))
	}
	return p
}

// EndMaintenanceLabel returns the patch that removes the opt-out label this stack put on node, and its record.
func EndMaintenanceLabel(node *corev1.Node) Patch {
	var p Patch
	key, ok := node.Annotations[MaintenanceLabelAnnotation]
	if !ok {
		return p
	}
	if _, set := node.Labels[key]; set && key != "" {
		p.label(key, nil)
	}
	p.annotation(MaintenanceLabelAnnotation, nil)
	return p
}
