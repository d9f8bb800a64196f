// Package gpuhealth is the node GPU health agent (`validator health`): it watches the node's GPUs through NVML
// (a cgo build) or the node's DCGM exporter (any build), judges what it sees by the chart's one health policy (global.health: fatal and application Xids, the NVML
// health watches), and writes the verdict on the Node as a condition (and, if asked, a taint) that the scheduler
// and external remediation (Node Problem Detector, NVSentinel, cloud auto-repair) can act on.
package gpuhealth

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// DefaultConditionType is the node condition the agent owns unless told otherwise.
const DefaultConditionType corev1.NodeConditionType = "nvidia.com/GPUHealthy"

// Watches are the health signals besides Xids that the policy may count as fatal (NVML's, or the DCGM exporter's
// gauges of the same: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, DCGM_FI_DEV_ROW_REMAP_FAILURE, DCGM_FI_DEV_ROW_REMAP_PENDING).
const (
	// WatchECCDoubleBit: an uncorrectable (double-bit) ECC error event.
	WatchECCDoubleBit = "eccDoubleBit"
	// WatchRowRemapFailure: the GPU ran out of spare rows to remap (it needs replacing), read at each probe.
	WatchRowRemapFailure = "rowRemapFailure"
	// WatchRowRemapPending: a row remap waits for a GPU reset, read at each probe.
	WatchRowRemapPending = "rowRemapPending"
)

// KnownWatches are the watches the agent implements.
var KnownWatches = []string{WatchECCDoubleBit, WatchRowRemapFailure, WatchRowRemapPending}

// Class is an Xid's tier in the policy.
type Class int

const (
	// Unlisted Xids are in neither tier: logged, the GPU stays healthy.
	Unlisted Class = iota
	// Application Xids are the workload's own fault: logged, the GPU stays healthy.
	Application
	// Fatal Xids need a GPU reset or a reboot: the GPU is unhealthy.
	Fatal
)

func (c Class) String() string {
	return [...]string{"unlisted", "application", "fatal"}[c]
}

// Policy is global.health as the agent reads it.
type Policy struct {
	// Fatal and Application are the Xid tiers (global.health.xids).
	Fatal, Application []uint64
	// Watches are the NVML health watches that count as fatal (KnownWatches).
	Watches []string
	// ConditionType is the node condition written (default DefaultConditionType).
	ConditionType corev1.NodeConditionType
	// Taint, when set, is put on the node while its condition is False and taken off when it is True again
	// (matched by key and effect). Nil: no taint.
	Taint *corev1.Taint
}

// Classify returns xid's tier. An Xid listed in both tiers is fatal: the policy errs towards taking a GPU out.
func (p Policy) Classify(xid uint64) Class {
	switch {
	case slices.Contains(p.Fatal, xid):
		return Fatal
	case slices.Contains(p.Application, xid):
		return Application
	}
	return Unlisted
}

// Watching reports whether the watch is on.
func (p Policy) Watching(watch string) bool { return slices.Contains(p.Watches, watch) }

// Validate names what is wrong with the policy.
func (p Policy) Validate() error {
	for _, xid := range p.Fatal {
		if slices.Contains(p.Application, xid) {
			return fmt.Errorf("Xid %d is in both the fatal and the application tier", xid)
		}
	}
	for _, w := range p.Watches {
		if !slices.Contains(KnownWatches, w) {
			return fmt.Errorf("unknown health watch %q (known: %s)", w, strings.Join(KnownWatches, ", "))
		}
	}
	if p.ConditionType == "" {
		return fmt.Errorf("no condition type")
	}
	if t := p.Taint; t != nil {
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return fmt.Errorf("taint %s: effect %q, want NoSchedule, PreferNoSchedule or NoExecute", t.Key, t.Effect)
		}
		if t.Key == "" {
			return fmt.Errorf("taint without a key")
		}
	}
	return nil
}

// ParseXids reads a comma-separated list of Xids (the chart's HEALTH_FATAL_XIDS / HEALTH_APPLICATION_XIDS).
func ParseXids(s string) ([]uint64, error) {
	var out []uint64
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not an Xid", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// ParseTaint reads KEY:EFFECT (the chart's HEALTH_TAINT); empty is no taint.
func ParseTaint(s string) (*corev1.Taint, error) {
	if s == "" {
		return nil, nil
	}
	key, effect, ok := strings.Cut(s, ":")
	if !ok || key == "" {
		return nil, fmt.Errorf("%q: want KEY:EFFECT", s)
	}
	return &corev1.Taint{Key: key, Effect: corev1.TaintEffect(effect)}, nil
}
