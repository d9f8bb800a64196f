//go:build cgo

package validation

import (
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeNVML is the go-nvml mock with a device count and a driver version; it records the library paths opened.
type fakeNVML struct {
	mu      sync.Mutex
	count   int
	initRet nvml.Return
	opened  []string
}

func (f *fakeNVML) open(path string) nvml.Interface {
	f.mu.Lock()
	f.opened = append(f.opened, path)
	f.mu.Unlock()
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return f.initRet },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return f.count, nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "595.91.07", nvml.SUCCESS },
	}
}

func newFakeNVML() *fakeNVML { return &fakeNVML{count: 1, initRet: nvml.SUCCESS} }

// probe is the checks' NVMLProbe over the mock: the real go-nvml probe, opening the mock instead of a library.
func (f *fakeNVML) probe() NVMLProbe { return GoNVMLProbe{Open: f.open} }
