//go:build !cgo

package gpuhealth

import "context"

// staticBuildMonitor stands in for go-nvml in a CGO_ENABLED=0 build, which cannot load libnvidia-ml.
type staticBuildMonitor struct{}

func (staticBuildMonitor) Watch(context.Context, string, Policy, func(string, ...any), func(Verdict) error) error {
	return ErrNVMLNotBuiltIn
}

// staticBuild: this build cannot load NVML.
const staticBuild = true

func defaultMonitor() Monitor { return staticBuildMonitor{} }
