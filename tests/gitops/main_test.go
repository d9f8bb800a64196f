// Package gitops proves on a real local API server what Argo CD and Flux see of the chart: a server-side apply of
// every rendered object returns every field exactly as the chart wrote it, so a GitOps diff stays empty; Argo CD's
// sync sequence (render, PreSync hooks, server-side apply, PostSync hooks) runs the real hook binaries through the
// kubelet stand-in; and the chart's CRDs are owned by exactly one release.
//
//	KUBEBUILDER_ASSETS=$(./ci/build-controlplane.sh) go test ./tests/gitops/
package gitops

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/kubelet"
)

// kube is the package's one cluster. It has no simulated nodes: a test that needs some adds its own, named for
// it, and removes them.
var kube *cluster.Cluster

// stand plays the kubelet for the stack's own pods (hook Jobs, validators, driver pods); kwok leaves those alone.
var stand *kubelet.Kubelet

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	c, skip, err := cluster.ForPackage(cluster.Options{Log: cluster.LogSink(), HarnessComponents: kubelet.Components()})
	switch {
	case skip:
		fmt.Println("SKIP gitops:", err)
		return 0
	case err != nil:
		fmt.Println("gitops:", err)
		return 1
	}
	defer c.Stop()
	kube = c
	standCtx, stopStand := context.WithCancel(context.Background())
	defer stopStand()
	if stand, err = kubelet.Start(standCtx, c.Client, c.Kubeconfig); err != nil {
		fmt.Println("gitops: kubelet stand-in:", err)
		return 1
	}
	fmt.Printf("gitops: cluster ready in %s\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}
