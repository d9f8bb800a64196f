package main

/*
#include <stdlib.h>
#include "nvml_types.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// gpu is a configured GPU with what NVML reports parsed once.
type gpu struct {
	config.GPU
	address config.PCIAddress
	ccMajor int32
	ccMinor int32
	handle  C.nvmlDevice_t
}

// lib is the library's state: NVML is initialised while inits > 0 (nvmlInit and nvmlShutdown count, as NVML's do).
var lib struct {
	sync.Mutex
	inits int
	cfg   config.Config
	gpus  []*gpu
	// handles stay allocated for the life of the process, one per index, so a handle a caller kept from an
	// earlier nvmlInit still names the same GPU
	handles []C.nvmlDevice_t
	// eventSets are the live event sets, by handle
	eventSets map[C.nvmlEventSet_t]bool
}

// readConfig finds the machine to simulate: the file SIMNVML_CONFIG names, else the config the library's own file
// carries (config.Embed), else simnvml.json beside the library.
func readConfig() (config.Config, error) {
	// the C environment, not os.Getenv: this Go runtime read its copy when the library was loaded, and the
	// caller may have set the variable since
	if p := cGetenv(config.EnvVar); p != "" {
		return config.ReadFile(p)
	}
	self := C.simnvml_library_path()
	if self == nil {
		return config.Config{}, fmt.Errorf("%s is not set and the library cannot find its own path", config.EnvVar)
	}
	path := C.GoString(self)
	if c, ok, err := config.ReadEmbedded(path); ok || err != nil {
		return c, err
	}
	c, err := config.ReadFile(filepath.Join(filepath.Dir(path), config.FileName))
	if err != nil {
		err = fmt.Errorf("%w (%s is not set and %s carries no config)", err, config.EnvVar, path)
	}
	return c, err
}

func cGetenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if v := C.getenv(cname); v != nil {
		return C.GoString(v)
	}
	return ""
}

// load reads the config; the caller holds lib's lock and NVML is not initialised.
func load() error {
	cfg, err := readConfig()
	if err != nil {
		return fmt.Errorf("no GPUs to simulate: %w", err)
	}
	var gpus []*gpu
	for i, g := range cfg.GPUs {
		address, _ := config.ParsePCIBusID(g.PCIBusID)
		major, minor, _ := g.ComputeCapabilityParts()
		if i == len(lib.handles) {
			h := (C.nvmlDevice_t)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_nvmlDevice_st{}))))
			h.index = C.uint(i)
			lib.handles = append(lib.handles, h)
		}
		gpus = append(gpus, &gpu{GPU: g, address: address, ccMajor: major, ccMinor: minor, handle: lib.handles[i]})
	}
	lib.cfg, lib.gpus = cfg, gpus
	return nil
}

// device is the GPU behind a handle: nil for a handle this library did not hand out (or one of an index the
// current config does not have). It is read without dereferencing the handle, so a stray pointer cannot crash.
func device(h C.nvmlDevice_t) *gpu {
	for _, g := range lib.gpus {
		if g.handle == h {
			return g
		}
	}
	return nil
}

// trace names a call on stderr when SIMNVML_TRACE is set.
func trace(function string, format string, args ...any) {
	if cGetenv(config.TraceEnvVar) == "" {
		return
	}
	fmt.Fprintf(os.Stderr, "simnvml: %s%s\n", function, strings.TrimRight(" "+fmt.Sprintf(format, args...), " "))
}

// putString writes s and its NUL into the caller's buffer of length bytes.
func putString(dst *C.char, length C.uint, s string) C.nvmlReturn_t {
	if dst == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	if uint64(len(s))+1 > uint64(length) {
		return C.NVML_ERROR_INSUFFICIENT_SIZE
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(length))
	buf[copy(buf, s)] = 0
	return C.NVML_SUCCESS
}

// putArray writes s and its NUL into a fixed char array of a struct, truncating as NVML would never need to.
func putArray(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = C.char(s[i])
	}
	for i := n; i < len(dst); i++ {
		dst[i] = 0
	}
}
