// Package kmodtest builds fixture host trees for kmod and a fake Kernel that acts on them the way Linux does:
// a module is removable only when nothing holds or uses it, removing it releases the modules it used, and an
// unmount takes the mount out of the mount table.
package kmodtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
)

// DriverRoot is the fixture's driver root, in the manager's namespace.
const DriverRoot = "/run/nvidia/driver"

// Fixture is a host tree under Root; the host's root and the manager's own root are the same tree.
type Fixture struct {
	t    testing.TB
	Root string
	// Kernel acts on the tree.
	Kernel *Kernel
}

// New returns an empty node: no modules, no driver files, an empty mount table below the root mount.
func New(t testing.TB) *Fixture {
	t.Helper()
	f := &Fixture{t: t, Root: t.TempDir()}
	f.Kernel = &Kernel{f: f, fixture: &kmod.FixtureKernel{Root: f.Root, OwnRoot: f.Root, MountInfo: f.path("proc", "self", "mountinfo")}}
	f.mkdir("proc", "self")
	f.mkdir("sys", "module")
	f.mkdir("run", "nvidia")
	f.write("proc/modules", "")
	f.write("proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
	return f
}

// Host is the kmod.Host over the fixture, with the fake Kernel.
func (f *Fixture) Host() kmod.Host {
	return kmod.Host{Root: f.Root, OwnRoot: f.Root, DriverRoot: DriverRoot, MountInfo: "/proc/self/mountinfo",
		SysDir: f.path("sys"), Kernel: f.Kernel}
}

func (f *Fixture) path(p ...string) string { return filepath.Join(append([]string{f.Root}, p...)...) }

func (f *Fixture) mkdir(p ...string) {
	f.t.Helper()
	if err := os.MkdirAll(f.path(p...), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *Fixture) write(p, content string) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(f.path(p)), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(f.path(p), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// LoadModule loads name, using the modules in deps (each gets name as a holder and one more use).
func (f *Fixture) LoadModule(name string, deps ...string) {
	f.t.Helper()
	if err := f.Kernel.fixture.Load(name, deps...); err != nil {
		f.t.Fatal(err)
	}
}

// LoadDriver loads the modules a containerized driver loads: nvidia, nvidia_modeset, nvidia_uvm and
// nvidia_drm, with their real dependencies.
func (f *Fixture) LoadDriver() {
	f.LoadModule("nvidia")
	f.LoadModule("nvidia_modeset", "nvidia")
	f.LoadModule("nvidia_uvm", "nvidia")
	f.LoadModule("nvidia_drm", "nvidia_modeset")
}

// DriverVersion makes the loaded nvidia module say what it is, as the kernel does: its version in
// sys/module/nvidia/version and the NVRM banner in proc/driver/nvidia/version (open or proprietary flavour).
func (f *Fixture) DriverVersion(version string, open bool) {
	f.write("sys/module/nvidia/version", version+"\n")
	banner := "NVRM version: NVIDIA UNIX x86_64 Kernel Module  " + version + "  Release Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Sep 25 18:29:06 UTC 2025\n"
	if open {
		banner = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  " + version + "  Release Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Sep 25 18:29:06 UTC 2025\n"
	}
	f.write("proc/driver/nvidia/version", banner+"GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
}

// Use adds n users (open device files, kernel references) to a loaded module.
func (f *Fixture) Use(module string, n int) { f.addRefcnt(module, n) }

func (f *Fixture) addRefcnt(module string, n int) {
	f.t.Helper()
	p := filepath.Join("sys/module", module, "refcnt")
	b, err := os.ReadFile(f.path(p))
	if err != nil {
		f.t.Fatalf("module %s is not loaded in the fixture: %v", module, err)
	}
	c, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	f.write(p, strconv.Itoa(c+n)+"\n")
}

// OpenDevice makes host process pid (named comm) hold dev (e.g. /dev/nvidia0) open.
func (f *Fixture) OpenDevice(pid int, comm, dev string) {
	f.t.Helper()
	f.mkdir("proc", strconv.Itoa(pid), "fd")
	f.write(filepath.Join("proc", strconv.Itoa(pid), "comm"), comm+"\n")
	if err := os.Symlink("/dev/null", f.path("proc", strconv.Itoa(pid), "fd", "0")); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Symlink(dev, f.path("proc", strconv.Itoa(pid), "fd", "7")); err != nil {
		f.t.Fatal(err)
	}
}

// Cgroup writes host process pid's cgroup file (proc/<pid>/cgroup).
func (f *Fixture) Cgroup(pid int, content string) {
	f.write(filepath.Join("proc", strconv.Itoa(pid), "cgroup"), content)
}

// HostNvidiaSMI installs a working nvidia-smi on the host under dir (e.g. usr/bin): a host driver.
func (f *Fixture) HostNvidiaSMI(dir string) {
	f.executable(filepath.Join(dir, "nvidia-smi"), "#!/bin/sh\necho 'NVIDIA-SMI 550.54.15  Driver Version: 550.54.15'\n")
}

// LeftoverNvidiaSMI installs an nvidia-smi on the host under dir that fails as the real one does with no driver
// loaded: what an uninstalled host driver leaves behind.
func (f *Fixture) LeftoverNvidiaSMI(dir string) {
	f.executable(filepath.Join(dir, "nvidia-smi"),
		"#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
}

func (f *Fixture) executable(p, content string) {
	f.t.Helper()
	f.write(p, content)
	if err := os.Chmod(f.path(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

// DriverState records digest as the running containerized driver does.
func (f *Fixture) DriverState(digest string) { f.write("run/nvidia/nvidia-driver.state", digest+"\n") }

// PidFile writes the containerized driver's pid file.
func (f *Fixture) PidFile() { f.write("run/nvidia/nvidia-driver.pid", "4242\n") }

// PidFileExists reports whether the pid file is there.
func (f *Fixture) PidFileExists() bool {
	_, err := os.Stat(f.path("run", "nvidia", "nvidia-driver.pid"))
	return err == nil
}

// Mount adds a mount at mountPoint (a path in the manager's namespace) to the mount table.
func (f *Fixture) Mount(mountPoint string) {
	f.t.Helper()
	f.mkdir(mountPoint)
	b, _ := os.ReadFile(f.path("proc", "self", "mountinfo"))
	esc := strings.ReplaceAll(mountPoint, " ", `\040`)
	f.write("proc/self/mountinfo", string(b)+fmt.Sprintf("%d 22 0:99 / %s rw,relatime shared:9 - overlay overlay rw\n", 100+strings.Count(string(b), "\n"), esc))
}

// MountDriverRoot mounts a driver root the way the containerized driver does: the root and a few mounts below.
func (f *Fixture) MountDriverRoot() {
	f.Mount(DriverRoot)
	f.Mount(DriverRoot + "/proc")
	f.Mount(DriverRoot + "/dev")
	f.Mount(DriverRoot + "/dev/shm")
}

// Mounts returns the mount points in the mount table below the root mount.
func (f *Fixture) Mounts() []string {
	b, _ := os.ReadFile(f.path("proc", "self", "mountinfo"))
	var out []string
	for line := range strings.Lines(string(b)) {
		if fs := strings.Fields(line); len(fs) > 4 && fs[4] != "/" {
			out = append(out, strings.ReplaceAll(fs[4], `\040`, " "))
		}
	}
	return out
}

// LoadedModules returns the modules in proc/modules.
func (f *Fixture) LoadedModules() []string {
	b, _ := os.ReadFile(f.path("proc", "modules"))
	var out []string
	for line := range strings.Lines(string(b)) {
		if fs := strings.Fields(line); len(fs) > 0 {
			out = append(out, fs[0])
		}
	}
	return out
}

// Kernel is the fake kmod.Kernel: kmod.FixtureKernel over the fixture, recording every call.
type Kernel struct {
	f       *Fixture
	fixture *kmod.FixtureKernel
	mu      sync.Mutex
	// Calls are "delete_module NAME", "modprobe NAME", "umount PATH" (PATH as given, under the fixture root) and
	// "unbind ADDRESS".
	Calls []string
	// Fail, when set, is consulted before each call; a non-nil error fails it.
	Fail func(call string) error
}

// CallList returns a copy of Calls.
func (k *Kernel) CallList() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.Calls)
}

func (k *Kernel) record(call string) error {
	k.mu.Lock()
	k.Calls = append(k.Calls, call)
	fail := k.Fail
	k.mu.Unlock()
	if fail != nil {
		return fail(call)
	}
	return nil
}

// FailUnload makes the n-th delete_module call fail with EBUSY, as if a user had come between the check and the
// removal (kmod.FixtureKernel.FailUnload).
func (k *Kernel) FailUnload(n int) { k.fixture.FailUnload = n }

// FailLoad makes every LoadModule fail, as modprobe does without the module files.
func (k *Kernel) FailLoad() { k.fixture.FailLoad = true }

// LoadModule loads back a module as kmod.FixtureKernel does.
func (k *Kernel) LoadModule(root, name string) error {
	if err := k.record("modprobe " + name); err != nil {
		return err
	}
	return k.fixture.LoadModule(root, name)
}

// DeleteModule removes a module as kmod.FixtureKernel does.
func (k *Kernel) DeleteModule(name string) error {
	if err := k.record("delete_module " + name); err != nil {
		return err
	}
	return k.fixture.DeleteModule(name)
}

// Unmount removes the latest mount at target from the mount table (EINVAL when target is not a mount point).
func (k *Kernel) Unmount(target string) error {
	if err := k.record("umount " + target); err != nil {
		return err
	}
	return k.fixture.Unmount(target)
}

// UnbindDevice unbinds the PCI function at dev as kmod.FixtureKernel does.
func (k *Kernel) UnbindDevice(dev string) error {
	if err := k.record("unbind " + filepath.Base(dev)); err != nil {
		return err
	}
	return k.fixture.UnbindDevice(dev)
}

// AddPCIFunction adds a PCI function at address of vendor (e.g. kmod.VendorNVIDIA), bound to driver ("" for
// none), with driver_override set to override.
func (f *Fixture) AddPCIFunction(address, vendor, driver, override string) {
	f.t.Helper()
	dev := filepath.Join("sys/bus/pci/devices", address)
	f.write(filepath.Join(dev, "vendor"), vendor+"\n")
	f.write(filepath.Join(dev, "driver_override"), override+"\n")
	if driver != "" {
		f.mkdir("sys", "bus", "pci", "drivers", driver)
		if err := os.Symlink("../../drivers/"+driver, f.path(dev, "driver")); err != nil {
			f.t.Fatal(err)
		}
	}
}

// PCIDriver returns the driver a function is bound to ("" for none) and its driver_override.
func (f *Fixture) PCIDriver(address string) (driver, override string) {
	dev := f.path("sys/bus/pci/devices", address)
	if target, err := os.Readlink(filepath.Join(dev, "driver")); err == nil {
		driver = filepath.Base(target)
	}
	b, _ := os.ReadFile(filepath.Join(dev, "driver_override"))
	return driver, strings.TrimSpace(string(b))
}

// MOFEDContainerReady writes the MOFED driver container's ready file.
func (f *Fixture) MOFEDContainerReady() { f.write("run/mellanox/drivers/.driver-ready", "") }

// Reboot does to the fixture what a reboot does to a host: every module gone, /run emptied (a tmpfs) and the
// mount table back to the root mount. Files elsewhere on the host stay.
func (f *Fixture) Reboot() {
	f.t.Helper()
	for _, p := range []string{"run", filepath.Join("sys", "module")} {
		if err := os.RemoveAll(f.path(p)); err != nil {
			f.t.Fatal(err)
		}
	}
	f.mkdir("sys", "module")
	f.mkdir("run")
	f.write("proc/modules", "")
	f.write("proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
}
