package nodestate

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// A driver change whose new driver never validates goes back, on its node, to the driver that last validated there.
// The pre-upgrade plan keeps a copy of each changing driver DaemonSet as it was (its revert DaemonSet, one per driver
// config digest, selecting RevertLabel=<that digest's ShortDigest>); the failed node's upgrade gate labels its own
// node for the copy of its last validated driver, which takes the node out of its driver DaemonSet (whose template
// requires the label absent) and into the copy's. The copy's pod installs that driver again, validates it and
// uncordons. The node then counts as failed for its pool (Reverted) until `upgrade retry` or a plan for another
// driver takes it back.
const (
	// RevertLabel=<ShortDigest of a driver config> puts the node under the revert DaemonSet of that driver.
	RevertLabel = "kube-gpu-stack.io/driver-revert"
	// RevertedAnnotation records the revert (Revert, as JSON): which driver failed and why. With it the node counts as
	// a failed node of its pool; without it (a plan that moved the pool back to the driver the node reverted to
	// takes it away) the node only runs its driver from the revert DaemonSet until its next change.
	RevertedAnnotation = AnnotationPrefix + "driver-reverted"
	// ValidatedDigestAnnotation is the DRIVER_CONFIG_DIGEST of the last driver that validated on the node (written
	// with upgrade-done): what a failed change reverts to.
	ValidatedDigestAnnotation = AnnotationPrefix + "driver-validated-digest"
)

// Revert is RevertedAnnotation's record.
type Revert struct {
	// From is the driver config that failed validation; To the one the node went back to.
	From string `json:"from"`
	To   string `json:"to"`
	// DaemonSet is the revert DaemonSet that runs To on the node.
	DaemonSet string `json:"daemonSet"`
	// Reason is why From failed (the gate's validation timeout).
	Reason string `json:"reason"`
	// At is when the gate reverted (RFC 3339).
	At string `json:"at"`
}

// ReadRevert returns the node's revert record: nil without one, an error when it cannot be read.
func ReadRevert(node *corev1.Node) (*Revert, error) {
	raw, ok := node.Annotations[RevertedAnnotation]
	if !ok {
		return nil, nil
	}
	var r Revert
	if err := json.Unmarshal([]byte(raw), &r); err != nil || r.From == "" {
		return nil, malformed(node, RevertedAnnotation, raw, "is not a revert record (a JSON object with from, to, daemonSet, reason, at)")
	}
	return &r, nil
}

// Reverted says whether the node's last driver change failed and was reverted, which counts as a failed node of its
// pool. A record that cannot be read counts too: damage never lifts a hold.
func Reverted(node *corev1.Node) bool {
	_, ok := node.Annotations[RevertedAnnotation]
	return ok && node.Labels[RevertLabel] != ""
}

// StartRevert returns the patch that puts node under the revert DaemonSet of r.To, with the record.
func StartRevert(node *corev1.Node, r Revert) Patch {
	var p Patch
	b, _ := json.Marshal(r) // strings always marshal
	p.label(RevertLabel, ptr(ShortDigest(r.To)))
	p.annotation(RevertedAnnotation, ptr(string(b)))
	return p
}

// EndRevert returns the patch that takes the node back from its revert DaemonSet to its driver DaemonSet, record and
// all (empty on a node not reverted).
func EndRevert(node *corev1.Node) Patch {
	var p Patch
	if _, ok := node.Labels[RevertLabel]; ok {
		p.label(RevertLabel, nil)
	}
	if _, ok := node.Annotations[RevertedAnnotation]; ok {
		p.annotation(RevertedAnnotation, nil)
	}
	return p
}

// ForgetRevert returns the patch that drops the revert record only: the node keeps its driver from the revert
// DaemonSet, no longer counted as failed (its pool went back to that driver).
func ForgetRevert(node *corev1.Node) Patch {
	var p Patch
	if _, ok := node.Annotations[RevertedAnnotation]; ok {
		p.annotation(RevertedAnnotation, nil)
	}
	return p
}

// SetValidated returns the patch that records digest as the last driver that validated on the node (empty digest:
// nothing known, no patch).
func SetValidated(node *corev1.Node, digest string) Patch {
	var p Patch
	if digest != "" && node.Annotations[ValidatedDigestAnnotation] != digest {
		p.annotation(ValidatedDigestAnnotation, ptr(digest))
	}
	return p
}

// RevertSummary is one line on a reverted node for `upgrade status` and the release's result.
func RevertSummary(node *corev1.Node) string {
	r, err := ReadRevert(node)
	switch {
	case err != nil:
		return err.Error()
	case r == nil:
		return ""
	}
	return fmt.Sprintf("reverted: driver config %s failed validation (%s); back on %s (DaemonSet %s) since %s",
		ShortDigest(r.From), r.Reason, ShortDigest(r.To), r.DaemonSet, r.At)
}
