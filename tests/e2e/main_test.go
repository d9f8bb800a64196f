// Package e2e installs the chart into a real local control plane (kube-apiserver, etcd, controller-manager,
// scheduler, kwok-simulated GPU nodes) and checks what the API server and controllers actually do with it.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/nodefixtures"
)

// kube is the package's one cluster, shared by every test (each test uses its own release and namespace).
var kube *cluster.Cluster

// stand plays the kubelet for the stack's own pods (validators, hook Jobs).
var stand *kubelet.Kubelet

// fixtureNodes are the simulated nodes, as registered.
var fixtureNodes []*corev1.Node

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	c, skip, err := cluster.ForPackage(cluster.Options{Log: cluster.LogSink(), HarnessComponents: kubelet.Components()})
	switch {
	case skip:
		fmt.Println("SKIP e2e:", err)
		return 0
	case err != nil:
		fmt.Println("e2e:", err)
		return 1
	}
	defer c.Stop()
	kube = c
	standCtx, stopStand := context.WithCancel(context.Background())
	defer stopStand()
	if stand, err = kubelet.Start(standCtx, c.Client, c.Kubeconfig); err != nil {
		fmt.Println("e2e: kubelet stand-in:", err)
		return 1
	}
	for _, n := range nodefixtures.RoleMatrix() {
		fixtureNodes = append(fixtureNodes, n.Object())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.AddNodes(ctx, fixtureNodes...); err != nil {
		fmt.Println("e2e:", err)
		return 1
	}
	fmt.Printf("e2e: cluster with %d simulated nodes ready in %s\n", len(fixtureNodes), time.Since(start).Round(time.Millisecond))
	return m.Run()
}
