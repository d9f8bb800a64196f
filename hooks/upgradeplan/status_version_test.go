package upgradeplan

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestDriverVersionAndDowngrade(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{{Image: "nvcr.io/nvidia/driver:600.10.01-ubuntu22.04"}, {Image: "gate:1"}}}
	if v := DriverVersion(spec); v != "600.10.01-ubuntu22.04" {
		t.Errorf("DriverVersion = %q", v)
	}
	for _, c := range []struct {
		from, to string
		want     bool
	}{
		{"600.10.01-ubuntu22.04", "595.91.07-ubuntu22.04", true},
		{"595.91.07-ubuntu22.04", "600.10.01-ubuntu22.04", false},
		{"580.95.05-rhel9", "580.95.05-rhel9", false},
		{"sha256:0123", "595.91.07-ubuntu22.04", false}, // pinned by digest alone: no version to compare
	} {
		if got := Downgrade(c.from, c.to); got != c.want {
			t.Errorf("Downgrade(%s, %s) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
