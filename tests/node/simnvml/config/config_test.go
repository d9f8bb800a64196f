package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func validConfig() Config {
	node := uint32(1)
	return Config{DriverVersion: "580.65.06", CUDAVersion: "12.8", GPUs: []GPU{
		{Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-5a3f1c2e-8d4b-4e6a-9f10-2b3c4d5e6f70", MemoryBytes: 85520809984,
			PCIBusID: "0000:3b:00.0", PCIDeviceID: 0x2330, ComputeCapability: "9.0", MIGCapable: true},
		{Name: "Tesla T4", UUID: "GPU-6b4f2d3f-9e5c-4f7b-a021-3c4d5e6f7081", MemoryBytes: 15843721216,
			PCIBusID: "00000000:AF:00.0", Minor: 1, ComputeCapability: "7.5", Brand: "tesla", NUMANode: &node},
	}}
}

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	want := validConfig()
	if err := want.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back %+v, wrote %+v", got, want)
	}
}

func TestReadRejectsUnknownFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, []byte(`{"driverVersion":"580.65.06","cudaVersion":"13.0","gpus":[],"gpuCount":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), `unknown field "gpuCount"`) {
		t.Errorf("ReadFile: %v; want the unknown field named", err)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"driver version", func(c *Config) { c.DriverVersion = "580" }, `driverVersion "580" is not X.Y[.Z]`},
		{"cuda version", func(c *Config) { c.CUDAVersion = "13" }, `cudaVersion "13" is not major.minor`},
		{"no name", func(c *Config) { c.GPUs[0].Name = "" }, "gpus[0]: no name"},
		{"uuid", func(c *Config) { c.GPUs[1].UUID = "5a3f1c2e" }, `gpus[1]: uuid "5a3f1c2e" is not GPU-`},
		{"same uuid", func(c *Config) { c.GPUs[1].UUID = strings.ToUpper(c.GPUs[0].UUID) }, "gpus[1]: uuid GPU-5A3F1C2E"},
		{"memory", func(c *Config) { c.GPUs[0].MemoryBytes = 0 }, "gpus[0]: no memoryBytes"},
		{"bus id", func(c *Config) { c.GPUs[0].PCIBusID = "3b:00.0" }, `pciBusID "3b:00.0" is not domain:bus:device.function`},
		{"same bus id", func(c *Config) { c.GPUs[1].PCIBusID = "00000000:3B:00.0" }, "gpus[1]: pciBusID 00000000:3B:00.0 is another GPU's"},
		{"same minor", func(c *Config) { c.GPUs[1].Minor = 0 }, "gpus[1]: minor 0 is another GPU's"},
		{"compute capability", func(c *Config) { c.GPUs[0].ComputeCapability = "9" }, `computeCapability "9" is not major.minor`},
		{"architecture", func(c *Config) { c.GPUs[0].Architecture = "Hopper" }, `architecture "Hopper" is none of`},
		{"brand", func(c *Config) { c.GPUs[0].Brand = "acme" }, `brand "acme" is none of`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := validConfig()
			c.change(&cfg)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate: %v; want %q", err, c.want)
			}
		})
	}
	if err := validConfig().Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

func TestParsePCIBusID(t *testing.T) {
	for in, want := range map[string]PCIAddress{
		"0000:3b:00.0":     {0, 0x3b, 0, 0},
		"00000000:3B:00.0": {0, 0x3b, 0, 0},
		"0001:af:1f.7":     {1, 0xaf, 0x1f, 7},
	} {
		got, err := ParsePCIBusID(in)
		if err != nil || got != want {
			t.Errorf("ParsePCIBusID(%q): %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "3b:00.0", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "0000:100:00.0", "0000::00.0"} {
		if a, err := ParsePCIBusID(bad); err == nil {
			t.Errorf("ParsePCIBusID(%q): %+v, want an error", bad, a)
		}
	}
	a := PCIAddress{Domain: 0, Bus: 0x3b}
	if a.BusID() != "00000000:3B:00.0" || a.LegacyBusID() != "0000:3B:00.0" {
		t.Errorf("BusID %q, LegacyBusID %q", a.BusID(), a.LegacyBusID())
	}
}

func TestNVMLValues(t *testing.T) {
	cfg := validConfig()
	if v, err := cfg.CUDADriverVersion(); err != nil || v != 12080 {
		t.Errorf("CUDADriverVersion: %d, %v; want 12080", v, err)
	}
	for cc, want := range map[string]uint32{"3.7": 2, "5.2": 3, "6.0": 4, "7.0": 5, "7.5": 6, "8.0": 7, "8.6": 7,
		"8.9": 8, "9.0": 9, "10.0": 10, "12.0": 10, "11.0": 0xffffffff} {
		if got := (GPU{ComputeCapability: cc}).ArchitectureValue(); got != want {
			t.Errorf("ArchitectureValue of compute capability %s: %d, want %d", cc, got, want)
		}
	}
	if got := (GPU{ComputeCapability: "9.0", Architecture: "blackwell"}).ArchitectureValue(); got != 10 {
		t.Errorf("ArchitectureValue with architecture set: %d, want it (10)", got)
	}
	if cfg.GPUs[0].BrandValue() != 14 || cfg.GPUs[1].BrandValue() != 2 {
		t.Errorf("BrandValue: %d, %d; want 14 (nvidia, the default) and 2 (tesla)", cfg.GPUs[0].BrandValue(), cfg.GPUs[1].BrandValue())
	}
}

func TestEmbed(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib.so")
	if err := os.WriteFile(lib, []byte("\x7fELF and the rest of a library"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadEmbedded(lib); ok || err != nil {
		t.Fatalf("ReadEmbedded of a plain library: %v, %v; want none", ok, err)
	}
	want := validConfig()
	carrying := filepath.Join(dir, "carrying.so")
	if err := want.Embed(lib, carrying); err != nil {
		t.Fatal(err)
	}
	got, ok, err := ReadEmbedded(carrying)
	if !ok || err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ReadEmbedded: %+v, %v, %v; want %+v", got, ok, err, want)
	}
	b, _ := os.ReadFile(carrying)
	if !strings.HasPrefix(string(b), "\x7fELF and the rest of a library{") {
		t.Errorf("the library's bytes are not kept first: %q", b[:40])
	}
	invalid := want
	invalid.DriverVersion = ""
	if err := invalid.Embed(lib, filepath.Join(dir, "invalid.so")); err == nil {
		t.Error("an invalid config was embedded")
	}
}
