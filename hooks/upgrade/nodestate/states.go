package nodestate

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// UpgradeState is a value of UpgradeStateLabel. The names are the GPU Operator's; the driver manager and the
// pre-upgrade hook use a subset of them. The machine they make, in order, and which process writes each move, is in
// the doc of hooks/upgrade.
type UpgradeState string

const (
	UpgradeRequired     UpgradeState = "upgrade-required"
	CordonRequired      UpgradeState = "cordon-required"
	PodDeletionRequired UpgradeState = "pod-deletion-required"
	DrainRequired       UpgradeState = "drain-required"
	PodRestartRequired  UpgradeState = "pod-restart-required"
	ValidationRequired  UpgradeState = "validation-required"
	UncordonRequired    UpgradeState = "uncordon-required"
	UpgradeDone         UpgradeState = "upgrade-done"
	UpgradeFailed       UpgradeState = "upgrade-failed"
)

// UpgradeStates are every UpgradeState the stack writes, in the order a driver change walks them (upgrade-failed
// last): the node status exporter reports one series per state.
var UpgradeStates = []UpgradeState{
	UpgradeRequired, CordonRequired, PodDeletionRequired, DrainRequired, PodRestartRequired, ValidationRequired,
	UncordonRequired, UpgradeDone, UpgradeFailed,
}

// CheckState is the outcome of one validator check on a node.
type CheckState string

const (
	// CheckReady: the check passed; its status file is written.
	CheckReady CheckState = "ready"
	// CheckSkipped: the check does not apply (wrong role, disabled, no free GPU) and says why; it counts as passed.
	CheckSkipped CheckState = "skipped"
	// CheckWaiting: the check is still waiting for its condition and says for what.
	CheckWaiting CheckState = "waiting"
	// CheckFailed: the check failed and says why.
	CheckFailed CheckState = "failed"
)

// Validation is a check's outcome as recorded in ValidationAnnotationPrefix+<check>.
type Validation struct {
	State  CheckState
	Reason string
}

// Passed reports whether the check no longer holds anything up.
func (v Validation) Passed() bool { return v.State == CheckReady || v.State == CheckSkipped }

// String is the annotation value: "ready", or "<state>: <reason>".
func (v Validation) String() string {
	if v.Reason == "" {
		return string(v.State)
	}
	return string(v.State) + ": " + v.Reason
}

// ParseValidation reads an annotation value written by Validation.String.
func ParseValidation(s string) (Validation, error) {
	state, reason, _ := strings.Cut(s, ":")
	v := Validation{State: CheckState(strings.TrimSpace(state)), Reason: strings.TrimSpace(reason)}
	switch v.State {
	case CheckReady, CheckSkipped, CheckWaiting, CheckFailed:
		return v, nil
	}
	return Validation{}, fmt.Errorf("validation %q: state must be ready, skipped, waiting or failed", s)
}

// DriverInstalls returns the patch recording that the node's next driver starts to install now
// (DriverSinceAnnotation).
func DriverInstalls(now string) Patch {
	var p Patch
	p.annotation(DriverSinceAnnotation, ptr(now))
	return p
}

// RecordDriverDigest returns the patch recording (DriverDigestAnnotation) the DRIVER_CONFIG_DIGEST of the driver
// the node runs or is about to install; empty when it is recorded already or digest is empty (nothing to say).
func RecordDriverDigest(node *corev1.Node, digest string) Patch {
	var p Patch
	if digest == "" || node.Annotations[DriverDigestAnnotation] == digest {
		return p
	}
	p.annotation(DriverDigestAnnotation, ptr(digest))
	return p
}

// SetValidation returns the patch recording check's outcome on a node.
func SetValidation(check string, v Validation) Patch {
	var p Patch
	p.annotation(ValidationAnnotationPrefix+check, ptr(v.String()))
	return p
}

// ShortDigest is a driver config digest as upgrade reasons and logs show it: its first 12 characters, "(none)"
// when empty.
func ShortDigest(digest string) string {
	if digest == "" {
		return "(none)"
	}
	return digest[:min(len(digest), 12)]
}

// ValidationSince is the time from which a validator pod that turned Ready vouches for the node's driver: when
// that driver started to install (DriverSinceAnnotation), or, on a node without that record, when the node
// entered its upgrade state (UpgradeSinceAnnotation). A missing or unreadable time is an error naming the node
// and the annotation: read as the zero time it would accept a validator that saw the old driver.
func ValidationSince(node *corev1.Node) (time.Time, error) {
	if raw, ok := node.Annotations[DriverSinceAnnotation]; ok {
		t, err := time.Parse(time.RFC3339, raw)
		if err != nil {
			return time.Time{}, malformed(node, DriverSinceAnnotation, raw, "is not an RFC 3339 time")
		}
		return t, nil
	}
	raw, ok := node.Annotations[UpgradeSinceAnnotation]
	if !ok {
		return time.Time{}, fmt.Errorf("node %s: annotation %s is missing: no time to validate the driver from", node.Name, UpgradeSinceAnnotation)
	}
	t, err := time.Parse(time.RFC3339, raw)
	if err != nil {
		return time.Time{}, malformed(node, UpgradeSinceAnnotation, raw, "is not an RFC 3339 time")
	}
	return t, nil
}
