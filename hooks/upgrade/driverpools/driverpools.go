// Package driverpools reads the driver pools the chart renders for its hooks (env DRIVER_POOLS) and answers which
// pool, and which of its driver DaemonSets, a node belongs to. The chart decides pools from values; the hooks check
// them against real nodes, which a render cannot see.
package driverpools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
)

// Pool is one driver pool as the chart renders it for the hooks.
type Pool struct {
	Name string `json:"name"`
	// Source is container, host or none.
	Source string `json:"source"`
	// NodeSelectorTerms is the pool's own node selection (for the default pool: not any other pool), without the
	// GPU, role and per-OS terms.
	NodeSelectorTerms []corev1.NodeSelectorTerm `json:"nodeSelectorTerms"`
	// MaxUnavailable bounds the pool's nodes upgrading at once (a number or a percentage).
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// AutoUpgrade false: the DaemonSets are OnDelete.
	AutoUpgrade *bool `json:"autoUpgrade,omitempty"`
	// Canary is how many of the pool's nodes change first, alone, and must validate before the rest start (unset:
	// DefaultCanary; 0: none). MaxFailures is how many upgrade-failed nodes hold the rest of the pool (unset:
	// DefaultMaxFailures; 0: no threshold). The pre-upgrade plan marks them on the nodes (package canary).
	Canary      *int `json:"canary,omitempty"`
	MaxFailures *int `json:"maxFailures,omitempty"`
	// Hold names nodes of the pool kept on their current driver (upgradePolicy.hold): the pre-upgrade plan labels
	// them nodestate.UpgradeSkipLabel, as the release's own (nodestate.Seed), and takes that label back once a node
	// leaves the list.
	Hold []string `json:"hold,omitempty"`
	// Revert (unset: on) keeps, at each driver change, a copy of the pool's driver DaemonSets as they were, so that a
	// node whose new driver does not validate goes back to the driver that last validated on it (package revertset).
	Revert *bool `json:"revert,omitempty"`
	// Allocation is how the pool's nodes hand GPUs to pods (device-plugin or dra): its driver manager labels them
	// so (nodestate.AllocationLabel), moving their GPU pods off first when they were labelled the other way.
	Allocation string `json:"gpuAllocation,omitempty"`
	// DaemonSets are the pool's driver DaemonSets (one per OS, and per kernel when precompiled) with the node
	// selection that picks each; a node of the pool that none selects has no driver image.
	DaemonSets []DaemonSet `json:"daemonSets,omitempty"`
}

// RevertOn says whether the pool reverts a node whose new driver does not validate (Revert, default on).
func (p Pool) RevertOn() bool {
	return p.Revert == nil || *p.Revert
}

// DaemonSet is one of a pool's driver DaemonSets.
type DaemonSet struct {
	Name              string                    `json:"name"`
	NodeSelectorTerms []corev1.NodeSelectorTerm `json:"nodeSelectorTerms"`
	// Digest is its DRIVER_CONFIG_DIGEST: what the driver on its nodes will be after the release.
	Digest string `json:"digest"`
}

// SlotsKey names the pool's slots by its node selection: the same nodes are the same pool, whatever its name, so a
// pool renamed mid-rollout keeps the slots its nodes out already hold (canary.Mark.Slots). "pool-" and 12 hex
// digits of the SHA-256 of its node selector terms as JSON.
func (p Pool) SlotsKey() string {
	b, _ := json.Marshal(p.NodeSelectorTerms) // selector terms always marshal
	sum := sha256.Sum256(b)
	return "pool-" + hex.EncodeToString(sum[:6])
}

// Parse reads the DRIVER_POOLS JSON; empty means no pools (the driver is disabled).
func Parse(raw string) ([]Pool, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var pools []Pool
	if err := json.Unmarshal([]byte(raw), &pools); err != nil {
		return nil, fmt.Errorf("driver pools: not a JSON list of {name, source, nodeSelectorTerms}: %w", err)
	}
	for i, p := range pools {
		if p.Name == "" {
			return nil, fmt.Errorf("driver pools: entry %d has no name", i)
		}
		if err := p.CheckMaxUnavailable(); err != nil {
			return nil, err
		}
		if p.CanaryNodes() < 0 || p.FailureThreshold() < 0 {
			return nil, fmt.Errorf("driver pool %s: upgradePolicy.canary and .maxFailures: want 0 or more", p.Name)
		}
	}
	return pools, nil
}

