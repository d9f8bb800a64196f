package upgradeplan

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// A node the pool's upgradePolicy.hold lists keeps its driver: the plan labels it with the skip label as the
// release's own (so the driver manager, the old pod's gate and the canary hold it as they hold a labelled node),
// lists it as held by the values, and neither marks nor plans it. Taken off the list, the next plan takes the label
// away and plans its change in that same run. A skip label the admin set is never touched.
func TestValuesHoldNodesOnTheirDriver(t *testing.T) {
	admins := readyNode("c", map[string]string{nodestate.UpgradeSkipLabel: "true"})
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", nil), admins,
		driverPod("a", "old"), driverPod("b", "old"), driverPod("c", "old"))
	pools := pool("new", intstr.FromInt32(1))
	pools[0].Hold = []string{"b", "gone"} // a listed node that does not exist holds nothing

	out, err := runAt(t, client, pools, time.Unix(100, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b := node(t, client, "b")
	if b.Labels[nodestate.UpgradeSkipLabel] != "true" || b.Labels[nodestate.UpgradeStateLabel] != "" || b.Annotations[canary.MarkAnnotation] != "" {
		t.Fatalf("held node b: labels %v, annotations %v; want the skip label, no state, no mark", b.Labels, b.Annotations)
	}
	for _, want := range []string{
		"pre-upgrade: node b held (driver.upgradePolicy.hold): labelled nvidia.com/gpu-driver-upgrade.skip=true",
		"node b (pool default) held: driver.upgradePolicy.hold lists it, so it keeps its driver (config old) in service",
		"node c (pool default) held: nvidia.com/gpu-driver-upgrade.skip=true keeps its driver",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	if a := node(t, client, "a"); a.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
		t.Errorf("node a: state %q, want it planned", a.Labels[nodestate.UpgradeStateLabel])
	}
	var status strings.Builder
	if err := WriteStatus(t.Context(), client, "gpu", "rel", &status); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status.String(), "(held: driver.upgradePolicy.hold)") || !strings.Contains(status.String(), "(held: skip label)") {
		t.Errorf("upgrade status does not say what holds b and c:\n%s", status.String())
	}

	// b and c off the list (c never was): b's label goes and b is planned in the same run; c keeps the admin's label
	pools[0].Hold = nil
	out, err = runAt(t, client, pools, time.Unix(200, 0))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b = node(t, client, "b")
	if _, ok := b.Labels[nodestate.UpgradeSkipLabel]; ok || b.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeRequired) {
		t.Fatalf("node b off the list: labels %v; want no skip label and upgrade-required", b.Labels)
	}
	if !strings.Contains(out, "pre-upgrade: node b no longer held (driver.upgradePolicy.hold): its nvidia.com/gpu-driver-upgrade.skip label removed") {
		t.Errorf("plan output:\n%s", out)
	}
	if c := node(t, client, "c"); c.Labels[nodestate.UpgradeSkipLabel] != "true" || c.Labels[nodestate.UpgradeStateLabel] != "" {
		t.Errorf("the admin's held node c: labels %v; want its label kept and no state", c.Labels)
	}
}

// A listed node the admin had labelled already stays the admin's: taking it off the list leaves the label.
func TestValuesHoldLeavesTheAdminsLabel(t *testing.T) {
	client := fake.NewClientset(readyNode("a", nil), readyNode("b", map[string]string{nodestate.UpgradeSkipLabel: "true"}),
		driverPod("a", "old"), driverPod("b", "old"))
	pools := pool("new", intstr.FromInt32(1))
	pools[0].Hold = []string{"b"}
	if out, err := runAt(t, client, pools, time.Unix(100, 0)); err != nil || strings.Contains(out, "labelled") {
		t.Fatalf("err %v; a labelled node was labelled again:\n%s", err, out)
	}
	pools[0].Hold = nil
	if out, err := runAt(t, client, pools, time.Unix(200, 0)); err != nil || strings.Contains(out, "no longer held") {
		t.Fatalf("err %v; the admin's label was taken:\n%s", err, out)
	}
	if b := node(t, client, "b"); b.Labels[nodestate.UpgradeSkipLabel] != "true" || b.Labels[nodestate.UpgradeStateLabel] != "" {
		t.Fatalf("node b: labels %v", b.Labels)
	}
}

// A failed node the values hold does not refuse the plan (as with the admin's label): it waits, held, for the admin.
func TestValuesHoldAFailedNode(t *testing.T) {
	failed := readyNode("b", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	client := fake.NewClientset(readyNode("a", nil), failed, driverPod("a", "old"), driverPod("b", "old"))
	pools := pool("new", intstr.FromInt32(1))
	if out, err := runAt(t, client, pools, time.Unix(100, 0)); err == nil {
		t.Fatalf("a failed node did not refuse the plan:\n%s", out)
	}
	pools[0].Hold = []string{"b"}
	if out, err := runAt(t, client, pools, time.Unix(100, 0)); err != nil {
		t.Fatalf("a held failed node refused the plan: %v\n%s", err, out)
	}
}
