package validation

import "errors"

// NVMLProbe asks NVML, loaded from a library path, how many GPUs it sees and which driver version answers. It is
// the checks' only door to NVML, so a static build (CGO_ENABLED=0, the project's image) can leave go-nvml out.
type NVMLProbe interface {
	// Probe returns the number of GPUs NVML sees (an error when none) and the driver version.
	Probe(libraryPath string) (gpus int, driverVersion string, err error)
}

// ErrNVMLNotBuiltIn is what the default probe of a static build returns: go-nvml needs cgo to load the library, so
// such a build validates through nvidia-smi alone.
var ErrNVMLNotBuiltIn = errors.New("NVML probe not built in (CGO_ENABLED=0); nvidia-smi result used")
