package main

/*
#include <stdlib.h>
#include "nvml_types.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// The NVML functions the simulated GPUs answer: those the device plugin, GFD, nvidia-ctk's CDI generation and this
// repository's hooks call on their way (found by reading them and by running them with SIMNVML_TRACE set). Any
// other function is a stub (stubs_gen.c) returning NVML_ERROR_NOT_SUPPORTED, which callers of optional features
// take as "this GPU has no such feature".

const (
	// nvmlEventType* bits a GPU supports: ECC, P-state, Xid and clock events, as a data-center GPU does
	supportedEvents = 0x1 | 0x2 | 0x4 | 0x8 | 0x10
	// the most MIG devices a MIG-capable GPU reports (A100 and H100: 7)
	maxMigDevices  = 7
	nvidiaVendorID = 0x10de
	// nvmlGpuTopologyLevel_t
	topologyInternal = 0
	topologyNode     = 40
	topologySystem   = 50
	// nvmlDeviceArchitecture_t of the first GPUs that remap rows
	archAmpere = 7
)

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t {
	return initialise("nvmlInit_v2")
}

//export nvmlInit
func nvmlInit() C.nvmlReturn_t {
	return initialise("nvmlInit")
}

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t {
	// NVML_INIT_FLAG_NO_GPUS and NO_ATTACH change nothing here: there is nothing to attach to
	return initialise("nvmlInitWithFlags")
}

func initialise(function string) C.nvmlReturn_t {
	lib.Lock()
	defer lib.Unlock()
	if lib.inits == 0 {
		// the file is read afresh at each first nvmlInit, so a test can change the machine between runs
		if err := load(); err != nil {
			fmt.Fprintf(os.Stderr, "simnvml: %s: NVML_ERROR_DRIVER_NOT_LOADED: %v\n", function, err)
			return C.NVML_ERROR_DRIVER_NOT_LOADED
		}
	}
	lib.inits++
	trace(function, "(%d GPUs, initialised %d times)", len(lib.gpus), lib.inits)
	return C.NVML_SUCCESS
}

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	lib.Lock()
	defer lib.Unlock()
	trace("nvmlShutdown", "")
	if lib.inits == 0 {
		return C.NVML_ERROR_UNINITIALIZED
	}
	lib.inits--
	return C.NVML_SUCCESS
}

// errorStrings are nvmlErrorString's answers, allocated once: callers keep the pointer.
var errorStrings = map[C.nvmlReturn_t]*C.char{}

var errorMessages = map[int]string{
	0: "Success", 1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
	5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 8: "Insufficient External Power",
	9: "Driver Not Loaded", 10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
	13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost", 16: "GPU requires restart",
	17: "The operating system has blocked the request", 18: "RM has detected an NVML/RM version mismatch",
	19: "In use by another client", 20: "Insufficient Memory", 21: "No data",
	22: "The requested vgpu operation is not available on target device, because ECC is enabled",
	23: "Insufficient resources", 24: "Frequency not supported", 25: "Argument version mismatch",
	26: "The requested functionality has been deprecated", 27: "The system is not ready for the request",
	28: "No GPUs were found", 29: "Resource not in correct state", 30: "Reset type not supported",
	999: "Unknown Error",
}

//export nvmlErrorString
func nvmlErrorString(result C.nvmlReturn_t) *C.char {
	lib.Lock()
	defer lib.Unlock()
	if s, ok := errorStrings[result]; ok {
		return s
	}
	msg, ok := errorMessages[int(result)]
	if !ok {
		msg = fmt.Sprintf("Unknown Error (%d)", int(result))
	}
	s := C.CString(msg)
	errorStrings[result] = s
	return s
}

// initialised runs f with the lock held once NVML is initialised; NVML answers NVML_ERROR_UNINITIALIZED before.
func initialised(function string, f func() C.nvmlReturn_t) C.nvmlReturn_t {
	lib.Lock()
	defer lib.Unlock()
	if lib.inits == 0 {
		trace(function, "= NVML_ERROR_UNINITIALIZED")
		return C.NVML_ERROR_UNINITIALIZED
	}
	ret := f()
	trace(function, "= %d", int(ret))
	return ret
}

// onDevice runs f on the GPU behind h once NVML is initialised; a handle it did not hand out is an invalid
// argument.
func onDevice(function string, h C.nvmlDevice_t, f func(*gpu) C.nvmlReturn_t) C.nvmlReturn_t {
	return initialised(function, func() C.nvmlReturn_t {
		g := device(h)
		if g == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		return f(g)
	})
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return initialised("nvmlSystemGetDriverVersion", func() C.nvmlReturn_t {
		return putString(version, length, lib.cfg.DriverVersion)
	})
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	return initialised("nvmlSystemGetNVMLVersion", func() C.nvmlReturn_t {
		// NVML's version is the CUDA major version and the driver's, e.g. 13.580.65.06
		cuda, _ := lib.cfg.CUDADriverVersion()
		return putString(version, length, fmt.Sprintf("%d.%s", cuda/1000, lib.cfg.DriverVersion))
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(cudaDriverVersion *C.int) C.nvmlReturn_t {
	return cudaVersion("nvmlSystemGetCudaDriverVersion", cudaDriverVersion)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(cudaDriverVersion *C.int) C.nvmlReturn_t {
	return cudaVersion("nvmlSystemGetCudaDriverVersion_v2", cudaDriverVersion)
}

func cudaVersion(function string, out *C.int) C.nvmlReturn_t {
	return initialised(function, func() C.nvmlReturn_t {
		if out == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		v, _ := lib.cfg.CUDADriverVersion()
		*out = C.int(v)
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(deviceCount *C.uint) C.nvmlReturn_t {
	return countDevices("nvmlDeviceGetCount_v2", deviceCount)
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(deviceCount *C.uint) C.nvmlReturn_t {
	return countDevices("nvmlDeviceGetCount", deviceCount)
}

func countDevices(function string, out *C.uint) C.nvmlReturn_t {
	return initialised(function, func() C.nvmlReturn_t {
		if out == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*out = C.uint(len(lib.gpus))
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return handleByIndex("nvmlDeviceGetHandleByIndex_v2", index, device)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return handleByIndex("nvmlDeviceGetHandleByIndex", index, device)
}

func handleByIndex(function string, index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	return initialised(function, func() C.nvmlReturn_t {
		if out == nil || int(index) >= len(lib.gpus) {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*out = lib.gpus[index].handle
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(uuid *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return initialised("nvmlDeviceGetHandleByUUID", func() C.nvmlReturn_t {
		if uuid == nil || device == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		want := C.GoString(uuid)
		for _, g := range lib.gpus {
			if strings.EqualFold(g.UUID, want) {
				*device = g.handle
				return C.NVML_SUCCESS
			}
		}
		return C.NVML_ERROR_NOT_FOUND
	})
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(pciBusID *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return initialised("nvmlDeviceGetHandleByPciBusId_v2", func() C.nvmlReturn_t {
		if pciBusID == nil || device == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		want, err := config.ParsePCIBusID(C.GoString(pciBusID))
		if err != nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		for _, g := range lib.gpus {
			if g.address == want {
				*device = g.handle
				return C.NVML_SUCCESS
			}
		}
		return C.NVML_ERROR_NOT_FOUND
	})
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device C.nvmlDevice_t, uuid *C.char, length C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetUUID", device, func(g *gpu) C.nvmlReturn_t {
		return putString(uuid, length, g.UUID)
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device C.nvmlDevice_t, name *C.char, length C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetName", device, func(g *gpu) C.nvmlReturn_t {
		return putString(name, length, g.Name)
	})
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetIndex", device, func(g *gpu) C.nvmlReturn_t {
		if index == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*index = device.index
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device C.nvmlDevice_t, minorNumber *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMinorNumber", device, func(g *gpu) C.nvmlReturn_t {
		if minorNumber == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*minorNumber = C.uint(g.Minor)
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device C.nvmlDevice_t, memory *C.nvmlMemory_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMemoryInfo", device, func(g *gpu) C.nvmlReturn_t {
		if memory == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		// an idle GPU: nothing allocated
		*memory = C.nvmlMemory_t{total: C.ulonglong(g.MemoryBytes), free: C.ulonglong(g.MemoryBytes)}
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(device C.nvmlDevice_t, memory *C.nvmlMemory_v2_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMemoryInfo_v2", device, func(g *gpu) C.nvmlReturn_t {
		if memory == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if memory.version != C.SIMNVML_MEMORY_V2_VERSION {
			return C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
		}
		*memory = C.nvmlMemory_v2_t{version: memory.version, total: C.ulonglong(g.MemoryBytes),
			free: C.ulonglong(g.MemoryBytes)}
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetPciInfo_v3", device, func(g *gpu) C.nvmlReturn_t {
		if pci == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*pci = C.nvmlPciInfo_t{
			domain: C.uint(g.address.Domain), bus: C.uint(g.address.Bus), device: C.uint(g.address.Device),
			pciDeviceId: C.uint(uint32(g.PCIDeviceID)<<16 | nvidiaVendorID),
		}
		putArray(pci.busIdLegacy[:], g.address.LegacyBusID())
		putArray(pci.busId[:], g.address.BusID())
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device C.nvmlDevice_t, major, minor *C.int) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetCudaComputeCapability", device, func(g *gpu) C.nvmlReturn_t {
		if major == nil || minor == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*major, *minor = C.int(g.ccMajor), C.int(g.ccMinor)
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device C.nvmlDevice_t, arch *C.nvmlDeviceArchitecture_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetArchitecture", device, func(g *gpu) C.nvmlReturn_t {
		if arch == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*arch = C.nvmlDeviceArchitecture_t(g.ArchitectureValue())
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device C.nvmlDevice_t, brand *C.nvmlBrandType_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetBrand", device, func(g *gpu) C.nvmlReturn_t {
		if brand == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*brand = C.nvmlBrandType_t(g.BrandValue())
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(device C.nvmlDevice_t, node *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetNumaNodeId", device, func(g *gpu) C.nvmlReturn_t {
		if node == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if g.NUMANode == nil {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		*node = C.uint(*g.NUMANode)
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetTopologyCommonAncestor
func nvmlDeviceGetTopologyCommonAncestor(device1, device2 C.nvmlDevice_t, pathInfo *C.nvmlGpuTopologyLevel_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetTopologyCommonAncestor", device1, func(g1 *gpu) C.nvmlReturn_t {
		g2 := device(device2)
		if g2 == nil || pathInfo == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		// no PCIe switches or NVLinks: GPUs meet at their NUMA node's CPU, or across CPUs
		level := topologySystem
		switch {
		case g1 == g2:
			level = topologyInternal
		case numaNode(g1) == numaNode(g2):
			level = topologyNode
		}
		*pathInfo = C.nvmlGpuTopologyLevel_t(level)
		return C.NVML_SUCCESS
	})
}

func numaNode(g *gpu) uint32 {
	if g.NUMANode == nil {
		return 0
	}
	return *g.NUMANode
}

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device C.nvmlDevice_t, currentMode, pendingMode *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMigMode", device, func(g *gpu) C.nvmlReturn_t {
		if currentMode == nil || pendingMode == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if !g.MIGCapable {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		// NVML_DEVICE_MIG_DISABLE, and no change pending
		*currentMode, *pendingMode = 0, 0
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMaxMigDeviceCount", device, func(g *gpu) C.nvmlReturn_t {
		if count == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if !g.MIGCapable {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		*count = maxMigDevices
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(device C.nvmlDevice_t, index C.uint, migDevice *C.nvmlDevice_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetMigDeviceHandleByIndex", device, func(g *gpu) C.nvmlReturn_t {
		if migDevice == nil || index >= maxMigDevices {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if !g.MIGCapable {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		// MIG mode is disabled: no MIG device at any index
		return C.NVML_ERROR_NOT_FOUND
	})
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device C.nvmlDevice_t, isMigDevice *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceIsMigDeviceHandle", device, func(g *gpu) C.nvmlReturn_t {
		if isMigDevice == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*isMigDevice = 0
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice C.nvmlDevice_t, device *C.nvmlDevice_t) C.nvmlReturn_t {
	// every handle is a full GPU's, which NVML refuses here
	return onDevice("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice, func(g *gpu) C.nvmlReturn_t {
		return C.NVML_ERROR_INVALID_ARGUMENT
	})
}

//export nvmlDeviceGetRemappedRows
func nvmlDeviceGetRemappedRows(device C.nvmlDevice_t, corrRows, uncRows, isPending, failureOccurred *C.uint) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetRemappedRows", device, func(g *gpu) C.nvmlReturn_t {
		if corrRows == nil || uncRows == nil || isPending == nil || failureOccurred == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		// row remapping came with Ampere; a healthy GPU has remapped nothing
		if g.ArchitectureValue() < archAmpere {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		*corrRows, *uncRows, *isPending, *failureOccurred = 0, 0, 0, 0
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(device C.nvmlDevice_t, eventTypes *C.ulonglong) C.nvmlReturn_t {
	return onDevice("nvmlDeviceGetSupportedEventTypes", device, func(g *gpu) C.nvmlReturn_t {
		if eventTypes == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		*eventTypes = supportedEvents
		return C.NVML_SUCCESS
	})
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *C.nvmlEventSet_t) C.nvmlReturn_t {
	return initialised("nvmlEventSetCreate", func() C.nvmlReturn_t {
		if set == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		s := (C.nvmlEventSet_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_nvmlEventSet_st{}))))
		if lib.eventSets == nil {
			lib.eventSets = map[C.nvmlEventSet_t]bool{}
		}
		lib.eventSets[s] = true
		*set = s
		return C.NVML_SUCCESS
	})
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device C.nvmlDevice_t, eventTypes C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	return onDevice("nvmlDeviceRegisterEvents", device, func(g *gpu) C.nvmlReturn_t {
		if !lib.eventSets[set] {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		if uint64(eventTypes)&^supportedEvents != 0 {
			return C.NVML_ERROR_NOT_SUPPORTED
		}
		return C.NVML_SUCCESS
	})
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data unsafe.Pointer, timeoutms C.uint) C.nvmlReturn_t {
	ret := initialised("nvmlEventSetWait_v2", func() C.nvmlReturn_t {
		if !lib.eventSets[set] || data == nil {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		return C.NVML_ERROR_TIMEOUT
	})
	if ret == C.NVML_ERROR_TIMEOUT {
		// healthy GPUs raise no events: the caller waits its whole timeout, as it would on a real one, instead
		// of spinning on an immediate answer
		time.Sleep(time.Duration(timeoutms) * time.Millisecond)
	}
	return ret
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	return initialised("nvmlEventSetFree", func() C.nvmlReturn_t {
		if !lib.eventSets[set] {
			return C.NVML_ERROR_INVALID_ARGUMENT
		}
		delete(lib.eventSets, set)
		C.free(unsafe.Pointer(set))
		return C.NVML_SUCCESS
	})
}
