// Package placement answers "which operand DaemonSet runs on which node" for a rendered chart, with the
// scheduler's own helpers (hooks/kube/schedule: required node affinity, node selector, NoSchedule/NoExecute taints).
// The role-matrix tests and `kube-gpu-stack plan` both use it, so what the tests prove is what plan prints.
package placement

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// DaemonSet is a rendered GPU operand DaemonSet reduced to what scheduling needs.
type DaemonSet struct {
	Name string
	// Operand is the nvidia.com/gpu.deploy.<operand> suffix (the app.kubernetes.io/component label), or
	// mps-control-daemon for the device plugin's MPS daemon.
	Operand string
	Pod     *corev1.Pod

	fit *schedule.Fitter // Pod's node selection parsed once (DaemonSets sets it)
}

// DaemonSets returns the GPU operand DaemonSets of a rendered manifest stream (`---`-separated YAML). DaemonSets
// without a component label (the NFD worker, which runs everywhere) are not GPU operands and are left out.
func DaemonSets(stream string) ([]DaemonSet, error) {
	var out []DaemonSet
	for _, doc := range strings.Split(stream, "\n---\n") {
		var ds struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			return nil, err
		}
		operand := ds.Metadata.Labels["app.kubernetes.io/component"]
		if ds.Kind != "DaemonSet" || operand == "" {
			continue
		}
		if strings.Contains(ds.Metadata.Name, "mps-control-daemon") {
			operand = "mps-control-daemon"
		}
		spec := ds.Spec.Template.Spec
		out = append(out, DaemonSet{Name: ds.Metadata.Name, Operand: operand, Pod: &corev1.Pod{Spec: spec}, fit: schedule.NewDaemonSetFitter(&spec)})
	}
	return out, nil
}

// Schedules reports whether the DaemonSet's pods may run on the node.
func (d DaemonSet) Schedules(node *corev1.Node) (bool, error) {
	if d.fit != nil {
		return d.fit.Fits(node)
	}
	return schedule.FitsDaemonSet(&d.Pod.Spec, node)
}

// Placement is the operands each node gets, and the DaemonSet behind each.
type Placement map[string]map[string]string // node -> operand -> DaemonSet name

// Place matches every DaemonSet against every node, as the cluster settles: first each node's driver pod labels it
// with its pool's allocation mode (Settle), which places the device plugin or the DRA kubelet plugin. Two
// DaemonSets of one operand on one node is an error (two driver variants would fight over the kernel modules).
func Place(dss []DaemonSet, nodes []*corev1.Node) (Placement, error) {
	nodes, err := Settle(dss, nodes)
	if err != nil {
		return nil, err
	}
	p := Placement{}
	for _, n := range nodes {
		p[n.Name] = map[string]string{}
		for _, ds := range dss {
			ok, err := ds.Schedules(n)
			if err != nil {
				return nil, fmt.Errorf("%s on %s: %w", ds.Name, n.Name, err)
			}
			if !ok {
				continue
			}
			if other, dup := p[n.Name][ds.Operand]; dup {
				return nil, fmt.Errorf("node %s gets two %s DaemonSets: %s and %s", n.Name, ds.Operand, other, ds.Name)
			}
			p[n.Name][ds.Operand] = ds.Name
		}
	}
	return p, nil
}

// Settle returns copies of the nodes labelled nodestate.AllocationLabel as their driver managers label them: the
// GPU_ALLOCATION of the driver DaemonSet that runs on the node. A node no driver DaemonSet runs on keeps its labels.
func Settle(dss []DaemonSet, nodes []*corev1.Node) ([]*corev1.Node, error) {
	modes := make([]string, len(dss))
	for i, ds := range dss {
		if ds.Operand == "driver" {
			modes[i] = ds.Env("GPU_ALLOCATION")
		}
	}
	out := make([]*corev1.Node, 0, len(nodes))
	for _, n := range nodes {
		c := *n // only the labels change: a copy of them, not of the whole node
		c.Labels = maps.Clone(n.Labels)
		n = &c
		for i, ds := range dss {
			mode := modes[i]
			if mode == "" {
				continue
			}
			ok, err := ds.Schedules(n)
			if err != nil {
				return nil, fmt.Errorf("%s on %s: %w", ds.Name, n.Name, err)
			}
			if ok {
				if n.Labels == nil {
					n.Labels = map[string]string{}
				}
				n.Labels[nodestate.AllocationLabel] = mode
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// Env is the literal value of env var name in the DaemonSet's first (init) container that sets it, or "": for a
// driver DaemonSet, GPU_ALLOCATION (the mode its driver manager labels the node with) and DRIVER_CONFIG_DIGEST.
func (d DaemonSet) Env(name string) string {
	for _, cs := range [][]corev1.Container{d.Pod.Spec.InitContainers, d.Pod.Spec.Containers} {
		for _, c := range cs {
			for _, e := range c.Env {
				if e.Name == name {
					return e.Value
				}
			}
		}
	}
	return ""
}

// Operands lists a node's operands, sorted.
func (p Placement) Operands(node string) []string {
	var out []string
	for op := range p[node] {
		out = append(out, op)
	}
	slices.Sort(out)
	return out
}

// Table prints a node x operand grid: one row per node (in the given order), one column per operand that any
// node gets, "x" where it runs.
func (p Placement) Table(nodes []string) string {
	seen := map[string]bool{}
	var cols []string
	for _, n := range nodes {
		for op := range p[n] {
			if !seen[op] {
				seen[op] = true
				cols = append(cols, op)
			}
		}
	}
	slices.Sort(cols)
	width := len("node")
	for _, n := range nodes {
		width = max(width, len(n))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s", width, "node")
	for _, c := range cols {
		fmt.Fprintf(&b, "  %s", c)
	}
	b.WriteString("\n")
	for _, n := range nodes {
		fmt.Fprintf(&b, "%-*s", width, n)
		for _, c := range cols {
			mark := "."
			if _, ok := p[n][c]; ok {
				mark = "x"
			}
			fmt.Fprintf(&b, "  %-*s", len(c), mark)
		}
		b.WriteString("\n")
	}
	return b.String()
}
