//go:build cgo

package validation

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GoNVMLProbe is the NVMLProbe over github.com/NVIDIA/go-nvml, which loads the library through cgo.
type GoNVMLProbe struct {
	// Open returns NVML loaded from a library path (default nvml.New with nvml.WithLibraryPath); tests pass the
	// go-nvml mock.
	Open func(libraryPath string) nvml.Interface
}

// Probe initialises NVML from lib and returns the number of GPUs it sees (at least one) and the driver version.
func (g GoNVMLProbe) Probe(lib string) (int, string, error) {
	open := g.Open
	if open == nil {
		open = func(path string) nvml.Interface { return nvml.New(nvml.WithLibraryPath(path)) }
	}
	n := open(lib)
	if ret := n.Init(); ret != nvml.SUCCESS {
		return 0, "", fmt.Errorf("NVML (%s) init: %v", lib, ret)
	}
	defer n.Shutdown()
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, "", fmt.Errorf("NVML (%s) device count: %v", lib, ret)
	}
	if count == 0 {
		return 0, "", fmt.Errorf("NVML (%s) sees no GPU", lib)
	}
	version, ret := n.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		version = "unknown (" + ret.Error() + ")"
	}
	return count, version, nil
}

func defaultNVMLProbe() NVMLProbe { return GoNVMLProbe{} }
