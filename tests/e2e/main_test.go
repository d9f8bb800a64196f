// Package e2e installs the chart into a real local control plane (kube-apiserver, etcd, controller-manager,
// scheduler, kwok-simulated GPU nodes) and checks what the API server and controllers actually do with it.
package e2e

import (
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/kubelet"
)

// kube is the package's one cluster, shared by every test (each test uses its own release and namespace).
var kube *cluster.Cluster

// stand plays the kubelet for the stack's own pods (validators, hook Jobs).
var stand *kubelet.Kubelet

// fixtureNodes are the simulated nodes, as registered.
var fixtureNodes []*corev1.Node

func TestMain(m *testing.M) {
	for _, n := range nodefixtures.RoleMatrix() {
		fixtureNodes = append(fixtureNodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "e2e", fixtureNodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
