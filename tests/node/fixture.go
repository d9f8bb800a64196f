package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// standInDriverVersion is the version the driver stand-in's nvidia-smi reports and its libraries are named by.
const standInDriverVersion = "595.91.07"

// nvmlPath is the driver root's NVML, by its versioned name.
var nvmlPath = "/" + driverLibDir + "/libnvidia-ml.so." + standInDriverVersion

// standInGPUs is the GPU the driver stand-in's NVML (tests/node/simnvml) answers for: the fixture host's one
// (HostTree's /dev/nvidia0, NVIDIAGPU's PCI function).
var standInGPUs = config.Config{DriverVersion: standInDriverVersion, CUDAVersion: "13.0", GPUs: []config.GPU{
	{Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-0c5a4e2b-0000-4000-8000-000000000001", MemoryBytes: 42949672960,
		PCIBusID: NVIDIAGPU.Address, PCIDeviceID: 0x20b0, Minor: 0, ComputeCapability: "8.0", MIGCapable: true},
}}

// DriverLinks are the driver root's links to DriverFiles' libraries by their sonames (path -> target), as a driver
// installs them: the toolkit's CDI generation finds the driver's version, and its libraries, by the versioned names.
var DriverLinks = map[string]string{
	"/" + driverLibDir + "/libnvidia-ml.so.1": "libnvidia-ml.so." + standInDriverVersion,
	"/" + driverLibDir + "/libcuda.so.1":      "libcuda.so." + standInDriverVersion,
}

// DriverFiles builds what a driver root holds for the checks that run it, into dir: an nvidia-smi that is
// dynamically linked against glibc (as the real one is, so a static image cannot exec it without the driver root's
// loader), a stub libcuda named by the driver's version, as a driver installs it (its .so.1 name is in
// DriverLinks), and this machine's glibc loader and libc. It returns them as path in the driver root -> file here.
// The driver root's NVML (nvmlPath) is the simulated one, which importImages adds.
func DriverFiles(ctx context.Context, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	smi := `#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
	if (argc > 1 && strcmp(argv[1], "--version") == 0) { printf("NVIDIA-SMI 595.91.07\nDRIVER version : 595.91.07\n"); return 0; }
	printf("GPU 0: NVIDIA Test GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)\n");
	return 0;
}
`
	lib := `int cuInit(unsigned int f) { return 0; }`
	if err := os.WriteFile(filepath.Join(dir, "smi.c"), []byte(smi), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "lib.c"), []byte(lib), 0o644); err != nil {
		return nil, err
	}
	for _, c := range [][]string{
		{"-O2", "-o", "nvidia-smi", "smi.c"},
		{"-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", "libcuda.so.1", "lib.c"},
	} {
		cmd := exec.CommandContext(ctx, "gcc", c...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("gcc %v: %v: %s", c, err, out)
		}
	}
	return map[string]string{
		"/usr/bin/nvidia-smi": filepath.Join(dir, "nvidia-smi"),
		"/" + driverLibDir + "/libcuda.so." + standInDriverVersion: filepath.Join(dir, "libcuda.so.1"),
		"/lib64/ld-linux-x86-64.so.2":                              "/lib64/ld-linux-x86-64.so.2",
		"/lib/x86_64-linux-gnu/libc.so.6":                          "/lib/x86_64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libc.so.6":                      "/lib/x86_64-linux-gnu/libc.so.6",
	}, nil
}

