// Package config is the file that describes the GPUs of the simulated NVML (tests/node/simnvml): the real-node
// tests write it (or embed it into a copy of the library), the library reads it at each first nvmlInit.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

const (
	// EnvVar names the file. Without it the library reads the config its own file carries (Config.Embed), else
	// FileName in its own folder.
	EnvVar = "SIMNVML_CONFIG"
	// FileName is the file beside the library, which travels with it when the library's folder is mounted into
	// a container (the device plugin's /driver-root).
	FileName = "simnvml.json"
	// TraceEnvVar, set to anything, makes the library name every NVML call it answers on stderr.
	TraceEnvVar = "SIMNVML_TRACE"
	// LibraryName is the library's file name and ELF soname, the name go-nvml loads.
	LibraryName = "libnvidia-ml.so.1"
)

// Config is the simulated machine: its driver and its GPUs, in NVML index order.
type Config struct {
	// DriverVersion is what nvmlSystemGetDriverVersion returns, e.g. "580.65.06".
	DriverVersion string `json:"driverVersion"`
	// CUDAVersion is the CUDA driver API version, "major.minor" (e.g. "13.0"); nvmlSystemGetCudaDriverVersion
	// returns it as major*1000 + minor*10.
	CUDAVersion string `json:"cudaVersion"`
	GPUs        []GPU  `json:"gpus"`
}

// GPU is one device.
type GPU struct {
	// Name is the product name, e.g. "NVIDIA H100 80GB HBM3".
	Name string `json:"name"`
	// UUID is "GPU-" and a UUID.
	UUID string `json:"uuid"`
	// MemoryBytes is the total memory.
	MemoryBytes uint64 `json:"memoryBytes"`
	// PCIBusID is domain:bus:device.function in hex, e.g. "0000:3b:00.0" (a domain of 4 or 8 digits).
	PCIBusID string `json:"pciBusID"`
	// PCIDeviceID is the 16-bit PCI device id (e.g. 0x2330); NVML reports it with NVIDIA's vendor id, 0x10de.
	PCIDeviceID uint16 `json:"pciDeviceID,omitempty"`
	// Minor is the minor number of the GPU's device node, /dev/nvidia<Minor>.
	Minor uint32 `json:"minor"`
	// ComputeCapability is "major.minor", e.g. "9.0".
	ComputeCapability string `json:"computeCapability"`
	// Architecture is one of Architectures' names; empty derives it from the compute capability.
	Architecture string `json:"architecture,omitempty"`
	// Brand is one of Brands' names; empty is "nvidia", what data-center GPUs report.
	Brand string `json:"brand,omitempty"`
	// MIGCapable makes nvmlDeviceGetMigMode answer (MIG disabled, none pending) instead of NOT_SUPPORTED.
	MIGCapable bool `json:"migCapable,omitempty"`
	// NUMANode, when set, is what nvmlDeviceGetNumaNodeId returns (NOT_SUPPORTED otherwise).
	NUMANode *uint32 `json:"numaNode,omitempty"`
}

// Architectures are the names Architecture takes, with their nvmlDeviceArchitecture_t values.
var Architectures = map[string]uint32{
	"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8, "hopper": 9,
	"blackwell": 10,
}

// Brands are the names Brand takes, with their nvmlBrandType_t values.
var Brands = map[string]int32{
	"quadro": 1, "tesla": 2, "nvs": 3, "geforce": 5, "titan": 6, "quadro-rtx": 12, "nvidia-rtx": 13, "nvidia": 14,
}

