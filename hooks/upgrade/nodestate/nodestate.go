// Package nodestate is the vocabulary the stack writes on Nodes, and the patches that write and undo it. The
// driver manager, the validator, the hooks and the admin commands all go through it, so that what one writes
// another can read, and the pre-delete hook can remove exactly what the stack put on a node and nothing else.
//
// Labels keep the GPU Operator's keys and values (users' automation reads them). The stack's own bookkeeping lives
// in annotations under one prefix, AnnotationPrefix, which nothing else writes: removing that prefix and undoing
// what it records returns a node to its state before install.
package nodestate

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

const (
	// DriverManagerLeaseLabel marks the per-node Leases the driver managers take in the release namespace, so the
	// pre-delete cleanup can find and remove them (their names derive from node names it may no longer see).
	DriverManagerLeaseLabel = "kube-gpu-stack.io/driver-manager-lease"
	// DeployLabelPrefix prefixes the per-operand switches nvidia.com/gpu.deploy.<operand>.
	DeployLabelPrefix = "nvidia.com/gpu.deploy."
	// DriverDeployLabel is the driver's switch; PreInstalled there means a host driver was found.
	DriverDeployLabel = DeployLabelPrefix + "driver"
	// Paused is the value a paused operand switch holds while the driver changes.
	Paused = "paused-for-driver-upgrade"
	// PreInstalled is DriverDeployLabel's value on a node whose driver is installed on the host.
	PreInstalled = "pre-installed"

	// UpgradeStateLabel shows each node's driver upgrade progress (`kubectl get nodes -L`).
	UpgradeStateLabel = "nvidia.com/gpu-driver-upgrade-state"
	// UpgradeSkipLabel=true (set by the admin) keeps the driver of that node as it is.
	UpgradeSkipLabel = "nvidia.com/gpu-driver-upgrade.skip"
	// AllocationLabel says how the node hands its GPUs to pods: AllocationDevicePlugin or AllocationDRA. The
	// device plugin's and the DRA kubelet plugin's DaemonSets are placed by it, so that moving one driver pool
	// changes only its own nodes' labels and no DaemonSet template. The driver manager writes it once no pod
	// holds the node's GPUs the other way (SetAllocation); an admin may write it on nodes no driver manager runs on.
	AllocationLabel = "nvidia.com/gpu.allocation"
	// AllocationDevicePlugin and AllocationDRA are AllocationLabel's values.
	AllocationDevicePlugin = "device-plugin"
	AllocationDRA          = "dra"

	// AnnotationPrefix prefixes every annotation the stack writes on a Node.
	AnnotationPrefix = "kube-gpu-stack.io/"
	// CordonedAnnotation records that the stack cordoned the node (its value says why), so it only ever
	// uncordons a cordon it made.
	CordonedAnnotation = AnnotationPrefix + "cordoned"
	// PausedLabelsAnnotation records, as a JSON object, each operand switch the stack paused and the value it had
	// before (null: absent), so a restore puts back exactly that.
	PausedLabelsAnnotation = AnnotationPrefix + "paused-labels"
	// PreInstalledAnnotation records that the stack set DriverDeployLabel=pre-installed, with the label's value
	// before as JSON (null: absent).
	PreInstalledAnnotation = AnnotationPrefix + "pre-installed"
	// UpgradeReasonAnnotation says why the node is in its upgrade state (always set for upgrade-failed).
	UpgradeReasonAnnotation = AnnotationPrefix + "upgrade-reason"
	// UpgradeSinceAnnotation is when the node entered its upgrade state (RFC 3339).
	UpgradeSinceAnnotation = AnnotationPrefix + "upgrade-since"
	// DriverSinceAnnotation is when the node's current driver started to install (RFC 3339): the driver manager
	// writes it when it hands the node, with no NVIDIA driver loaded, to the driver about to install. A validator
	// pod Ready since then vouches for that driver, also when the node reached validation-required later (a
	// driver pod deleted or retried after its validation timed out).
	DriverSinceAnnotation = AnnotationPrefix + "driver-since"
	// DriverDigestAnnotation is the DRIVER_CONFIG_DIGEST of the node's driver: the driver manager writes it when
	// it keeps the loaded driver (same digest) or hands the node to the driver about to install, so the node status
	// exporter can report which config each node runs without reading the host.
	DriverDigestAnnotation = AnnotationPrefix + "driver-config-digest"
	// SeededLabelsAnnotation records, as a JSON object, each label the stack set as a default on a node that had
	// none (Seed) and the value it set, so Cleanup removes a default nobody changed since.
	SeededLabelsAnnotation = AnnotationPrefix + "seeded-labels"
	// ValidationAnnotationPrefix + <check> holds a validator check's outcome, as written by FormatValidation.
	ValidationAnnotationPrefix = AnnotationPrefix + "validation."
)

