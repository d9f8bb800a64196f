// Package rollout proves a rolling driver upgrade end to end on a real local control plane: the chart installed
// with the helm SDK, the DaemonSet controller rolling the driver pods, and for every driver pod the real driver
// manager and upgrade gate run by the kubelet stand-in against that node's fixture host tree — so evictions, PDB
// refusals, cordons, operand pauses and the rollout's pacing are the API server's and the controllers' own.
package rollout

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// gpuNodes is the size of the driver pool.
const gpuNodes = 10

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	for _, n := range nodefixtures.Rollout(gpuNodes) {
		nodes = append(nodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "rollout", nodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
