// Package rollout proves a rolling driver upgrade end to end on a real local control plane: the chart installed
// with the helm SDK, the DaemonSet controller rolling the driver pods, and for every driver pod the real driver
// manager and upgrade gate run by the kubelet stand-in against that node's fixture host tree — so evictions, PDB
// refusals, cordons, operand pauses and the rollout's pacing are the API server's and the controllers' own.
package rollout

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

// gpuNodes is the size of the driver pool.
const gpuNodes = 10

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	c, skip, err := cluster.ForPackage(cluster.Options{Log: cluster.LogSink(), HarnessComponents: kubelet.Components()})
	switch {
	case skip:
		fmt.Println("SKIP rollout:", err)
		return 0
	case err != nil:
		fmt.Println("rollout:", err)
		return 1
	}
	defer c.Stop()
	kube = c
	standCtx, stopStand := context.WithCancel(context.Background())
	defer stopStand()
	if stand, err = kubelet.Start(standCtx, c.Client, c.Kubeconfig); err != nil {
		fmt.Println("rollout: kubelet stand-in:", err)
		return 1
	}
	for _, n := range nodefixtures.Rollout(gpuNodes) {
		nodes = append(nodes, n.Object())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.AddNodes(ctx, nodes...); err != nil {
		fmt.Println("rollout:", err)
		return 1
	}
	fmt.Printf("rollout: cluster with %d simulated nodes ready in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))
	return m.Run()
}
