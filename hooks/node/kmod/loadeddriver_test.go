package kmod_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
)

// The NVRM banners of /proc/driver/nvidia/version as drivers print them (NVIDIA's README, "Open Linux Kernel
// Modules"; the second open form from nvidia-open 590 builds, nix-community/nixGL#220).
func TestLoadedDriverReadsVersionAndFlavour(t *testing.T) {
	cases := []struct {
		banner, version, flavour string
	}{
		{"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Sep 25 18:29:06 UTC 2025", "580.95.05", kmod.FlavourOpen},
		{"NVRM version: NVIDIA UNIX Open Kernel x86_64 Kernel Module  590.48.01  Mon Dec  8 11:22:45 UTC 2025", "590.48.01", kmod.FlavourOpen},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.172.08  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul  8 17:56:30 UTC 2025", "570.172.08", kmod.FlavourOpen},
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 16 03:13:10 UTC 2025", "535.261.03", kmod.FlavourProprietary},
	}
	for _, c := range cases {
		f := kmodtest.New(t)
		f.LoadDriver()
		write(t, f, "sys/module/nvidia/version", c.version+"\n")
		write(t, f, "proc/driver/nvidia/version", c.banner+"\nGCC version:  gcc version 12.3.0\n")
		d, err := f.Host().LoadedDriver()
		if err != nil || d.Version != c.version || d.Flavour != c.flavour {
			t.Errorf("%q: got %+v, %v; want %s %s", c.banner, d, err, c.version, c.flavour)
		}
	}
}

// Never a guess: what cannot be read or recognised is an error.
func TestLoadedDriverRefusesWhatItCannotRead(t *testing.T) {
	cases := map[string]struct{ version, banner string }{
		"no version file":  {"", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Release Build"},
		"a branch":         {"580", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580  Release Build"},
		"no banner":        {"580.95.05", ""},
		"another version":  {"580.95.05", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Release Build"},
		"no flavour":       {"580.95.05", "NVRM version: 580.95.05"},
		"not an NVRM line": {"580.95.05", "GCC version: 580.95.05 Kernel Module"},
		"garbage in sysfs": {"580.95.05 extra", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05"},
	}
	for name, c := range cases {
		f := kmodtest.New(t)
		f.LoadDriver()
		if c.version != "" {
			write(t, f, "sys/module/nvidia/version", c.version+"\n")
		}
		if c.banner != "" {
			write(t, f, "proc/driver/nvidia/version", c.banner+"\n")
		}
		if d, err := f.Host().LoadedDriver(); err == nil {
			t.Errorf("%s: read %+v, want an error", name, d)
		}
	}
}

func TestRecordDigestIsWhatTheDriverContainerReads(t *testing.T) {
	f := kmodtest.New(t)
	f.DriverState("3274061929")
	h := f.Host()
	if err := h.RecordDigest(strings.Repeat("ab", 32)); err != nil {
		t.Fatal(err)
	}
	if d, ok, err := h.RecordedDigest(); err != nil || !ok || d != strings.Repeat("ab", 32) {
		t.Fatalf("recorded %q %v %v", d, ok, err)
	}
	if _, err := os.Stat(h.OwnStateFile() + ".tmp"); err == nil {
		t.Error("temporary file left")
	}
}

func write(t *testing.T, f *kmodtest.Fixture, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(f.Root, p)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.Root, p), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
