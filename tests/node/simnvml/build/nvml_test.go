//go:build cgo

package build

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

// cString reads a NUL-terminated fixed array of go-nvml's structs.
func cString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// TestGoNVML calls the library through go-nvml as the device plugin, GFD and nvidia-ctk do, and checks each
// answer against the config.
func TestGoNVML(t *testing.T) {
	useConfig(t, twoGPUs)
	n := initNVML(t)

	if v, ret := n.SystemGetDriverVersion(); v != "580.65.06" || ret != nvml.SUCCESS {
		t.Errorf("SystemGetDriverVersion: %q, %v", v, ret)
	}
	if v, ret := n.SystemGetNVMLVersion(); v != "13.580.65.06" || ret != nvml.SUCCESS {
		t.Errorf("SystemGetNVMLVersion: %q, %v", v, ret)
	}
	if v, ret := n.SystemGetCudaDriverVersion(); v != 13000 || ret != nvml.SUCCESS {
		t.Errorf("SystemGetCudaDriverVersion: %d, %v", v, ret)
	}
	if v, ret := n.SystemGetCudaDriverVersion_v2(); v != 13000 || ret != nvml.SUCCESS {
		t.Errorf("SystemGetCudaDriverVersion_v2: %d, %v", v, ret)
	}
	count, ret := n.DeviceGetCount()
	if count != 2 || ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetCount: %d, %v", count, ret)
	}

	type want struct {
		name, uuid, busID, legacyBusID string
		memory                         uint64
		domain, bus                    uint32
		pciDeviceID                    uint32
		minor                          int
		ccMajor, ccMinor               int
		arch                           nvml.DeviceArchitecture
		migCapable                     bool
		numa                           int
	}
	wants := []want{
		{"NVIDIA H100 80GB HBM3", "GPU-5a3f1c2e-8d4b-4e6a-9f10-2b3c4d5e6f70", "00000000:3B:00.0", "0000:3B:00.0",
			85520809984, 0, 0x3b, 0x233010de, 0, 9, 0, nvml.DEVICE_ARCH_HOPPER, true, -1},
		{"NVIDIA A10", "GPU-6b4f2d3f-9e5c-4f7b-a021-3c4d5e6f7081", "00000000:86:00.0", "0000:86:00.0",
			24146608128, 0, 0x86, 0x223610de, 2, 8, 6, nvml.DEVICE_ARCH_AMPERE, false, 1},
	}
	var handles []nvml.Device
	for i, w := range wants {
		d, ret := n.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
		}
		handles = append(handles, d)
		check := func(what string, got, want any, ret nvml.Return) {
			t.Helper()
			if ret != nvml.SUCCESS || got != want {
				t.Errorf("GPU %d %s: %v, %v; want %v", i, what, got, ret, want)
			}
		}
		name, ret := d.GetName()
		check("GetName", name, w.name, ret)
		uuid, ret := d.GetUUID()
		check("GetUUID", uuid, w.uuid, ret)
		index, ret := d.GetIndex()
		check("GetIndex", index, i, ret)
		minor, ret := d.GetMinorNumber()
		check("GetMinorNumber", minor, w.minor, ret)
		mem, ret := d.GetMemoryInfo()
		check("GetMemoryInfo", mem, nvml.Memory{Total: w.memory, Free: w.memory}, ret)
		mem2, ret := d.GetMemoryInfo_v2()
		check("GetMemoryInfo_v2", mem2, nvml.Memory_v2{Version: nvml.STRUCT_VERSION(mem2, 2), Total: w.memory, Free: w.memory}, ret)
		pci, ret := d.GetPciInfo()
		check("PciInfo.BusId", cString(pci.BusId[:]), w.busID, ret)
		check("PciInfo.BusIdLegacy", cString(pci.BusIdLegacy[:]), w.legacyBusID, ret)
		check("PciInfo.Domain/Bus/Device", [3]uint32{pci.Domain, pci.Bus, pci.Device}, [3]uint32{w.domain, w.bus, 0}, ret)
		check("PciInfo.PciDeviceId", pci.PciDeviceId, w.pciDeviceID, ret)
		major, minorCC, ret := d.GetCudaComputeCapability()
		check("GetCudaComputeCapability", [2]int{major, minorCC}, [2]int{w.ccMajor, w.ccMinor}, ret)
		arch, ret := d.GetArchitecture()
		check("GetArchitecture", arch, w.arch, ret)
		brand, ret := d.GetBrand()
		check("GetBrand", brand, nvml.BRAND_NVIDIA, ret)
		isMig, ret := d.IsMigDeviceHandle()
		check("IsMigDeviceHandle", isMig, false, ret)
		current, pending, ret := d.GetMigMode()
		if w.migCapable {
			check("GetMigMode", [2]int{current, pending}, [2]int{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE}, ret)
			maxMig, ret := d.GetMaxMigDeviceCount()
			check("GetMaxMigDeviceCount", maxMig, 7, ret)
			if _, ret := d.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
				t.Errorf("GPU %d GetMigDeviceHandleByIndex(0) with MIG disabled: %v, want ERROR_NOT_FOUND", i, ret)
			}
		} else if ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GPU %d GetMigMode: %v, want ERROR_NOT_SUPPORTED (not MIG capable)", i, ret)
		}
		node, ret := d.GetNumaNodeId()
		if w.numa < 0 && ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GPU %d GetNumaNodeId: %d, %v; want ERROR_NOT_SUPPORTED", i, node, ret)
		} else if w.numa >= 0 {
			check("GetNumaNodeId", node, w.numa, ret)
		}
		_, _, pendingRows, failedRows, ret := d.GetRemappedRows()
		check("GetRemappedRows", [2]bool{pendingRows, failedRows}, [2]bool{false, false}, ret)

		for _, u := range []string{w.uuid, strings.ToLower(w.uuid)} {
			if byUUID, ret := n.DeviceGetHandleByUUID(u); ret != nvml.SUCCESS || byUUID != d {
				t.Errorf("DeviceGetHandleByUUID(%s): %v, %v; want GPU %d's handle", u, byUUID, ret, i)
			}
		}
		for _, b := range []string{w.busID, w.legacyBusID, strings.ToLower(w.legacyBusID)} {
			if byBus, ret := n.DeviceGetHandleByPciBusId(b); ret != nvml.SUCCESS || byBus != d {
				t.Errorf("DeviceGetHandleByPciBusId(%s): %v, %v; want GPU %d's handle", b, byBus, ret, i)
			}
		}
	}
	if _, ret := n.DeviceGetHandleByIndex(2); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex(2) of 2 GPUs: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if _, ret := n.DeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID(unknown): %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := n.DeviceGetHandleByPciBusId("0000:99:00.0"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByPciBusId(unknown): %v, want ERROR_NOT_FOUND", ret)
	}
	for _, c := range []struct {
		a, b int
		want nvml.GpuTopologyLevel
	}{{0, 0, nvml.TOPOLOGY_INTERNAL}, {0, 1, nvml.TOPOLOGY_SYSTEM}, {1, 0, nvml.TOPOLOGY_SYSTEM}} {
		if level, ret := handles[c.a].GetTopologyCommonAncestor(handles[c.b]); ret != nvml.SUCCESS || level != c.want {
			t.Errorf("GetTopologyCommonAncestor(%d, %d): %v, %v; want %v", c.a, c.b, level, ret, c.want)
		}
	}

	// an unimplemented function answers NOT_SUPPORTED, and nvmlErrorString names it
	if _, ret := handles[0].GetTemperature(nvml.TEMPERATURE_GPU); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetTemperature (not implemented): %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if s := n.ErrorString(nvml.ERROR_NOT_SUPPORTED); s != "Not Supported" {
		t.Errorf("ErrorString(ERROR_NOT_SUPPORTED): %q", s)
	}
}