// PausableOperands are the operand switches the driver manager pauses: the GPU clients that hold the driver open.
// The driver itself, the node status exporter and the VM-side managers that do not use the driver are left alone.
var PausableOperands = []string{
	"operator-validator", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm",
	"mig-manager", "sandbox-validator", "sandbox-device-plugin", "kata-sandbox-device-plugin", "vgpu-device-manager",
}

// Patch is a JSON merge patch on a Node: a nil value deletes a label or annotation.
type Patch struct {
	Labels        map[string]*string
	Annotations   map[string]*string
	Unschedulable *bool
}

// Empty reports whether the patch changes nothing.
func (p Patch) Empty() bool {
	return len(p.Labels) == 0 && len(p.Annotations) == 0 && p.Unschedulable == nil
}

// JSON renders the merge patch.
func (p Patch) JSON() []byte {
	meta := map[string]any{}
	if len(p.Labels) > 0 {
		meta["labels"] = p.Labels
	}
	if len(p.Annotations) > 0 {
		meta["annotations"] = p.Annotations
	}
	doc := map[string]any{}
	if len(meta) > 0 {
		doc["metadata"] = meta
	}
	if p.Unschedulable != nil {
		doc["spec"] = map[string]any{"unschedulable": *p.Unschedulable}
	}
	b, _ := json.Marshal(doc) // maps of strings and bools always marshal
	return b
}

func (p *Patch) label(k string, v *string) {
	if p.Labels == nil {
		p.Labels = map[string]*string{}
	}
	p.Labels[k] = v
}

func (p *Patch) annotation(k string, v *string) {
	if p.Annotations == nil {
		p.Annotations = map[string]*string{}
	}
	p.Annotations[k] = v
}

func ptr(s string) *string { return &s }

// SwitchOn says whether a gpu.deploy.* switch lets its operand run: absent, "true" or "" (the chart's node
// affinity, and the GPU Operator, take "" as absent; the CC manager writes it for switches it found absent).
func SwitchOn(v string, present bool) bool { return !present || v == "true" || v == "" }

// Pause returns the patch that pauses the given operands' switches on node: each one that is on (SwitchOn) becomes
// Paused, any other value (an admin's "false", another pause) is kept. The values before are recorded in
// PausedLabelsAnnotation, merged with an earlier record, so a pause repeated after a crash records the true
// originals and never "Paused".
func Pause(node *corev1.Node, operands []string) (Patch, error) {
	record, err := pausedRecord(node)
	if err != nil {
		return Patch{}, err
	}
	var p Patch
	for _, op := range operands {
		key := DeployLabelPrefix + op
		v, present := node.Labels[key]
		if !SwitchOn(v, present) {
			continue
		}
		if _, seen := record[key]; !seen {
			if present {
				record[key] = ptr(v)
			} else {
				record[key] = nil
			}
		}
		p.label(key, ptr(Paused))
	}
	if !p.Empty() {
		b, _ := json.Marshal(record)
		p.annotation(PausedLabelsAnnotation, ptr(string(b)))
	}
	return p, nil
}

// Resume returns the patch that puts back every switch recorded in PausedLabelsAnnotation (a switch someone
// changed since from Paused to another value is left as they set it) and drops the record.
func Resume(node *corev1.Node) (Patch, error) {
	record, err := pausedRecord(node)
	if err != nil {
		return Patch{}, err
	}
	var p Patch
	for _, key := range slices.Sorted(maps.Keys(record)) {
		if node.Labels[key] == Paused {
			p.label(key, record[key])
		}
	}
	if _, ok := node.Annotations[PausedLabelsAnnotation]; ok {
		p.annotation(PausedLabelsAnnotation, nil)
	}
	return p, nil
}

// pausedRecord reads PausedLabelsAnnotation. An empty value or JSON null records nothing (a record that names
// nothing restores nothing); any other value that is not an object of operand switches to strings or null is an
// error naming the node and the annotation, since restoring from it would write labels nobody recorded.
func pausedRecord(node *corev1.Node) (map[string]*string, error) {
	record := map[string]*string{}
	raw, ok := node.Annotations[PausedLabelsAnnotation]
	if !ok {
		return record, nil
	}
	if err := readJSON(node, PausedLabelsAnnotation, raw, &record, "a JSON object of label values (string or null)"); err != nil {
		return nil, err
	}
	if record == nil { // null
		record = map[string]*string{}
	}
	for key := range record {
		if !strings.HasPrefix(key, DeployLabelPrefix) {
			return nil, malformed(node, PausedLabelsAnnotation, raw, "records label "+key+", which is not a "+DeployLabelPrefix+"* switch")
		}
	}
	return record, nil
}