// HostTree creates the fixture GPU host under dir, used as global.hostPaths.rootFS: /dev/nvidia* character
// devices (the driver's major 195; nothing answers them, which no check here opens), /dev/char, the loaded-modules
// list and the module directories the driver manager and the validator read, and the folders a GPU node's
// runtime and toolkit have. With loaded, the NVIDIA modules are listed as loaded (a node whose driver is to be
// replaced); without, none is (a new node).
func HostTree(dir string, loaded bool) error {
	for _, d := range []string{"dev/char", "proc/self", "sys/module", "etc/containerd/conf.d", "usr/local/nvidia", "run/nvidia"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for name, minor := range map[string]int{"nvidia0": 0, "nvidiactl": 255} {
		if err := syscall.Mknod(filepath.Join(dir, "dev", name), syscall.S_IFCHR|0o666, 195<<8|minor); err != nil {
			return fmt.Errorf("mknod %s: %w", name, err)
		}
	}
	files := map[string]string{
		"proc/modules":        "",
		"proc/self/mountinfo": "",
		"etc/os-release":      "ID=ubuntu\nVERSION_ID=\"22.04\"\n",
	}
	if loaded {
		// the old driver's root, as the driver manager's fixture kernel reads the mount table (DRIVER_MANAGER_KERNEL)
		files["proc/self/mountinfo"] = "1000 1 0:50 / /run/nvidia/driver rw,relatime shared:500 - overlay overlay rw\n"
		// as Linux shows them: nvidia is used by nvidia_modeset and nvidia_uvm (proc/modules' "used by" column, and
		// their links under its sys/module/nvidia/holders)
		files["proc/modules"] = "nvidia_modeset 1 0 - Live 0x0\nnvidia_uvm 1 0 - Live 0x0\nnvidia 2 2 nvidia_modeset,nvidia_uvm, Live 0x0\n"
		for m, refs := range map[string]string{"nvidia": "2\n", "nvidia_uvm": "0\n", "nvidia_modeset": "0\n"} {
			if err := os.MkdirAll(filepath.Join(dir, "sys/module", m, "holders"), 0o755); err != nil {
				return err
			}
			files["sys/module/"+m+"/refcnt"] = refs
		}
		for _, h := range []string{"nvidia_modeset", "nvidia_uvm"} {
			if err := os.Symlink("../../"+h, filepath.Join(dir, "sys/module/nvidia/holders", h)); err != nil {
				return err
			}
		}
	}
	for p, data := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// MountKernelFS makes the fixture host's proc and sys their own mounts (bind mounts of themselves), as procfs and
// sysfs are on a real host. The chart mounts the host root read-only into the driver manager's pod, and only that
// top mount is read-only: on a real node the kernel changes /proc and /sys underneath, and here the driver
// manager's fixture kernel (DRIVER_MANAGER_KERNEL=fixture) edits these files, so they must stay writable the same
// way. The returned func unmounts them.
func MountKernelFS(dir string) (func() error, error) {
	var mounted []string
	undo := func() error {
		var errs []error
		for _, m := range slices.Backward(mounted) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, d := range []string{"proc", "sys"} {
		p := filepath.Join(dir, d)
		if err := unix.Mount(p, p, "", unix.MS_BIND, ""); err != nil {
			return nil, errors.Join(fmt.Errorf("bind %s: %w", p, err), undo())
		}
		mounted = append(mounted, p)
	}
	return undo, nil
}

// NVIDIAGPU is the PCI function PCIDevice adds for a GPU: an NVIDIA (vendor 10de) 3D controller (class 0302,
// programming interface 00), an A100's device and subsystem IDs, at a typical address.
var NVIDIAGPU = PCIFunction{Address: "0000:3b:00.0", Parent: "pci0000:3a/0000:3a:00.0",
	Vendor: "0x10de", Device: "0x20b0", Class: "0x030200", SubsystemVendor: "0x10de", SubsystemDevice: "0x134f"}

// PCIFunction is a PCI function as sysfs shows it.
type PCIFunction struct {
	// Address is its bus address; Parent the path of its bridge under sys/devices.
	Address, Parent string
	// The attribute files' contents, as sysfs writes them (0x-prefixed hex).
	Vendor, Device, Class, SubsystemVendor, SubsystemDevice string
}

// PCIDevice adds f to the fixture sysfs under sysDir as Linux lays it out: its folder under devices/, with the
// attributes NFD's pci source reads, and the bus/pci/devices link to it.
func PCIDevice(sysDir string, f PCIFunction) error {
	rel := filepath.Join("devices", f.Parent, f.Address)
	dev := filepath.Join(sysDir, rel)
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	for name, v := range map[string]string{"vendor": f.Vendor, "device": f.Device, "class": f.Class,
		"subsystem_vendor": f.SubsystemVendor, "subsystem_device": f.SubsystemDevice} {
		if err := os.WriteFile(filepath.Join(dev, name), []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	bus := filepath.Join(sysDir, "bus", "pci", "devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		return err
	}
	return os.Symlink(filepath.Join("..", "..", "..", rel), filepath.Join(bus, f.Address))
}
