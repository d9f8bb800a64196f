//go:build !cgo

package gpuhealthexporter

import (
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
)

// TestStaticBuildAutoReadsTheExporter: the chart's default source, auto, in the project's static image reads the
// exporter whose URL the chart gives it.
func TestStaticBuildAutoReadsTheExporter(t *testing.T) {
	exercise(t, "gpu-health-auto", gpuhealth.SourceAuto)
}
