package nodestate

import (
	"encoding/json"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// apply plays a merge patch onto a node in memory, as the API server would.
func apply(n *corev1.Node, p Patch) *corev1.Node {
	out := n.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	for k, v := range p.Labels {
		if v == nil {
			delete(out.Labels, k)
		} else {
			out.Labels[k] = *v
		}
	}
	for k, v := range p.Annotations {
		if v == nil {
			delete(out.Annotations, k)
		} else {
			out.Annotations[k] = *v
		}
	}
	if p.Unschedulable != nil {
		out.Spec.Unschedulable = *p.Unschedulable
	}
	return out
}

func node(labels map[string]string, unschedulable bool) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels, Annotations: map[string]string{"admin/note": "x"}},
		Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
}

func TestPauseResumeRestoresExactly(t *testing.T) {
	before := node(map[string]string{
		DeployLabelPrefix + "device-plugin": "true",  // explicit true: comes back as true
		DeployLabelPrefix + "dcgm":          "false", // admin opt-out: never touched
		DeployLabelPrefix + "dcgm-exporter": "",      // empty counts as absent: paused, and comes back empty
		"other":                             "kept",
	}, false)
	p, err := Pause(before, []string{"device-plugin", "dcgm", "dcgm-exporter", "container-toolkit"})
	if err != nil {
		t.Fatal(err)
	}
	paused := apply(before, p)
	for op, want := range map[string]string{"device-plugin": Paused, "dcgm": "false", "dcgm-exporter": Paused, "container-toolkit": Paused} {
		if got := paused.Labels[DeployLabelPrefix+op]; got != want {
			t.Errorf("paused %s = %q, want %q", op, got, want)
		}
	}
	// a second pause after a crash must not record "paused" as the original value
	p2, err := Pause(paused, []string{"device-plugin", "dcgm", "dcgm-exporter", "container-toolkit"})
	if err != nil {
		t.Fatal(err)
	}
	paused = apply(paused, p2)
	r, err := Resume(paused)
	if err != nil {
		t.Fatal(err)
	}
	after := apply(paused, r)
	if !maps.Equal(after.Labels, before.Labels) || !maps.Equal(after.Annotations, before.Annotations) {
		t.Errorf("pause+resume changed the node:\nlabels %v -> %v\nannotations %v -> %v", before.Labels, after.Labels, before.Annotations, after.Annotations)
	}
}

func TestResumeKeepsAValueSomeoneChangedSince(t *testing.T) {
	n := node(nil, false)
	n = apply(n, mustPause(t, n, "device-plugin"))
	n.Labels[DeployLabelPrefix+"device-plugin"] = "false" // the admin opted the node out meanwhile
	r, _ := Resume(n)
	if got := apply(n, r).Labels[DeployLabelPrefix+"device-plugin"]; got != "false" {
		t.Errorf("resume overwrote the admin's value: %q", got)
	}
}

