// Package soak runs driver changes across a fleet of simulated GPU nodes in three driver pools, on the real local
// control plane with the kubelet stand-in (as tests/rollout), while a seeded random schedule injects the routine
// operations a cluster sees mid-rollout: re-syncs that change no driver, nodes going NotReady and back, GPU pods
// landing on nodes being emptied (some held by a finalizer once evicted), driver pods deleted by hand, Nodes
// deleted and registered again, a pool renamed, a waiting node moved to another pool, and a helm rollback (half of them planned on a node whose clock is
// minutes behind). An invariant checker watches the nodes for the whole run and
// fails it, printing the seed and the operations, if a pool has more nodes out than its bound, a node is
// schedulable with a driver that has not validated, a node fails its change, an old driver stops under a GPU pod,
// the rollout does not end, or the release's result does not match.
//
// `go test ./tests/soak` runs the -seed-list seeds (1, which rolls back, and 2); `-args -seed N` replays one; `make soak` runs a long
// soak (seeds 1 to SOAK_SEEDS) and prints the seeds it covered. A seed fixes the operations, their order, their targets and the
// waits between them; how the controllers interleave with them is the machine's.
package soak

import (
	"flag"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

var (
	seedFlag  = flag.Uint64("seed", 0, "replay this seed alone")
	seedsFlag = flag.Int("seeds", 0, "run seeds 1 to N (0: the -seed-list)")
	// seed 1 rolls back mid-rollout, seed 2 does not; `make soak` runs every seed
	seedListFlag = flag.String("seed-list", "1,2", "the seeds `go test` runs by default")
	// faultsFlag adds drivers that fail validation on one node (`make soak` sets it): each such node reverts by itself
	// and the admin retries it, under a 30 s validation timeout
	faultsFlag = flag.Bool("driver-faults", false, "make the new driver fail validation on a few nodes (and the validation timeout 30 s)")
	nodesFlag  = flag.Int("nodes", 99, "simulated GPU nodes, spread evenly over the three driver pools")
)

// poolLabels are the nodes' nvidia.com/driver.pool values, one per driver pool ("": the default pool).
var poolLabels = []string{"", "a", "b"}

var (
	kube  *cluster.Cluster
	stand *kubelet.Kubelet
	nodes []*corev1.Node
)

func TestMain(m *testing.M) {
	flag.Parse()
	for _, n := range nodefixtures.Soak(*nodesFlag, poolLabels) {
		nodes = append(nodes, n.Object())
	}
	os.Exit(kubelet.RunPackage(m, "soak", nodes, func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k }))
}
