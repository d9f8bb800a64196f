// Package gpuhealthexporter runs the GPU health agent (`validator health`) in-process against a real local API
// server with the DCGM exporter as its source, as the project's static image (CGO_ENABLED=0) runs it: an httptest
// server plays the node's exporter (hooks/node/gpuhealth/exportertest), and the node condition and taint are read as the
// API server stores them. Unlike tests/gpuhealth (go-nvml's mock, cgo), it builds and runs with or without cgo:
//
//	CGO_ENABLED=0 go test ./tests/gpuhealthexporter/
package gpuhealthexporter

import (
	"os"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

var kube *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.Main(m, "gpuhealthexporter", cluster.Options{Log: cluster.LogSink()}, func(c *cluster.Cluster) { kube = c }))
}