func mustPause(t *testing.T, n *corev1.Node, ops ...string) Patch {
	t.Helper()
	p, err := Pause(n, ops)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCordonOnlyLiftsOurOwn(t *testing.T) {
	admin := node(nil, true)
	if p := Cordon(admin, "driver upgrade"); !p.Empty() {
		t.Fatalf("cordoning an admin-cordoned node recorded a cordon: %s", p.JSON())
	}
	if p := Uncordon(admin); !p.Empty() {
		t.Fatalf("uncordon lifted an admin's cordon: %s", p.JSON())
	}
	free := node(nil, false)
	cordoned := apply(free, Cordon(free, "driver upgrade"))
	if !cordoned.Spec.Unschedulable || !CordonedByUs(cordoned) {
		t.Fatalf("cordon did not cordon and record: %+v", cordoned)
	}
	back := apply(cordoned, Uncordon(cordoned))
	if back.Spec.Unschedulable || CordonedByUs(back) || !maps.Equal(back.Annotations, free.Annotations) {
		t.Errorf("uncordon left %+v", back)
	}
}

func TestCleanupUndoesEverythingTheStackWrote(t *testing.T) {
	before := node(map[string]string{DriverDeployLabel: "true", "nvidia.com/gpu.present": "true"}, false)
	n := apply(before, mustPause(t, before, PausableOperands...))
	n = apply(n, Cordon(n, "driver upgrade"))
	n = apply(n, MarkPreInstalled(n))
	n = apply(n, SetUpgradeState(n, UpgradeFailed, "PDB blocks eviction", "2026-01-01T00:00:00Z"))
	n = apply(n, SetValidation("driver", Validation{CheckFailed, "nvidia-smi failed"}))
	n = apply(n, BeginMaintenanceLabel(n, "remediation.example.com/skip", "true"))
	seed, err := Seed(n, "nvidia.com/mig.config", "all-disabled")
	if err != nil {
		t.Fatal(err)
	}
	n = apply(n, seed)
	c, err := Cleanup(n)
	if err != nil {
		t.Fatal(err)
	}
	after := apply(n, c)
	if !maps.Equal(after.Labels, before.Labels) || !maps.Equal(after.Annotations, before.Annotations) || after.Spec.Unschedulable {
		t.Errorf("cleanup left:\nlabels %v (want %v)\nannotations %v (want %v)\nunschedulable %v",
			after.Labels, before.Labels, after.Annotations, before.Annotations, after.Spec.Unschedulable)
	}
	// an admin's own pre-installed label and cordon are not ours to remove
	admin := node(map[string]string{DriverDeployLabel: PreInstalled}, true)
	if c, _ := Cleanup(admin); !c.Empty() {
		t.Errorf("cleanup touched an admin's marks: %s", c.JSON())
	}
}

// TestSeedSetsOnlyAMissingLabel: Seed sets a default label where there is none (or it is empty), never over a value,
// and Cleanup removes a seeded default only while it still holds the value the stack set.
func TestSeedSetsOnlyAMissingLabel(t *testing.T) {
	const key = "nvidia.com/mig.config"
	for _, labels := range []map[string]string{nil, {key: ""}} {
		n := node(labels, false)
		p, err := Seed(n, key, "all-disabled")
		if err != nil {
			t.Fatal(err)
		}
		if got := apply(n, p).Labels[key]; got != "all-disabled" {
			t.Errorf("labels %v: seeded %q, want all-disabled", labels, got)
		}
	}
	admin := node(map[string]string{key: "all-1g.10gb"}, false)
	if p, err := Seed(admin, key, "all-disabled"); err != nil || !p.Empty() {
		t.Errorf("seed over the admin's value: %s, %v", p.JSON(), err)
	}
	// seeded, then changed by the admin: cleanup keeps the admin's value
	n := node(nil, false)
	p, _ := Seed(n, key, "all-disabled")
	n = apply(n, p)
	n.Labels[key] = "all-balanced"
	c, err := Cleanup(n)
	if err != nil {
		t.Fatal(err)
	}
	if got := apply(n, c).Labels[key]; got != "all-balanced" {
		t.Errorf("cleanup changed the admin's %s to %q", key, got)
	}
}

func TestPatchJSONDeletesWithNull(t *testing.T) {
	var p Patch
	p.label("a", nil)
	p.annotation("b", ptr("v"))
	var doc map[string]map[string]map[string]*string
	if err := json.Unmarshal(p.JSON(), &doc); err != nil {
		t.Fatal(err)
	}
	if v, ok := doc["metadata"]["labels"]["a"]; !ok || v != nil {
		t.Errorf("label deletion not encoded as null: %s", p.JSON())
	}
}

func TestValidationRoundTrip(t *testing.T) {
	for _, v := range []Validation{{CheckReady, ""}, {CheckFailed, "nvidia-smi: exit 9: couldn't communicate: with the driver"}} {
		got, err := ParseValidation(v.String())
		if err != nil || got != v {
			t.Errorf("%q parsed as %+v, %v", v.String(), got, err)
		}
	}
	if _, err := ParseValidation("bogus: x"); err == nil {
		t.Error("an unknown state parsed")
	}
}

// TestSetAllocationIsCleanedUpUnlessChanged: the allocation label the driver manager writes (over an earlier value
// too: a pool that moved) goes on uninstall; one an admin set (or changed since) stays.
func TestSetAllocationIsCleanedUpUnlessChanged(t *testing.T) {
	n := node(map[string]string{AllocationLabel: AllocationDevicePlugin}, false)
	p, err := SetAllocation(n, AllocationDRA)
	if err != nil {
		t.Fatal(err)
	}
	n = apply(n, p)
	if n.Labels[AllocationLabel] != AllocationDRA {
		t.Fatalf("allocation %q, want dra", n.Labels[AllocationLabel])
	}
	if again, _ := SetAllocation(n, AllocationDRA); !again.Empty() {
		t.Errorf("a repeated write is not empty: %s", again.JSON())
	}
	c, err := Cleanup(n)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := apply(n, c).Labels[AllocationLabel]; ok {
		t.Errorf("cleanup left %s=%s", AllocationLabel, v)
	}
	admin := node(map[string]string{AllocationLabel: AllocationDRA}, false)
	if c, _ := Cleanup(admin); !c.Empty() {
		t.Errorf("cleanup touched an admin's allocation label: %s", c.JSON())
	}
	n.Labels[AllocationLabel] = AllocationDevicePlugin // changed by the admin after we wrote it
	c, _ = Cleanup(n)
	if got := apply(n, c).Labels[AllocationLabel]; got != AllocationDevicePlugin {
		t.Errorf("cleanup changed the admin's allocation to %q", got)
	}
}

// The digest record changes only when the digest does, and an empty digest (a driver pod without one) records
// nothing; Cleanup removes it with every other annotation of the stack.
func TestRecordDriverDigest(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
	p := RecordDriverDigest(n, "sha256:aaa")
	n = apply(n, p)
	if got := n.Annotations[DriverDigestAnnotation]; got != "sha256:aaa" {
		t.Fatalf("digest recorded as %q", got)
	}
	if p := RecordDriverDigest(n, "sha256:aaa"); !p.Empty() {
		t.Fatalf("same digest patches again: %s", p.JSON())
	}
	if p := RecordDriverDigest(n, ""); !p.Empty() {
		t.Fatalf("empty digest patches: %s", p.JSON())
	}
	n = apply(n, RecordDriverDigest(n, "sha256:bbb"))
	if got := n.Annotations[DriverDigestAnnotation]; got != "sha256:bbb" {
		t.Fatalf("new digest recorded as %q", got)
	}
	c, err := Cleanup(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := apply(n, c).Annotations[DriverDigestAnnotation]; ok {
		t.Fatal("Cleanup keeps the digest record")
	}
}

// UpgradeSinceAnnotation is the time of the last state change (the node status exporter reports the time in the
// state from it): written with each change, kept when the same state is written again.
func TestUpgradeSinceMovesOnlyWithTheState(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}}
	n = apply(n, SetUpgradeState(n, CordonRequired, "", "2026-01-01T00:00:00Z"))
	n = apply(n, SetUpgradeState(n, CordonRequired, "", "2026-01-01T00:05:00Z"))
	if got := n.Annotations[UpgradeSinceAnnotation]; got != "2026-01-01T00:00:00Z" {
		t.Fatalf("since %q after writing the same state again, want the first time", got)
	}
	n = apply(n, SetUpgradeState(n, PodDeletionRequired, "", "2026-01-01T00:07:00Z"))
	if got := n.Annotations[UpgradeSinceAnnotation]; got != "2026-01-01T00:07:00Z" {
		t.Fatalf("since %q after a state change, want its time", got)
	}
}
