//go:build cgo

package build

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

func numa(n uint32) *uint32 { return &n }

// twoGPUs is the machine most tests simulate: a MIG-capable Hopper and an Ampere that is not, on two NUMA nodes,
// with minor numbers that are not their indices.
var twoGPUs = config.Config{
	DriverVersion: "580.65.06",
	CUDAVersion:   "13.0",
	GPUs: []config.GPU{{
		Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-5a3f1c2e-8d4b-4e6a-9f10-2b3c4d5e6f70", MemoryBytes: 85520809984,
		PCIBusID: "0000:3b:00.0", PCIDeviceID: 0x2330, Minor: 0, ComputeCapability: "9.0", MIGCapable: true,
	}, {
		Name: "NVIDIA A10", UUID: "GPU-6b4f2d3f-9e5c-4f7b-a021-3c4d5e6f7081", MemoryBytes: 24146608128,
		PCIBusID: "0000:86:00.0", PCIDeviceID: 0x2236, Minor: 2, ComputeCapability: "8.6", NUMANode: numa(1),
	}},
}

// useConfig points the library at cfg for the rest of the test.
func useConfig(t *testing.T, cfg config.Config) {
	t.Helper()
	path := filepath.Join(t.TempDir(), config.FileName)
	if err := cfg.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	// os.Setenv reaches the C environment, where the library reads it (the test binary is cgo)
	t.Setenv(config.EnvVar, path)
}

// initNVML loads the library through go-nvml and initialises it until the test ends.
func initNVML(t *testing.T) nvml.Interface {
	t.Helper()
	n := nvml.New(nvml.WithLibraryPath(library(t)))
	if ret := n.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() {
		if ret := n.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("Shutdown: %v", ret)
		}
	})
	return n
}

