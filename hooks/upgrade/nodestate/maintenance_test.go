package nodestate

import (
	"testing"
)

// UnderMaintenance is a driver change from its cordon to its uncordon, or a pending MIG reconfiguration; a queued
// or failed driver change, and a MIG change that is over, are not.
func TestUnderMaintenance(t *testing.T) {
	for labels, want := range map[[2]string]string{
		{string(CordonRequired), ""}:       DriverChange,
		{string(PodRestartRequired), ""}:   DriverChange,
		{string(ValidationRequired), ""}:   DriverChange,
		{string(UncordonRequired), ""}:     DriverChange,
		{string(UpgradeRequired), ""}:      "",
		{string(UpgradeDone), ""}:          "",
		{string(UpgradeFailed), ""}:        "",
		{string(UpgradeDone), "pending"}:   MIGChange,
		{string(UpgradeDone), "success"}:   "",
		{string(UpgradeFailed), "pending"}: MIGChange,
		{"", "failed"}:                     "",
	} {
		n := node(map[string]string{UpgradeStateLabel: labels[0], MIGConfigStateLabel: labels[1]}, false)
		if got, ok := UnderMaintenance(n); got != want || ok != (want != "") {
			t.Errorf("%v: %q %v, want %q", labels, got, ok, want)
		}
	}
}

// The opt-out label goes on only where the key is absent, and only what went on comes off.
func TestMaintenanceLabelTakesOffOnlyItsOwn(t *testing.T) {
	const key = "remediation.example.com/skip"
	n := apply(node(nil, false), BeginMaintenanceLabel(node(nil, false), key, "true"))
	if n.Labels[key] != "true" || n.Annotations[MaintenanceLabelAnnotation] != key {
		t.Fatalf("begin: labels %v annotations %v", n.Labels, n.Annotations)
	}
	n = apply(n, EndMaintenanceLabel(n))
	if _, ok := n.Labels[key]; ok || n.Annotations[MaintenanceLabelAnnotation] != "" {
		t.Fatalf("end: labels %v annotations %v", n.Labels, n.Annotations)
	}
	admins := node(map[string]string{key: "admin"}, false)
	if p := BeginMaintenanceLabel(admins, key, "true"); !p.Empty() {
		t.Errorf("begin over the admin's label: %s", p.JSON())
	}
	if p := EndMaintenanceLabel(admins); !p.Empty() {
		t.Errorf("end took the admin's label: %s", p.JSON())
	}
	if p := BeginMaintenanceLabel(n, "", ""); !p.Empty() {
		t.Errorf("no key configured: %s", p.JSON())
	}
	for _, bad := range []string{"novalue", "=x"} {
		if _, _, err := ParseMaintenanceLabel(bad); err == nil {
			t.Errorf("ParseMaintenanceLabel(%q) passed", bad)
		}
	}
}
