package nodestate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// badValues are values anyone could write into an annotation the stack reads.
var badValues = []string{"null", "", " ", "not json", "[]", `["a"]`, "1", `"x"`, "true", `{"` + DeployLabelPrefix + `dcgm": 1}`,
	`{"` + DeployLabelPrefix + `dcgm": {}}`, `{"` + DeployLabelPrefix + `dcgm": ["true"]}`, `{"kubernetes.io/hostname": null}`, "{", `{}`}

// readers are every function of this package that reads a stack annotation off a node.
var readers = map[string]func(*corev1.Node) error{
	"Pause":  func(n *corev1.Node) error { _, err := Pause(n, PausableOperands); return err },
	"Resume": func(n *corev1.Node) error { _, err := Resume(n); return err },
	"Cleanup": func(n *corev1.Node) error {
		_, err := Cleanup(n)
		return err
	},
	"Seed":            func(n *corev1.Node) error { _, err := Seed(n, "nvidia.com/mig.config", "all-disabled"); return err },
	"Unseed":          func(n *corev1.Node) error { _, err := Unseed(n, UpgradeSkipLabel); return err },
	"Seeded":          func(n *corev1.Node) error { _, err := Seeded(n, UpgradeSkipLabel); return err },
	"ValidationSince": func(n *corev1.Node) error { _, err := ValidationSince(n); return err },
}

// TestMalformedAnnotationsNeverPanic: whatever sits in an annotation the stack reads, every reader either treats it
// as empty (where that is safe) or returns an error naming the node and the annotation; none panics.
func TestMalformedAnnotationsNeverPanic(t *testing.T) {
	annotations := []string{PausedLabelsAnnotation, SeededLabelsAnnotation, PreInstalledAnnotation, UpgradeSinceAnnotation,
		DriverSinceAnnotation, CordonedAnnotation, UpgradeReasonAnnotation}
	for _, key := range annotations {
		for _, raw := range badValues {
			n := node(map[string]string{DeployLabelPrefix + "dcgm": Paused, DriverDeployLabel: PreInstalled,
				UpgradeStateLabel: string(ValidationRequired)}, false)
			n.Annotations[UpgradeSinceAnnotation] = "2026-09-01T12:00:00Z"
			n.Annotations[key] = raw
			for name, read := range readers {
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("%s with %s=%q panicked: %v", name, key, raw, r)
						}
					}()
					if err := read(n); err != nil && (!strings.Contains(err.Error(), "node "+n.Name+":") || !strings.Contains(err.Error(), key)) {
						t.Errorf("%s with %s=%q: error %q names neither the node nor the annotation", name, key, raw, err)
					}
				}()
			}
		}
	}
}

// TestMalformedAnnotationsAnswer pins what each reader makes of the values that matter: null and empty records are
// empty (nothing recorded is nothing to restore), anything else that is not the documented shape is an error.
func TestMalformedAnnotationsAnswer(t *testing.T) {
	for _, c := range []struct {
		read, key, raw string
		ok             bool
	}{
		{"Pause", PausedLabelsAnnotation, "null", true},
		{"Pause", PausedLabelsAnnotation, "", true},
		{"Pause", PausedLabelsAnnotation, " ", true},
		{"Resume", PausedLabelsAnnotation, "null", true},
		{"Pause", PausedLabelsAnnotation, "not json", false},
		{"Resume", PausedLabelsAnnotation, "[]", false},
		{"Resume", PausedLabelsAnnotation, `{"` + DeployLabelPrefix + `dcgm": 1}`, false},
		// a record may only restore operand switches
		{"Resume", PausedLabelsAnnotation, `{"kubernetes.io/hostname": null}`, false},
		{"Seed", SeededLabelsAnnotation, "null", true},
		{"Seed", SeededLabelsAnnotation, "", true},
		{"Seed", SeededLabelsAnnotation, `{"a": 1}`, false},
		{"Cleanup", PreInstalledAnnotation, "null", true},
		{"Cleanup", PreInstalledAnnotation, `"true"`, true},
		{"Cleanup", PreInstalledAnnotation, "", false},
		{"Cleanup", PreInstalledAnnotation, "1", false},
		{"ValidationSince", UpgradeSinceAnnotation, "2026-09-01T12:00:00Z", true},
		{"ValidationSince", UpgradeSinceAnnotation, "", false},
		{"ValidationSince", UpgradeSinceAnnotation, "yesterday", false},
		{"ValidationSince", DriverSinceAnnotation, "2026-09-01T11:00:00Z", true},
		{"ValidationSince", DriverSinceAnnotation, "", false},
		{"ValidationSince", DriverSinceAnnotation, "yesterday", false},
	} {
		n := node(map[string]string{DeployLabelPrefix + "dcgm": Paused, DriverDeployLabel: PreInstalled}, false)
		n.Annotations[UpgradeSinceAnnotation] = "2026-09-01T12:00:00Z"
		n.Annotations[c.key] = c.raw
		err := readers[c.read](n)
		if (err == nil) != c.ok {
			t.Errorf("%s with %s=%q: err = %v, want ok=%v", c.read, c.key, c.raw, err, c.ok)
		}
	}
}

// FuzzPausedLabels: no content of the pause record makes Pause, Resume or Cleanup panic; an unreadable record is
// an error naming it; a readable one restores only operand switches and is dropped by Resume.
func FuzzPausedLabels(f *testing.F) {
	for _, s := range badValues {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n := node(map[string]string{DeployLabelPrefix + "dcgm": Paused, DeployLabelPrefix + "device-plugin": "true"}, false)
		n.Annotations[PausedLabelsAnnotation] = raw
		p, err := Pause(n, PausableOperands)
		if err != nil {
			if !strings.Contains(err.Error(), PausedLabelsAnnotation) {
				t.Fatalf("Pause error %q does not name the annotation", err)
			}
			return
		}
		n = apply(n, p)
		r, err := Resume(n)
		if err != nil {
			t.Fatalf("Resume failed on the record Pause wrote (%q): %v", n.Annotations[PausedLabelsAnnotation], err)
		}
		for k := range r.Labels {
			if !strings.HasPrefix(k, DeployLabelPrefix) {
				t.Fatalf("Resume of %q writes label %s", raw, k)
			}
		}
		after := apply(n, r)
		if _, ok := after.Annotations[PausedLabelsAnnotation]; ok {
			t.Fatalf("Resume left the record")
		}
		if after.Labels[DeployLabelPrefix+"device-plugin"] == Paused {
			t.Fatalf("Resume of %q left device-plugin paused", raw)
		}
		if _, err := Cleanup(after); err != nil {
			t.Fatalf("Cleanup after Resume: %v", err)
		}
	})
}
