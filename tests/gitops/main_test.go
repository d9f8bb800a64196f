// Package gitops proves on a real local API server what Argo CD and Flux see of the chart: a server-side apply of
// every rendered object returns every field exactly as the chart wrote it, so a GitOps diff stays empty; Argo CD's
// sync sequence (render, PreSync hooks, server-side apply, PostSync hooks) runs the real hook binaries through the
// kubelet stand-in; and the chart's CRDs are owned by exactly one release.
//
//	KUBEBUILDER_ASSETS=$(./ci/build-controlplane.sh) go test ./tests/gitops/
package gitops

import (
	"os"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
)

// kube is the package's one cluster. It has no simulated nodes: a test that needs some adds its own, named for
// it, and removes them.
var kube *cluster.Cluster

// stand plays the kubelet for the stack's own pods (hook Jobs, validators, driver pods); kwok leaves those alone.
var stand *kubelet.Kubelet

func TestMain(m *testing.M) {
	os.Exit(kubelet.RunPackage(m, "gitops", nil, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