// WriteFile writes c as JSON to path, after checking it.
func (c Config) WriteFile(path string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadFile reads and checks the file at path.
func ReadFile(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := decode(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func decode(b []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	// a misspelt field would otherwise silently fall back to a default
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

var uuidPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// Validate says what in c the library could not answer faithfully.
func (c Config) Validate() error {
	var errs []error
	if parts := strings.Split(c.DriverVersion, "."); len(parts) < 2 || len(parts) > 3 || !allNumbers(parts) {
		// GFD rejects a driver version that is not X.Y[.Z]
		errs = append(errs, fmt.Errorf("driverVersion %q is not X.Y[.Z]", c.DriverVersion))
	}
	if _, err := c.CUDADriverVersion(); err != nil {
		errs = append(errs, err)
	}
	uuids, busIDs, minors := map[string]bool{}, map[PCIAddress]bool{}, map[uint32]bool{}
	for i, g := range c.GPUs {
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("gpus[%d]: "+format, append([]any{i}, args...)...))
		}
		if g.Name == "" {
			fail("no name")
		}
		if !uuidPattern.MatchString(g.UUID) {
			fail("uuid %q is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", g.UUID)
		} else if uuids[strings.ToLower(g.UUID)] {
			fail("uuid %s is another GPU's", g.UUID)
		}
		uuids[strings.ToLower(g.UUID)] = true
		if g.MemoryBytes == 0 {
			fail("no memoryBytes")
		}
		if a, err := ParsePCIBusID(g.PCIBusID); err != nil {
			fail("%v", err)
		} else if busIDs[a] {
			fail("pciBusID %s is another GPU's", g.PCIBusID)
		} else {
			busIDs[a] = true
		}
		if minors[g.Minor] {
			fail("minor %d is another GPU's", g.Minor)
		}
		minors[g.Minor] = true
		if _, _, err := g.ComputeCapabilityParts(); err != nil {
			fail("%v", err)
		}
		if _, ok := Architectures[g.Architecture]; g.Architecture != "" && !ok {
			fail("architecture %q is none of %v", g.Architecture, keys(Architectures))
		}
		if _, ok := Brands[g.Brand]; g.Brand != "" && !ok {
			fail("brand %q is none of %v", g.Brand, keys(Brands))
		}
	}
	return errors.Join(errs...)
}

// CUDADriverVersion is CUDAVersion as NVML reports it: major*1000 + minor*10.
func (c Config) CUDADriverVersion() (int32, error) {
	major, minor, ok := majorMinor(c.CUDAVersion)
	if !ok {
		return 0, fmt.Errorf("cudaVersion %q is not major.minor", c.CUDAVersion)
	}
	return int32(major*1000 + minor*10), nil
}

// ComputeCapabilityParts is ComputeCapability's major and minor.
func (g GPU) ComputeCapabilityParts() (int32, int32, error) {
	major, minor, ok := majorMinor(g.ComputeCapability)
	if !ok || major == 0 {
		return 0, 0, fmt.Errorf("computeCapability %q is not major.minor", g.ComputeCapability)
	}
	return int32(major), int32(minor), nil
}

// ArchitectureValue is the nvmlDeviceArchitecture_t of the GPU: Architecture's, or the one its compute
// capability belongs to.
func (g GPU) ArchitectureValue() uint32 {
	if a, ok := Architectures[g.Architecture]; ok {
		return a
	}
	major, minor, _ := g.ComputeCapabilityParts()
	switch {
	case major == 3:
		return Architectures["kepler"]
	case major == 5:
		return Architectures["maxwell"]
	case major == 6:
		return Architectures["pascal"]
	case major == 7 && minor < 5:
		return Architectures["volta"]
	case major == 7:
		return Architectures["turing"]
	case major == 8 && minor < 9:
		return Architectures["ampere"]
	case major == 8:
		return Architectures["ada"]
	case major == 9:
		return Architectures["hopper"]
	case major == 10 || major == 12:
		return Architectures["blackwell"]
	}
	return 0xffffffff // NVML_DEVICE_ARCH_UNKNOWN
}

// BrandValue is the nvmlBrandType_t of the GPU.
func (g GPU) BrandValue() int32 {
	if b, ok := Brands[g.Brand]; ok {
		return b
	}
	return Brands["nvidia"]
}

// PCIAddress is a PCI function's address.
type PCIAddress struct {
	Domain, Bus, Device, Function uint32
}

// ParsePCIBusID parses domain:bus:device.function (hex; a domain of 4 or 8 digits, as NVML writes them).
func ParsePCIBusID(s string) (PCIAddress, error) {
	bad := fmt.Errorf("pciBusID %q is not domain:bus:device.function", s)
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return PCIAddress{}, bad
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return PCIAddress{}, bad
	}
	var a PCIAddress
	for _, f := range []struct {
		text string
		bits int
		to   *uint32
	}{{parts[0], 32, &a.Domain}, {parts[1], 8, &a.Bus}, {devFn[0], 5, &a.Device}, {devFn[1], 3, &a.Function}} {
		v, err := strconv.ParseUint(f.text, 16, f.bits)
		if err != nil || f.text == "" {
			return PCIAddress{}, bad
		}
		*f.to = uint32(v)
	}
	return a, nil
}

// BusID is the address as NVML's busId writes it: "%08X:%02X:%02X.0".
func (a PCIAddress) BusID() string {
	return fmt.Sprintf("%08X:%02X:%02X.%X", a.Domain, a.Bus, a.Device, a.Function)
}

// LegacyBusID is the address as NVML's busIdLegacy writes it: "%04X:%02X:%02X.0".
func (a PCIAddress) LegacyBusID() string {
	return fmt.Sprintf("%04X:%02X:%02X.%X", a.Domain, a.Bus, a.Device, a.Function)
}

func majorMinor(s string) (int, int, bool) {
	major, minor, ok := strings.Cut(s, ".")
	if !ok {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || ma < 0 || mi < 0 || mi > 99 {
		return 0, 0, false
	}
	return ma, mi, true
}

func allNumbers(parts []string) bool {
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