// TestStructLayouts compiles a C program against the library's hand-written header and compares its struct
// layouts, return codes and version word with go-nvml's, which cgo generated from the real nvml.h.
func TestStructLayouts(t *testing.T) {
	library(t) // skips where cgo cannot build
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "layout.c")
	program := `#include <stddef.h>
#include <stdio.h>
#include "nvml_types.h"
#define FIELD(T, f) printf(#T "." #f " %zu\n", offsetof(T, f))
int main(void) {
	printf("nvmlPciInfo_t %zu\n", sizeof(nvmlPciInfo_t));
	FIELD(nvmlPciInfo_t, busIdLegacy); FIELD(nvmlPciInfo_t, domain); FIELD(nvmlPciInfo_t, bus);
	FIELD(nvmlPciInfo_t, device); FIELD(nvmlPciInfo_t, pciDeviceId); FIELD(nvmlPciInfo_t, pciSubSystemId);
	FIELD(nvmlPciInfo_t, busId);
	printf("nvmlMemory_t %zu\n", sizeof(nvmlMemory_t));
	FIELD(nvmlMemory_t, total); FIELD(nvmlMemory_t, free); FIELD(nvmlMemory_t, used);
	printf("nvmlMemory_v2_t %zu\n", sizeof(nvmlMemory_v2_t));
	FIELD(nvmlMemory_v2_t, version); FIELD(nvmlMemory_v2_t, total); FIELD(nvmlMemory_v2_t, reserved);
	FIELD(nvmlMemory_v2_t, free); FIELD(nvmlMemory_v2_t, used);
	printf("version.Memory_v2 %u\n", SIMNVML_MEMORY_V2_VERSION);
	printf("sizeof.nvmlReturn_t %zu\n", sizeof(nvmlReturn_t));
	printf("return.SUCCESS %d\nreturn.ERROR_UNINITIALIZED %d\nreturn.ERROR_INVALID_ARGUMENT %d\n", NVML_SUCCESS, NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT);
	printf("return.ERROR_NOT_SUPPORTED %d\nreturn.ERROR_NOT_FOUND %d\nreturn.ERROR_INSUFFICIENT_SIZE %d\n", NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_INSUFFICIENT_SIZE);
	printf("return.ERROR_DRIVER_NOT_LOADED %d\nreturn.ERROR_TIMEOUT %d\n", NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_TIMEOUT);
	printf("return.ERROR_ARGUMENT_VERSION_MISMATCH %d\nreturn.ERROR_UNKNOWN %d\n", NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_UNKNOWN);
	return 0;
}
`
	if err := os.WriteFile(src, []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "layout")
	if out, err := exec.Command(strings.TrimSpace(string(cc)), "-I", "..", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("compile: %v: %s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got[k] = n
	}
	want := map[string]uint64{
		"version.Memory_v2":   uint64(nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2)),
		"sizeof.nvmlReturn_t": uint64(reflect.TypeFor[nvml.Return]().Size()),
	}
	for cName, goValue := range map[string]any{"nvmlPciInfo_t": nvml.PciInfo{}, "nvmlMemory_t": nvml.Memory{},
		"nvmlMemory_v2_t": nvml.Memory_v2{}} {
		typ := reflect.TypeOf(goValue)
		want[cName] = uint64(typ.Size())
		for i := range typ.NumField() {
			f := typ.Field(i)
			// go-nvml's fields are the C fields with their first letter upper-cased
			want[cName+"."+strings.ToLower(f.Name[:1])+f.Name[1:]] = uint64(f.Offset)
		}
	}
	for name, code := range map[string]nvml.Return{"SUCCESS": nvml.SUCCESS, "ERROR_UNINITIALIZED": nvml.ERROR_UNINITIALIZED,
		"ERROR_INVALID_ARGUMENT": nvml.ERROR_INVALID_ARGUMENT, "ERROR_NOT_SUPPORTED": nvml.ERROR_NOT_SUPPORTED,
		"ERROR_NOT_FOUND": nvml.ERROR_NOT_FOUND, "ERROR_INSUFFICIENT_SIZE": nvml.ERROR_INSUFFICIENT_SIZE,
		"ERROR_DRIVER_NOT_LOADED": nvml.ERROR_DRIVER_NOT_LOADED, "ERROR_TIMEOUT": nvml.ERROR_TIMEOUT,
		"ERROR_ARGUMENT_VERSION_MISMATCH": nvml.ERROR_ARGUMENT_VERSION_MISMATCH, "ERROR_UNKNOWN": nvml.ERROR_UNKNOWN} {
		want["return."+name] = uint64(code)
	}
	if !reflect.DeepEqual(got, want) {
		for k := range want {
			if got[k] != want[k] {
				t.Errorf("%s: the header's %d, go-nvml's %d", k, got[k], want[k])
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s: the header has it, go-nvml's type has no such field", k)
			}
		}
	}
}

// child is the body of the test binary run as a child: it loads the library (SIMNVML_TEST_LIBRARY),
// initialises NVML and prints the result and the GPUs' names; the library's complaints land on the child's
// stderr for the parent to read. A fresh process loads only the library it is given: one process that dlopens
// two copies of the library (different files) gets two Go runtimes, and the first copy answers every call.
func child(mode string) int {
	if mode != "init" {
		fmt.Fprintf(os.Stderr, "unknown child mode %q\n", mode)
		return 2
	}
	n := nvml.New(nvml.WithLibraryPath(os.Getenv("SIMNVML_TEST_LIBRARY")))
	ret := n.Init()
	fmt.Print(int(ret))
	if ret == nvml.SUCCESS {
		defer n.Shutdown()
		count, _ := n.DeviceGetCount()
		for i := range count {
			d, _ := n.DeviceGetHandleByIndex(i)
			name, _ := d.GetName()
			fmt.Printf(" %q", name)
		}
	}
	fmt.Println()
	return 0
}

// runChild runs the test binary as a child on lib with env added, returning its stdout and stderr.
func runChild(t *testing.T, lib string, env ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), childEnv+"=init", "SIMNVML_TEST_LIBRARY="+lib), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), stderr.String()
}

