// Package gitops proves on a real local API server what Argo CD and Flux see of the chart: a server-side apply of
// every rendered object returns every field exactly as the chart wrote it, so a GitOps diff stays empty.
//
//	KUBEBUILDER_ASSETS=$(./ci/build-controlplane.sh) go test ./tests/gitops/
package gitops

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/cluster"
)

// kube is the package's one cluster: an API server is all these tests need, no simulated nodes.
var kube *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	c, skip, err := cluster.ForPackage(cluster.Options{Log: cluster.LogSink()})
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
	fmt.Printf("gitops: cluster ready in %s\n", time.Since(start).Round(time.Millisecond))
	return m.Run()
}
