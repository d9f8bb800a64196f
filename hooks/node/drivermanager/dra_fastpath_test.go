package drivermanager

import (
	"bytes"
	"strings"
	"testing"

	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// TestDRAFastPathNeverLeavesThePluginPaused: a driver pod that restarts with the loaded driver's config (fast path)
// on a DRA node where an earlier run paused the DRA kubelet plugin (stopped or killed right after the plugin's pod
// went, then the change was rolled back) puts the plugin's switch back as it was, with the other operands'; the
// claim holder that run evicted is not waited for, no module is touched.
func TestDRAFastPathNeverLeavesThePluginPaused(t *testing.T) {
	for _, how := range []string{"stopped", "killed"} {
		t.Run(how, func(t *testing.T) {
			d := newDRANode(t, map[string]string{draSwitch: "true"})
			o := d.options()
			ctx := t.Context()
			if how == "stopped" {
				ctx, o.AfterStep = stopAfter("operands")
			} else {
				o.AfterStep = killAfter("operands")
			}
			if err := o.Run(ctx, &bytes.Buffer{}); err == nil {
				t.Fatal("the interrupted run succeeded")
			}
			if d.node().Labels[draSwitch] != nodestate.Paused || d.pluginRuns() {
				t.Fatalf("setup: plugin switch %q, plugin running %v; want it paused and gone", d.node().Labels[draSwitch], d.pluginRuns())
			}
			d.host.DriverState(newDigest) // the next pod carries the loaded driver's config
			d.client.ClearActions()
			out, err := d.run(d.options())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "kept the loaded driver") || len(d.moduleCalls()) != 0 {
				t.Fatalf("not the fast path: %q, module calls %v", out, d.moduleCalls())
			}
			n := d.node()
			assertNothingPaused(t, n)
			if n.Labels[draSwitch] != "true" {
				t.Fatalf("DRA plugin switch %q after the fast path, want true", n.Labels[draSwitch])
			}
		})
	}
}

// TestDRAFastPathOnAnUpgradeDoneNodeTouchesNothing: the plain fast path on a DRA node (a driver pod restart, nothing
// to change) neither evicts the claim holder nor writes the plugin's switch nor reads claims.
func TestDRAFastPathOnAnUpgradeDoneNodeTouchesNothing(t *testing.T) {
	d := newDRANode(t, map[string]string{draSwitch: "true", nodestate.UpgradeStateLabel: string(nodestate.UpgradeDone)})
	d.host.DriverState(newDigest)
	d.client.ClearActions()
	if _, err := d.run(d.options()); err != nil {
		t.Fatal(err)
	}
	if got := d.recorded(); len(got) != 0 || !d.pluginRuns() {
		t.Fatalf("events %v, plugin running %v; want nothing evicted or paused", got, d.pluginRuns())
	}
	for _, a := range d.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), draSwitch) {
			t.Fatalf("patch %s touches %s", p.GetPatch(), draSwitch)
		}
		if a.GetResource().Resource == "resourceclaims" {
			t.Fatalf("claims read on the fast path: %v", a)
		}
	}
	if n := d.node(); n.Labels[draSwitch] != "true" || state(n) != nodestate.UpgradeDone {
		t.Fatalf("switch %q state %q", n.Labels[draSwitch], state(n))
	}
}