// TestInitWithoutConfig: a missing or wrong config makes nvmlInit fail as NVML does without a driver
// (NVML_ERROR_DRIVER_NOT_LOADED), saying on stderr which file and what is wrong.
func TestInitWithoutConfig(t *testing.T) {
	lib := library(t)
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"driverVersion": "580.65.06", "cudaVersion": "13.0", "gpu": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// a copy of the library alone in a folder: no simnvml.json beside it, no config in it
	alone := filepath.Join(t.TempDir(), config.LibraryName)
	if err := copyFile(lib, alone); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, lib, config, complaint string }{
		{"missing", lib, "/nonexistent/simnvml.json", "open /nonexistent/simnvml.json: no such file or directory"},
		{"unknown field", lib, bad, `json: unknown field "gpu"`},
		{"none beside", alone, "", "open " + filepath.Join(filepath.Dir(alone), config.FileName) +
			": no such file or directory (SIMNVML_CONFIG is not set and " + alone + " carries no config)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr := runChild(t, c.lib, config.EnvVar+"="+c.config)
			if out != strconv.Itoa(int(nvml.ERROR_DRIVER_NOT_LOADED)) {
				t.Errorf("Init returned %s, want %d (ERROR_DRIVER_NOT_LOADED)", out, nvml.ERROR_DRIVER_NOT_LOADED)
			}
			for _, want := range []string{"simnvml: nvmlInit_v2: NVML_ERROR_DRIVER_NOT_LOADED: no GPUs to simulate", c.complaint} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// TestEmbeddedConfig: a library that carries its config (config.Embed) answers for it without SIMNVML_CONFIG
// and before a simnvml.json beside it, loaded through a link as the container toolkit's CDI spec mounts it
// (libnvidia-ml.so.<driver version>, and libnvidia-ml.so.1 linking to it).
func TestEmbeddedConfig(t *testing.T) {
	lib := library(t)
	dir := t.TempDir()
	versioned := filepath.Join(dir, "libnvidia-ml.so."+twoGPUs.DriverVersion)
	if err := twoGPUs.Embed(lib, versioned); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(versioned), filepath.Join(dir, config.LibraryName)); err != nil {
		t.Fatal(err)
	}
	other := twoGPUs
	other.GPUs = twoGPUs.GPUs[1:]
	if err := other.WriteFile(filepath.Join(dir, config.FileName)); err != nil {
		t.Fatal(err)
	}
	out, stderr := runChild(t, filepath.Join(dir, config.LibraryName), config.EnvVar+"=")
	if want := `0 "NVIDIA H100 80GB HBM3" "NVIDIA A10"`; out != want {
		t.Errorf("child: %s, want %s (the embedded config's GPUs); stderr:\n%s", out, want, stderr)
	}
	if err := other.Embed(versioned, filepath.Join(dir, "twice")); err == nil {
		t.Error("a config was embedded into a library that carries one")
	}
}

// TestConfigBesideLibrary: without SIMNVML_CONFIG the library reads simnvml.json in its own folder, which it
// finds wherever it was loaded from.
func TestConfigBesideLibrary(t *testing.T) {
	lib := library(t)
	t.Setenv(config.EnvVar, "")
	one := twoGPUs
	one.GPUs = twoGPUs.GPUs[1:]
	beside := filepath.Join(filepath.Dir(lib), config.FileName)
	if err := one.WriteFile(beside); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(beside) })
	n := initNVML(t)
	count, ret := n.DeviceGetCount()
	if ret != nvml.SUCCESS || count != 1 {
		t.Fatalf("DeviceGetCount: %d, %v; want 1 (the file beside the library)", count, ret)
	}
	d, _ := n.DeviceGetHandleByIndex(0)
	if name, ret := d.GetName(); name != "NVIDIA A10" {
		t.Errorf("GetName: %q, %v", name, ret)
	}
}
