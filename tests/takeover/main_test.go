// Package takeover proves taking GPU nodes over from a running GPU Operator on a real local control plane: the
// cluster set up as the operator leaves it (its namespace, ClusterPolicy with status, DaemonSets owned by it, the
// labels it and its labeller wrote, its driver loaded on every node and held by running GPU pods), the operator
// removed as the README prescribes, `kube-gpu-stack migrate --from-cluster` run in-process, and the chart installed
// with its values through the helm SDK; the real driver manager and upgrade gate run against each node's fixture
// host (tests/kubelet).
package takeover

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// gpuNodes is how many GPU nodes the operator ran.
const gpuNodes = 4

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	for _, n := range nodefixtures.Rollout(gpuNodes) {
		nodes = append(nodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "takeover", nodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