// TestEvents: the health checks' event set takes registrations and, with no event to report, waits out its
// timeout and answers ERROR_TIMEOUT (an immediate answer would make the callers' loops spin).
func TestEvents(t *testing.T) {
	useConfig(t, twoGPUs)
	n := initNVML(t)
	set, ret := n.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	for i := range 2 {
		d, _ := n.DeviceGetHandleByIndex(i)
		supported, ret := d.GetSupportedEventTypes()
		want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
		if ret != nvml.SUCCESS || supported&want != want {
			t.Errorf("GPU %d GetSupportedEventTypes: %#x, %v; want Xid and ECC events", i, supported, ret)
		}
		if ret := d.RegisterEvents(want, set); ret != nvml.SUCCESS {
			t.Errorf("GPU %d RegisterEvents: %v", i, ret)
		}
	}
	const timeout = 100 * time.Millisecond
	start := time.Now()
	_, ret = set.Wait(uint32(timeout / time.Millisecond))
	if elapsed := time.Since(start); ret != nvml.ERROR_TIMEOUT || elapsed < timeout {
		t.Errorf("Wait(%v): %v after %v; want ERROR_TIMEOUT after the whole timeout", timeout, ret, elapsed)
	}
	if ret := set.Free(); ret != nvml.SUCCESS {
		t.Errorf("EventSet.Free: %v", ret)
	}
	if ret := set.Free(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("EventSet.Free of a freed set: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
}

// TestInitRefcount: NVML counts nvmlInit and nvmlShutdown, answers UNINITIALIZED outside them, and a handle
// outlives a shutdown (the device plugin keeps none, but a stable handle cannot surprise one that does).
func TestInitRefcount(t *testing.T) {
	useConfig(t, twoGPUs)
	n := nvml.New(nvml.WithLibraryPath(library(t)))
	if ret := n.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	first, _ := n.DeviceGetHandleByIndex(1)
	other := nvml.New(nvml.WithLibraryPath(library(t)))
	if ret := other.Init(); ret != nvml.SUCCESS {
		t.Fatalf("second Init: %v", ret)
	}
	if ret := other.Shutdown(); ret != nvml.SUCCESS {
		t.Fatalf("Shutdown: %v", ret)
	}
	if count, ret := n.DeviceGetCount(); ret != nvml.SUCCESS || count != 2 {
		t.Errorf("DeviceGetCount after one of two Shutdowns: %d, %v", count, ret)
	}
	if ret := n.Shutdown(); ret != nvml.SUCCESS {
		t.Fatalf("Shutdown: %v", ret)
	}
	if ret := n.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init again: %v", ret)
	}
	defer n.Shutdown()
	again, _ := n.DeviceGetHandleByIndex(1)
	if again != first {
		t.Errorf("GPU 1's handle changed across Shutdown and Init: %v, then %v", first, again)
	}
	if ret := n.Extensions().LookupSymbol("nvmlDeviceGetTemperature"); ret != nil {
		t.Errorf("LookupSymbol(nvmlDeviceGetTemperature): %v; every declared function must resolve", ret)
	}
}

// TestGoNVLib walks the GPUs with go-nvlib's device library, the layer the device plugin, GFD and nvcdi
// enumerate with.
func TestGoNVLib(t *testing.T) {
	useConfig(t, twoGPUs)
	lib := device.New(initNVML(t))
	devices, err := lib.GetDevices()
	if err != nil || len(devices) != 2 {
		t.Fatalf("GetDevices: %d devices, %v", len(devices), err)
	}
	type want struct {
		busID, arch, cc string
		migCapable      bool
	}
	wants := []want{{"0000:3b:00.0", "Hopper", "9.0", true}, {"0000:86:00.0", "Ampere", "8.6", false}}
	visited := 0
	err = lib.VisitDevices(func(i int, d device.Device) error {
		visited++
		w := wants[i]
		if busID, err := d.GetPCIBusID(); err != nil || busID != w.busID {
			t.Errorf("GPU %d GetPCIBusID: %q, %v; want %q", i, busID, err, w.busID)
		}
		if arch, err := d.GetArchitectureAsString(); err != nil || arch != w.arch {
			t.Errorf("GPU %d GetArchitectureAsString: %q, %v; want %q", i, arch, err, w.arch)
		}
		if brand, err := d.GetBrandAsString(); err != nil || brand != "Nvidia" {
			t.Errorf("GPU %d GetBrandAsString: %q, %v", i, brand, err)
		}
		if cc, err := d.GetCudaComputeCapabilityAsString(); err != nil || cc != w.cc {
			t.Errorf("GPU %d GetCudaComputeCapabilityAsString: %q, %v; want %q", i, cc, err, w.cc)
		}
		if capable, err := d.IsMigCapable(); err != nil || capable != w.migCapable {
			t.Errorf("GPU %d IsMigCapable: %v, %v; want %v", i, capable, err, w.migCapable)
		}
		if enabled, err := d.IsMigEnabled(); err != nil || enabled {
			t.Errorf("GPU %d IsMigEnabled: %v, %v; want false", i, enabled, err)
		}
		if migs, err := d.GetMigDevices(); err != nil || len(migs) != 0 {
			t.Errorf("GPU %d GetMigDevices: %d, %v; want none", i, len(migs), err)
		}
		if profiles, err := d.GetMigProfiles(); err != nil || len(profiles) != 0 {
			t.Errorf("GPU %d GetMigProfiles: %d, %v; want none (GPU instance profiles are not simulated)", i, len(profiles), err)
		}
		if attached, err := d.IsFabricAttached(); err != nil || attached {
			t.Errorf("GPU %d IsFabricAttached: %v, %v; want false", i, attached, err)
		}
		if coherent, err := d.IsCoherent(); err != nil || coherent {
			t.Errorf("GPU %d IsCoherent: %v, %v; want false", i, coherent, err)
		}
		return nil
	})
	if err != nil || visited != 2 {
		t.Errorf("VisitDevices: visited %d, %v", visited, err)
	}
	if err := lib.VisitMigDevices(func(int, device.Device, int, device.MigDevice) error {
		t.Error("a MIG device was visited; MIG is disabled")
		return nil
	}); err != nil {
		t.Errorf("VisitMigDevices: %v", err)
	}
}

// TestValidatorProbe runs this repository's validator NVML probe on the library.
func TestValidatorProbe(t *testing.T) {
	useConfig(t, twoGPUs)
	count, version, err := validation.GoNVMLProbe{}.Probe(library(t))
	if err != nil || count != 2 || version != "580.65.06" {
		t.Errorf("Probe: %d GPUs, driver %q, %v; want 2, 580.65.06", count, version, err)
	}
}

// TestHealthAgent runs this repository's GPU health agent's NVML watch on the library: it probes, registers for
// events, reports both GPUs healthy and keeps waiting for events until stopped.
func TestHealthAgent(t *testing.T) {
	useConfig(t, twoGPUs)
	lib := library(t)
	policy := gpuhealth.Policy{Fatal: []uint64{48, 79}, Watches: gpuhealth.KnownWatches, ConditionType: gpuhealth.DefaultConditionType}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var verdicts []gpuhealth.Verdict
	var logs []string
	done := make(chan error, 1)
	go func() {
		done <- gpuhealth.NVMLMonitor{Poll: 20 * time.Millisecond}.Watch(ctx, lib, policy,
			func(format string, args ...any) { logs = append(logs, format) },
			func(v gpuhealth.Verdict) error {
				verdicts = append(verdicts, v)
				// let it wait on the event set a few times before stopping it
				time.AfterFunc(100*time.Millisecond, cancel)
				return nil
			})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not stop after its context ended")
	}
	if len(verdicts) != 1 || verdicts[0].Reason != gpuhealth.ReasonHealthy || verdicts[0].Message != "all 2 GPUs healthy" {
		t.Errorf("verdicts %v; want one: all 2 GPUs healthy", verdicts)
	}
	if len(logs) != 0 {
		t.Errorf("the agent logged %q; want nothing (every probe and registration supported)", logs)
	}
}
