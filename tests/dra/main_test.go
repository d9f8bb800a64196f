// Package dra proves GPU allocation through DRA on a real local control plane: the chart installed with the helm
// SDK in values/dra-mixed.yaml, the test playing the DRA kubelet plugin (it publishes ResourceSlices for exactly the
// nodes where the chart's kubelet-plugin DaemonSet runs a pod), and kube-scheduler's DRA plugin and the
// controller-manager's resourceclaim controller allocating real ResourceClaims — so which nodes get claims, which
// keep the device plugin, what `helm upgrade` moves and what uninstall leaves are the API server's and the
// controllers' own behaviour.
package dra

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	// nodes: two default-pool GPU nodes (DRA in dra-mixed), the legacy pool's two nodes (device plugin), the two
	// nodes whose DRA switch is off or paused, and a node without a GPU.
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	for _, n := range append(nodefixtures.Rollout(2), nodefixtures.DRA()...) {
		nodes = append(nodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "dra", nodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
