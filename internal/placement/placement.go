// Package placement is hooks/placement under the name the tests import: one evaluator of "which operand DaemonSet
// runs on which node", shared by the tests and `kube-gpu-stack plan`.
package placement

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/placement"
)

// DaemonSet is a rendered GPU operand DaemonSet reduced to what scheduling needs.
type DaemonSet = placement.DaemonSet

// Placement is the operands each node gets, and the DaemonSet behind each.
type Placement = placement.Placement

// DaemonSets returns the GPU operand DaemonSets of a rendered manifest stream.
func DaemonSets(stream string) ([]DaemonSet, error) { return placement.DaemonSets(stream) }

// Place matches every DaemonSet against every node, as the cluster settles.
func Place(dss []DaemonSet, nodes []*corev1.Node) (Placement, error) {
	return placement.Place(dss, nodes)
}

// Settle returns copies of the nodes labelled with their driver DaemonSet's GPU allocation mode.
func Settle(dss []DaemonSet, nodes []*corev1.Node) ([]*corev1.Node, error) {
	return placement.Settle(dss, nodes)
}
