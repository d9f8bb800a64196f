//go:build cgo

package gpuhealth

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGPUs is the go-nvml mock with a few GPUs and an event channel the test feeds.
type fakeGPUs struct {
	uuids   []string
	initRet nvml.Return
	lost    map[int]bool
	pending map[int]bool
	events  chan nvml.EventData

	mu         sync.Mutex
	registered map[string]uint64
}

func newFakeGPUs(n int) *fakeGPUs {
	f := &fakeGPUs{initRet: nvml.SUCCESS, lost: map[int]bool{}, pending: map[int]bool{}, events: make(chan nvml.EventData, 8),
		registered: map[string]uint64{}}
	for i := range n {
		f.uuids = append(f.uuids, "GPU-0000000"+string(rune('a'+i)))
	}
	return f
}

func (f *fakeGPUs) device(i int) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:                func() (string, nvml.Return) { return f.uuids[i], nvml.SUCCESS },
		GetSupportedEventTypesFunc: func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS },
		RegisterEventsFunc: func(mask uint64, _ nvml.EventSet) nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.registered[f.uuids[i]] = mask
			return nvml.SUCCESS
		},
		GetRemappedRowsFunc: func() (int, int, bool, bool, nvml.Return) { return 0, 0, f.pending[i], false, nvml.SUCCESS },
	}
}

// open is NVMLMonitor.Open over the mock.
func (f *fakeGPUs) open(string) nvml.Interface {
	devices := make([]*mock.Device, len(f.uuids))
	for i := range devices {
		devices[i] = f.device(i)
	}
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return f.initRet },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(f.uuids), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if f.lost[i] {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return devices[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return &mock.EventSet{
				FreeFunc: func() nvml.Return { return nvml.SUCCESS },
				WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
					select {
					case e := <-f.events:
						return e, nvml.SUCCESS
					case <-time.After(time.Duration(ms) * time.Millisecond):
						return nvml.EventData{}, nvml.ERROR_TIMEOUT
					}
				},
			}, nvml.SUCCESS
		},
	}
}

// xid sends an Xid event on GPU i, as NVML delivers it.
func (f *fakeGPUs) xid(i int, xid uint64) {
	f.events <- nvml.EventData{Device: f.device(i), EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

// monitor is the real NVML monitor over the mock.
func (f *fakeGPUs) monitor() Monitor { return NVMLMonitor{Open: f.open, Poll: 10 * time.Millisecond} }
