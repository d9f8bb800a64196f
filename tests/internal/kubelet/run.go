package kubelet

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/cluster"
)

// RunPackage is a test package's TestMain body: it starts the local control plane (kwok leaving Components() to
// the stand-in), the stand-in and the given simulated nodes, hands the cluster and stand-in to use, runs the
// package's tests and stops everything, returning the exit code. Without control-plane binaries (and not under
// CI=true) the package says it skipped.
func RunPackage(m *testing.M, name string, nodes []*corev1.Node, use func(*cluster.Cluster, *Kubelet)) int {
	start := time.Now()
	c, skip, err := cluster.ForPackage(cluster.Options{Log: cluster.LogSink(), HarnessComponents: Components()})
	switch {
	case skip:
		fmt.Printf("SKIP %s: %v\n", name, err)
		return 0
	case err != nil:
		fmt.Printf("%s: %v\n", name, err)
		return 1
	}
	defer c.Stop()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stand, err := Start(ctx, c.Client, c.Kubeconfig)
	if err != nil {
		fmt.Printf("%s: kubelet stand-in: %v\n", name, err)
		return 1
	}
	addCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.AddNodes(addCtx, nodes...); err != nil {
		fmt.Printf("%s: %v\n", name, err)
		return 1
	}
	fmt.Printf("%s: cluster with %d simulated nodes ready in %s\n", name, len(nodes), time.Since(start).Round(time.Millisecond))
	use(c, stand)
	return m.Run()
}