// CheckMaxUnavailable refuses a maxUnavailable the pool's RollingUpdate cannot run with, rather than reading it
// as 1: a whole number of nodes of at least 1, or a percentage from 1% to 100% (the driver DaemonSets do not
// surge, so 0 would never start; the API server refuses a number written as a string, as "abc", "-1" or "150%").
func (p Pool) CheckMaxUnavailable() error {
	v := p.MaxUnavailable
	if v == nil {
		return nil
	}
	ok := false
	switch v.Type {
	case intstr.Int:
		ok = v.IntVal >= 1
	case intstr.String:
		n, err := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
		ok = strings.HasSuffix(v.StrVal, "%") && err == nil && n >= 1 && n <= 100 && !strings.HasPrefix(v.StrVal, "+")
	}
	if !ok {
		return fmt.Errorf("driver pool %s: upgradePolicy.maxUnavailable %s: want a number of nodes of at least 1, or a percentage from 1%% to 100%% such as \"25%%\"",
			p.Name, describe(v))
	}
	return nil
}

func describe(v *intstr.IntOrString) string {
	if v.Type == intstr.String {
		return strconv.Quote(v.StrVal)
	}
	return strconv.Itoa(int(v.IntVal))
}

// MaxUnavailableNodes is the pool's maxUnavailable as a number of nodes out of total: a percentage rounded up and
// never below 1 (as the DaemonSet controller's rolling update counts it); unset is 1.
func (p Pool) MaxUnavailableNodes(total int) (int, error) {
	if err := p.CheckMaxUnavailable(); err != nil {
		return 0, err
	}
	if p.MaxUnavailable == nil {
		return 1, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(p.MaxUnavailable, total, true)
	if err != nil {
		return 0, fmt.Errorf("driver pool %s: upgradePolicy.maxUnavailable: %w", p.Name, err)
	}
	return max(n, 1), nil
}

// The defaults of a pool's canary and failure threshold: one node first, and the first failure holds the rest.
const (
	DefaultCanary      = 1
	DefaultMaxFailures = 1
)

// CanaryNodes is the pool's canary size (DefaultCanary when unset).
func (p Pool) CanaryNodes() int {
	if p.Canary == nil {
		return DefaultCanary
	}
	return *p.Canary
}

// FailureThreshold is the pool's maxFailures (DefaultMaxFailures when unset).
func (p Pool) FailureThreshold() int {
	if p.MaxFailures == nil {
		return DefaultMaxFailures
	}
	return *p.MaxFailures
}

// Matching returns the pools whose selection matches node (more than one means the pools overlap on it).
func Matching(pools []Pool, node *corev1.Node) ([]Pool, error) {
	var out []Pool
	for _, p := range pools {
		ok, err := schedule.Selects(&corev1.NodeSelector{NodeSelectorTerms: p.NodeSelectorTerms}, node)
		if err != nil {
			return nil, fmt.Errorf("driver pool %s: bad node selector: %w", p.Name, err)
		}
		if ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// DaemonSetFor returns the pool's driver DaemonSet that selects node, or nil when none does (its OS or kernel
// has no driver image in the pool).
func (p Pool) DaemonSetFor(node *corev1.Node) (*DaemonSet, error) {
	for i, ds := range p.DaemonSets {
		ok, err := schedule.Selects(&corev1.NodeSelector{NodeSelectorTerms: ds.NodeSelectorTerms}, node)
		if err != nil {
			return nil, fmt.Errorf("driver DaemonSet %s: bad node selector: %w", ds.Name, err)
		}
		if ok {
			return &p.DaemonSets[i], nil
		}
	}
	return nil, nil
}

// Names lists the pools' names.
func Names(pools []Pool) []string {
	out := make([]string, len(pools))
	for i, p := range pools {
		out[i] = p.Name
	}
	return out
}