// readJSON decodes an annotation's JSON value into v; blank decodes as null (v unchanged).
func readJSON(node *corev1.Node, key, raw string, v any, want string) error {
	if strings.TrimSpace(raw) == "" {
		return nil
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return malformed(node, key, raw, "is not "+want+": "+err.Error())
	}
	return nil
}

// malformed is the error for an annotation the stack cannot read: it names the node, the annotation and (cut
// short) what it holds, so the admin can fix or remove it.
func malformed(node *corev1.Node, key, raw, why string) error {
	if len(raw) > 80 {
		raw = raw[:77] + "..."
	}
	return fmt.Errorf("node %s: annotation %s=%q %s; fix or remove it (kubectl annotate node %s %s-)", node.Name, key, raw, why, node.Name, key)
}

// Cordon returns the patch that cordons node and records the cordon as the stack's (reason says why). A node
// that is already unschedulable without our record was cordoned by someone else: nothing is recorded, so Uncordon
// leaves it cordoned.
func Cordon(node *corev1.Node, reason string) Patch {
	var p Patch
	if node.Spec.Unschedulable {
		return p
	}
	t := true
	p.Unschedulable = &t
	p.annotation(CordonedAnnotation, ptr(reason))
	return p
}

// CordonedByUs reports whether the node's cordon is one the stack made.
func CordonedByUs(node *corev1.Node) bool {
	_, ok := node.Annotations[CordonedAnnotation]
	return ok
}

// Uncordon returns the patch that lifts the stack's own cordon and drops its record; any other cordon stays.
func Uncordon(node *corev1.Node) Patch {
	var p Patch
	if !CordonedByUs(node) {
		return p
	}
	if node.Spec.Unschedulable {
		f := false
		p.Unschedulable = &f
	}
	p.annotation(CordonedAnnotation, nil)
	return p
}

// MarkPreInstalled returns the patch that sets DriverDeployLabel=pre-installed (so no driver pod runs there) and
// records the value before.
func MarkPreInstalled(node *corev1.Node) Patch {
	var p Patch
	v, present := node.Labels[DriverDeployLabel]
	if v == PreInstalled {
		return p
	}
	before := "null"
	if present {
		b, _ := json.Marshal(v)
		before = string(b)
	}
	p.label(DriverDeployLabel, ptr(PreInstalled))
	p.annotation(PreInstalledAnnotation, ptr(before))
	return p
}

// SetUpgradeState returns the patch that moves the node to state, with its reason (empty: none) and the time it
// entered it (only written when the state changes, so a repeated write keeps the first time).
func SetUpgradeState(node *corev1.Node, state UpgradeState, reason, now string) Patch {
	var p Patch
	if node.Labels[UpgradeStateLabel] != string(state) {
		p.label(UpgradeStateLabel, ptr(string(state)))
		p.annotation(UpgradeSinceAnnotation, ptr(now))
	}
	if reason == "" {
		if _, ok := node.Annotations[UpgradeReasonAnnotation]; ok {
			p.annotation(UpgradeReasonAnnotation, nil)
		}
	} else if node.Annotations[UpgradeReasonAnnotation] != reason {
		p.annotation(UpgradeReasonAnnotation, ptr(reason))
	}
	return p
}

// Seed returns the patch that sets label key to value on a node where it is absent or empty (the stack's default,
// e.g. nvidia.com/mig.config for the MIG manager, which acts on nothing else), recorded in SeededLabelsAnnotation.
// A node with a value keeps it: the patch is empty.
func Seed(node *corev1.Node, key, value string) (Patch, error) {
	var p Patch
	if node.Labels[key] != "" {
		return p, nil
	}
	record, err := seededRecord(node)
	if err != nil {
		return Patch{}, err
	}
	record[key] = value
	b, _ := json.Marshal(record)
	p.label(key, ptr(value))
	p.annotation(SeededLabelsAnnotation, ptr(string(b)))
	return p, nil
}

