package drivermanager

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// A pool moved from DRA to the device plugin with its driver config unchanged: the node's loaded driver has the
// new pod's digest, so only the allocation label says it must switch.
func newSwitchingNode(t *testing.T) (*draNode, *Options) {
	t.Helper()
	d := newDRANode(t, map[string]string{draSwitch: "true", nodestate.AllocationLabel: nodestate.AllocationDRA})
	d.host.DriverState(newDigest)
	o := d.options()
	o.Allocation = nodestate.AllocationDevicePlugin
	return d, o
}

func allocation(d *draNode) string { return d.node().Labels[nodestate.AllocationLabel] }

// TestAllocationSwitchRefusedKeepsTheOldMode: a claim holder that cannot leave (a PDB refuses its eviction) fails
// the switch with the DRA plugin running, the driver loaded and the node still labelled dra, so the device plugin
// never arrives next to a pod holding a GPU through a claim.
func TestAllocationSwitchRefusedKeepsTheOldMode(t *testing.T) {
	d, o := newSwitchingNode(t)
	d.pdbBlocks = true
	o.Eviction.Timeout = 300 * time.Millisecond
	if _, err := d.run(o); err == nil {
		t.Fatal("the switch went ahead with a claim holder left")
	}
	if got := allocation(d); got != nodestate.AllocationDRA {
		t.Fatalf("allocation %q after a refused switch, want dra kept", got)
	}
	if !d.pluginRuns() || len(d.host.LoadedModules()) == 0 {
		t.Fatalf("plugin running %v, modules %v; want both kept", d.pluginRuns(), d.host.LoadedModules())
	}
	assertNothingPaused(t, d.node())
}

// TestAllocationSwitchStoppedAtEachStepKeepsTheOldModeThenConverges: SIGTERM at each step leaves the node labelled
// the old way (the new mode is written only with the resume, once the GPU pods and both plugins are gone); the
// next driver pod goes on and ends with the new label.
func TestAllocationSwitchStoppedAtEachStepKeepsTheOldModeThenConverges(t *testing.T) {
	for _, step := range Steps {
		t.Run(step, func(t *testing.T) {
			d, o := newSwitchingNode(t)
			ctx, afterStep := stopAfter(step)
			o.AfterStep = afterStep
			if err := o.Run(ctx, &bytes.Buffer{}); !errors.Is(err, errSIGTERM) {
				t.Fatalf("stopped run: %v", err)
			}
			if got := allocation(d); got != nodestate.AllocationDRA {
				t.Fatalf("allocation %q after a stop at %s, want dra kept", got, step)
			}
			_, o = newSwitchingNodeOptions(d)
			if _, err := d.run(o); err != nil {
				t.Fatalf("next pod: %v", err)
			}
			if got := allocation(d); got != nodestate.AllocationDevicePlugin {
				t.Fatalf("allocation %q after the next pod, want device-plugin", got)
			}
			assertNothingPaused(t, d.node())
		})
	}
}

func newSwitchingNodeOptions(d *draNode) (*draNode, *Options) {
	o := d.options()
	o.Allocation = nodestate.AllocationDevicePlugin
	return d, o
}

// TestAllocationSwitchWithAnUnchangedDriverMovesPodsFirst: the same driver config, another allocation mode: not the
// fast path. The operands are paused, the claim holder evicted, then the DRA plugin paused, the driver reloaded, and
// the node labelled device-plugin with the resume, waiting for validation.
func TestAllocationSwitchWithAnUnchangedDriverMovesPodsFirst(t *testing.T) {
	d, o := newSwitchingNode(t)
	out, err := d.run(o)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "kept the loaded driver") {
		t.Fatalf("fast path taken on a switch: %s", out)
	}
	if got, want := d.recorded(), []string{"paused operator-validator", "evicted ml/train", "paused dra-driver"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	n := d.node()
	if n.Labels[nodestate.AllocationLabel] != nodestate.AllocationDevicePlugin || state(n) != nodestate.ValidationRequired || len(d.host.LoadedModules()) != 0 {
		t.Fatalf("allocation %q state %q modules %v; want device-plugin, validation-required, unloaded",
			n.Labels[nodestate.AllocationLabel], state(n), d.host.LoadedModules())
	}
	assertNothingPaused(t, n)
	finish(t, d.env)
}

// TestAllocationFirstRunLabelsWithoutEvicting: a node with no allocation label (new to the stack) takes its pool's
// mode on the fast path with nothing evicted; an invalid mode is refused before anything is read.
func TestAllocationFirstRunLabelsWithoutEvicting(t *testing.T) {
	d := newDRANode(t, map[string]string{draSwitch: "true"})
	d.host.DriverState(newDigest)
	o := d.options()
	o.Allocation = nodestate.AllocationDRA
	out, err := d.run(o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kept the loaded driver") || len(d.recorded()) != 0 {
		t.Fatalf("out %q events %v; want the fast path, nothing evicted or paused", out, d.recorded())
	}
	if got := allocation(d); got != nodestate.AllocationDRA {
		t.Fatalf("allocation %q, want dra", got)
	}
	o.Allocation = "gpu"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "GPU_ALLOCATION") {
		t.Fatalf("invalid allocation accepted: %v", err)
	}
}
