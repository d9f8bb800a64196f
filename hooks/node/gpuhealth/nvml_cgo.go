//go:build cgo

package gpuhealth

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLMonitor is the Monitor over github.com/NVIDIA/go-nvml, which loads NVML through cgo.
type NVMLMonitor struct {
	// Open returns NVML loaded from a library path (default nvml.New with nvml.WithLibraryPath); tests pass the
	// go-nvml mock.
	Open func(libraryPath string) nvml.Interface
	// Poll bounds each wait for an event, so a stop is seen (default 5s).
	Poll time.Duration
}

// staticBuild: this build cannot load NVML.
const staticBuild = false

func defaultMonitor() Monitor { return NVMLMonitor{} }

// gpu is one device as the probe found it.
type gpu struct {
	name   string
	handle nvml.Device
}

// Watch probes each GPU, registers for Xid (and, with the watch on, double-bit ECC) events, reports the verdict,
// and then reports again on each event that adds a fault. A fault stays for the life of the watch: the Xids the
// policy calls fatal are cleared only by a GPU reset or a reboot, after which the agent starts (or is restarted)
// and probes afresh.
func (m NVMLMonitor) Watch(ctx context.Context, lib string, p Policy, logf func(string, ...any), report func(Verdict) error) error {
	open, poll := m.Open, m.Poll
	if open == nil {
		open = func(path string) nvml.Interface { return nvml.New(nvml.WithLibraryPath(path)) }
	}
	if poll <= 0 {
		poll = 5 * time.Second
	}
	n := open(lib)
	if ret := n.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML (%s) init: %v", lib, ret)
	}
	defer n.Shutdown()
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML (%s) device count: %v", lib, ret)
	}
	set, ret := n.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML event set: %v", ret)
	}
	defer set.Free()

	mask := uint64(nvml.EventTypeXidCriticalError)
	if p.Watching(WatchECCDoubleBit) {
		mask |= nvml.EventTypeDoubleBitEccError
	}
	var faults []Fault
	byUUID := map[string]string{}
	for i := range count {
		name := fmt.Sprintf("GPU %d", i)
		d, ret := n.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			faults = append(faults, Fault{GPU: name, Reason: ReasonGPULost, Detail: ret.Error()})
			continue
		}
		if ret != nvml.SUCCESS {
			faults = append(faults, Fault{GPU: name, Reason: ReasonGPUUnavailable, Detail: "no NVML handle: " + ret.Error()})
			continue
		}
		if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
			name += " (" + uuid + ")"
			byUUID[uuid] = name
		}
		faults = append(faults, probe(gpu{name, d}, p)...)
		supported, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			logf("%s: supported events: %v; registering for Xids anyway", name, ret)
			supported = mask
		}
		switch ret := d.RegisterEvents(mask&supported, set); ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			logf("%s: too old for NVML events: only the probe at start judges it", name)
		default:
			faults = append(faults, Fault{GPU: name, Reason: ReasonGPUUnavailable, Detail: "registering for events: " + ret.Error()})
		}
	}
	if err := report(Judge(count, faults)); err != nil {
		return err
	}

	for ctx.Err() == nil {
		e, ret := set.Wait(uint32(poll / time.Millisecond))
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("NVML event wait: %v", ret)
		}
		name := "a GPU NVML could not name"
		if e.Device != nil {
			if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
				if name = byUUID[uuid]; name == "" {
					name = uuid
				}
			}
		}
		var f *Fault
		switch e.EventType {
		case nvml.EventTypeXidCriticalError:
			class := p.Classify(e.EventData)
			logf("%s: Xid %d (%s)", name, e.EventData, class)
			if class == Fatal {
				f = &Fault{GPU: name, Reason: ReasonFatalXid, Xid: e.EventData}
			}
		case nvml.EventTypeDoubleBitEccError:
			logf("%s: double-bit ECC error", name)
			f = &Fault{GPU: name, Reason: ReasonECCDoubleBit}
		default:
			logf("%s: event type %#x ignored", name, e.EventType)
		}
		if f == nil {
			continue
		}
		faults = append(faults, *f)
		if err := report(Judge(count, faults)); err != nil {
			return err
		}
	}
	return nil
}

// probe reads the state a GPU keeps across events: its row remapping (where supported and watched).
func probe(g gpu, p Policy) []Fault {
	if !p.Watching(WatchRowRemapFailure) && !p.Watching(WatchRowRemapPending) {
		return nil
	}
	_, _, pending, failed, ret := g.handle.GetRemappedRows()
	if ret != nvml.SUCCESS { // ERROR_NOT_SUPPORTED before Ampere: nothing to read
		return nil
	}
	var out []Fault
	if failed && p.Watching(WatchRowRemapFailure) {
		out = append(out, Fault{GPU: g.name, Reason: ReasonRowRemapFailure})
	}
	if pending && p.Watching(WatchRowRemapPending) {
		out = append(out, Fault{GPU: g.name, Reason: ReasonRowRemapPending})
	}
	return out
}