// Unseed returns the patch that takes back a label Seed set: removed, with its record, while it still has the
// seeded value; a label someone changed since only loses its record. A label never seeded is left alone.
func Unseed(node *corev1.Node, key string) (Patch, error) {
	var p Patch
	record, err := seededRecord(node)
	if err != nil {
		return Patch{}, err
	}
	v, ok := record[key]
	if !ok {
		return p, nil
	}
	if node.Labels[key] == v {
		p.label(key, nil)
	}
	delete(record, key)
	b, _ := json.Marshal(record)
	p.annotation(SeededLabelsAnnotation, ptr(string(b)))
	return p, nil
}

// Seeded reports whether label key holds the value the stack seeded (Seed) and nobody changed since.
func Seeded(node *corev1.Node, key string) (bool, error) {
	v, recorded, err := SeedOf(node, key)
	return recorded && node.Labels[key] == v, err
}

// SeedOf is the value the stack seeded label key with, and whether it has a record of one (changed since or not).
func SeedOf(node *corev1.Node, key string) (string, bool, error) {
	record, err := seededRecord(node)
	if err != nil {
		return "", false, err
	}
	v, ok := record[key]
	return v, ok, nil
}

// SetAllocation returns the patch that sets AllocationLabel to mode, recorded in SeededLabelsAnnotation like a
// seeded default, so Cleanup removes it unless someone changed it since. Its caller has moved the pods that held the
// node's GPUs the other way.
func SetAllocation(node *corev1.Node, mode string) (Patch, error) {
	var p Patch
	record, err := seededRecord(node)
	if err != nil {
		return Patch{}, err
	}
	if node.Labels[AllocationLabel] == mode && record[AllocationLabel] == mode {
		return p, nil
	}
	record[AllocationLabel] = mode
	b, _ := json.Marshal(record)
	p.label(AllocationLabel, ptr(mode))
	p.annotation(SeededLabelsAnnotation, ptr(string(b)))
	return p, nil
}

// seededRecord reads SeededLabelsAnnotation; empty or null records nothing.
func seededRecord(node *corev1.Node) (map[string]string, error) {
	record := map[string]string{}
	if raw, ok := node.Annotations[SeededLabelsAnnotation]; ok {
		if err := readJSON(node, SeededLabelsAnnotation, raw, &record, "a JSON object of strings"); err != nil {
			return nil, err
		}
	}
	if record == nil { // null
		record = map[string]string{}
	}
	return record, nil
}

// Cleanup returns the patch that removes everything the stack put on node: paused switches restored, the
// stack's cordon lifted, a pre-installed mark it made undone, defaults it seeded and nobody changed removed, the upgrade state label dropped, the
// opt-out label of a driver change it put on removed, and every
// annotation under AnnotationPrefix removed. Labels and annotations it never wrote are not touched.
func Cleanup(node *corev1.Node) (Patch, error) {
	p, err := Resume(node)
	if err != nil {
		return Patch{}, err
	}
	if raw, ok := node.Annotations[PreInstalledAnnotation]; ok && node.Labels[DriverDeployLabel] == PreInstalled {
		// Blank is no record of the value before, so unlike null (absent before) it is an error: guessing would
		// remove or keep an admin's label.
		var before *string
		if strings.TrimSpace(raw) == "" {
			return Patch{}, malformed(node, PreInstalledAnnotation, raw, "is empty, not the label's value before as a JSON string or null")
		}
		if err := readJSON(node, PreInstalledAnnotation, raw, &before, "a JSON string or null"); err != nil {
			return Patch{}, err
		}
		p.label(DriverDeployLabel, before)
	}
	if _, ok := node.Labels[UpgradeStateLabel]; ok {
		p.label(UpgradeStateLabel, nil)
	}
	if _, ok := node.Labels[RevertLabel]; ok {
		p.label(RevertLabel, nil)
	}
	seeded, err := seededRecord(node)
	if err != nil {
		return Patch{}, err
	}
	for key, v := range seeded {
		if node.Labels[key] == v {
			p.label(key, nil)
		}
	}
	// an opt-out label a driver change put on and an uninstall interrupted
	for k, v := range EndMaintenanceLabel(node).Labels {
		p.label(k, v)
	}
	u := Uncordon(node)
	p.Unschedulable = u.Unschedulable
	for k := range node.Annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			p.annotation(k, nil)
		}
	}
	return p, nil
}

// Merge combines patches into one write; later ones win on the same key.
func Merge(ps ...Patch) Patch {
	var out Patch
	for _, p := range ps {
		for k, v := range p.Labels {
			out.label(k, v)
		}
		for k, v := range p.Annotations {
			out.annotation(k, v)
		}
		if p.Unschedulable != nil {
			out.Unschedulable = p.Unschedulable
		}
	}
	return out
}
