package kmod_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
)

// FuzzProcModules feeds any text as the host's /proc/modules to every reader of it: the module list, the
// driver manager's view of the NVIDIA modules and its pre-unload check, and the validator's. None may panic, and a
// name is never empty nor holds white space.
func FuzzProcModules(f *testing.F) {
	root := f.TempDir()
	for _, d := range []string{"proc", "sys/module/nvidia/holders"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "sys/module/nvidia/refcnt"), []byte("0\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	h := kmod.Host{Root: root, OwnRoot: root, DriverRoot: "/run/nvidia/driver", MountInfo: "/proc/self/mountinfo", SysDir: filepath.Join(root, "sys")}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range kmod.ModuleNames(data) {
			if name == "" || strings.IndexFunc(name, unicode.IsSpace) >= 0 {
				t.Fatalf("module name %q", name)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "proc/modules"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		mods, err := h.Loaded()
		if err != nil {
			t.Fatal(err)
		}
		if len(mods) == 0 || mods[len(mods)-1].Name != "nvidia" {
			t.Fatalf("loaded %+v: nvidia, which has a refcnt, is missing", mods)
		}
		_ = h.CheckUnload()
		_, _ = hostfs.Root(root).LoadedModules()
	})
}

// FuzzMountInfo feeds any text as the manager's mount table: the mount points are read without a panic, the
// driver root's are only those at or below it, and the fixture kernel can unmount each.
func FuzzMountInfo(f *testing.F) {
	root := f.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc/self"), 0o755); err != nil {
		f.Fatal(err)
	}
	h := kmod.Host{Root: root, OwnRoot: root, DriverRoot: "/run/nvidia/driver", MountInfo: "/proc/self/mountinfo", SysDir: filepath.Join(root, "sys")}
	table := filepath.Join(root, "proc/self/mountinfo")
	k := kmod.NewFixtureKernel(h)
	f.Fuzz(func(t *testing.T, data []byte) {
		all := kmod.MountPoints(data)
		if !strings.Contains(string(data), `\`) {
			for _, mp := range all {
				if !strings.Contains(string(data), mp) {
					t.Fatalf("mount point %q is not in the table", mp)
				}
			}
		}
		if err := os.WriteFile(table, data, 0o644); err != nil {
			t.Fatal(err)
		}
		mps, err := h.DriverRootMounts()
		if err != nil {
			t.Fatal(err)
		}
		for _, mp := range mps {
			if mp != h.DriverRoot && !strings.HasPrefix(mp, h.DriverRoot+"/") {
				t.Fatalf("%q is not at or below the driver root", mp)
			}
			_ = k.Unmount(filepath.Join(root, mp))
		}
	})
}
