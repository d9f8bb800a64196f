package faults

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// gpuNodes is the size of the driver pool: enough for a stop after each of the driver manager's steps in one
// rollout.
const gpuNodes = 9

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	for _, n := range nodefixtures.Rollout(gpuNodes) {
		nodes = append(nodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "faults", nodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
