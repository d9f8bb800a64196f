//go:build cgo

// Package gpuhealth runs the GPU health agent (`validator health`) in-process against a real local API server,
// over go-nvml's mock: the node condition and taint as the API server stores them, set by a fatal Xid and cleared
// by a healthy start, next to the node controllers that write the same Node.
//
// It renders no chart: helm's dependencies import Go's plugin package, which makes the linker bind every symbol at
// start (-z now), and go-nvml leaves NVML's symbols to be resolved when the library is loaded. The agent's RBAC
// and admission are proven in tests/admission.
//
//	go test ./tests/gpuhealth/
package gpuhealth

import (
	"os"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

var kube *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.Main(m, "gpuhealth", cluster.Options{Log: cluster.LogSink()}, func(c *cluster.Cluster) { kube = c }))
}
