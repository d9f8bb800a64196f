//go:build cgo

// Package gpuhealthtest is a node's GPUs played by go-nvml's mock, for the health agent's tests: the test sets
// what the probe finds and feeds events as NVML delivers them.
package gpuhealthtest

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// GPUs is the go-nvml mock with a few GPUs and an event queue the test feeds. Set the fields before the agent
// starts.
type GPUs struct {
	UUIDs []string
	// InitRet is what Init returns (SUCCESS).
	InitRet nvml.Return
	// Lost GPUs answer ERROR_GPU_IS_LOST for their handle; Pending ones have a row remap pending.
	Lost, Pending map[int]bool

	events     chan nvml.EventData
	mu         sync.Mutex
	registered map[string]uint64
}

// New returns n healthy GPUs, GPU-00000000-... by index.
func New(n int) *GPUs {
	g := &GPUs{InitRet: nvml.SUCCESS, Lost: map[int]bool{}, Pending: map[int]bool{}, events: make(chan nvml.EventData, 16),
		registered: map[string]uint64{}}
	for i := range n {
		g.UUIDs = append(g.UUIDs, fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i))
	}
	return g
}

func (g *GPUs) device(i int) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:                func() (string, nvml.Return) { return g.UUIDs[i], nvml.SUCCESS },
		GetSupportedEventTypesFunc: func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS },
		RegisterEventsFunc: func(mask uint64, _ nvml.EventSet) nvml.Return {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.registered[g.UUIDs[i]] = mask
			return nvml.SUCCESS
		},
		GetRemappedRowsFunc: func() (int, int, bool, bool, nvml.Return) { return 0, 0, g.Pending[i], false, nvml.SUCCESS },
	}
}

// Open is the NVML loader the agent's NVMLMonitor takes: it ignores the library path.
func (g *GPUs) Open(string) nvml.Interface {
	devices := make([]*mock.Device, len(g.UUIDs))
	for i := range devices {
		devices[i] = g.device(i)
	}
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return g.InitRet },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(g.UUIDs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if g.Lost[i] {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return devices[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return &mock.EventSet{
				FreeFunc: func() nvml.Return { return nvml.SUCCESS },
				WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
					select {
					case e := <-g.events:
						return e, nvml.SUCCESS
					case <-time.After(time.Duration(ms) * time.Millisecond):
						return nvml.EventData{}, nvml.ERROR_TIMEOUT
					}
				},
			}, nvml.SUCCESS
		},
	}
}

// Xid delivers an Xid critical error event on GPU i.
func (g *GPUs) Xid(i int, xid uint64) {
	g.events <- nvml.EventData{Device: g.device(i), EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

// Registered is the event mask the agent registered for on GPU i (0 before it did).
func (g *GPUs) Registered(i int) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.registered[g.UUIDs[i]]
}
