// Package kmod is the driver manager's view of a node's NVIDIA kernel modules, the containerized driver's files
// and its root mount, and the PCI functions it releases from vfio-pci. Every path goes through a root (the host's
// filesystem as mounted in the pod, the pod's own filesystem, the host's sysfs), and what changes the kernel's
// state (delete_module, modprobe, umount2, a driver unbind) goes through Kernel, so the whole flow runs against a fixture
// tree with FixtureKernel: in unit tests (kmodtest) and in a real container on a test node.
package kmod

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostdriver"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// UnloadOrder lists the NVIDIA modules in the order they can be removed: each one only after every module
// that depends on it (nvidia_drm holds nvidia_modeset, which holds nvidia; the others hold nvidia).
var UnloadOrder = []string{
	"nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia_fs", "nvidia_vgpu_vfio", "gdrdrv", "nvidia",
}

// Kernel is the system calls that change the host; tests pass a fake.
type Kernel interface {
	// DeleteModule removes a loaded module without forcing it (delete_module(2)); a module in use fails with
	// EBUSY or EAGAIN.
	DeleteModule(name string) error
	// Unmount detaches the mount at target (umount2(2)).
	Unmount(target string) error
	// UnbindDevice detaches the PCI function whose sysfs directory is dev (<sys>/bus/pci/devices/<address>) from
	// its driver.
	UnbindDevice(dev string) error
	// LoadModule loads a module and the modules it needs, as modprobe does with root's modprobe, module tree and
	// configuration (the driver root a containerized driver installed its modules in, or the host's root): it
	// puts back what a failed unload had already removed.
	LoadModule(root, name string) error
}

// System is the real Kernel.
type System struct{}

// DeleteModule calls delete_module(2) with O_NONBLOCK, as rmmod does: a module in use fails at once instead of
// waiting for its users.
func (System) DeleteModule(name string) error { return unix.DeleteModule(name, unix.O_NONBLOCK) }

// Unmount calls umount2(2) with MNT_DETACH: a stale driver root whose container is gone may still be some
// process's working directory, and a lazy unmount still frees the path for the new driver.
func (System) Unmount(target string) error { return unix.Unmount(target, unix.MNT_DETACH) }

// LoadModule runs root's modprobe chrooted in root (the manager runs privileged, as root), bounded to a minute.
func (System) LoadModule(root, name string) error {
	dir, _, err := hostfs.Root(root).FindExecutable("modprobe", modprobeDirs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/"+dir+"/modprobe", name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("modprobe %s (in %s): %w: %s", name, root, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// modprobeDirs are where a root keeps modprobe.
var modprobeDirs = []string{"usr/sbin", "sbin", "usr/bin", "bin"}

// UnbindDevice writes the function's address to its driver's unbind file.
func (s System) UnbindDevice(dev string) error { return s.writeUnbind(dev, false) }

// writeUnbind writes dev's address to dev/driver/unbind; create is for a fixture tree, where the file is not
// there until written.
func (System) writeUnbind(dev string, create bool) error {
	flags := os.O_WRONLY
	if create {
		flags |= os.O_CREATE | os.O_TRUNC
	}
	p := filepath.Join(dev, "driver", "unbind")
	f, err := os.OpenFile(p, flags, 0o200)
	if err != nil {
		return err
	}
	_, err = f.WriteString(filepath.Base(dev))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// Defaults for Host's paths.
const (
	DefaultRoot       = "/host"
	DefaultOwnRoot    = "/"
	DefaultDriverRoot = "/run/nvidia/driver"
	DefaultMountInfo  = "/proc/self/mountinfo"
	DefaultSysDir     = "/sys"
)

// Host is the node as the driver manager sees it.
type Host struct {
	// Root is the host's root filesystem, read only: proc, sys, the host's binaries, and the state file the
	// containerized driver writes under run/nvidia.
	Root string
	// OwnRoot is the root of the manager's own mount namespace ("/" in the pod): the driver root mount, the pid
	// file and MountInfo live there. Tests point both roots at one fixture tree.
	OwnRoot string
	// DriverRoot is where the containerized driver mounts its root, under OwnRoot (/run/nvidia/driver); its
	// parent holds the driver's pid file.
	DriverRoot string
	// MountInfo is the manager's mount table, under OwnRoot (/proc/self/mountinfo).
	MountInfo string
	// SysDir is the host's sysfs, writable (/sys, the pod's own mount of it: the host root is mounted read-only):
	// the PCI functions are read and unbound there.
	SysDir string
	// Kernel removes modules and unmounts.
	Kernel Kernel
	// RunHost runs the host's nvidia-smi to tell a host driver from a leftover (nil: hostdriver.Interpreted).
	RunHost hostdriver.RunFunc
}

// Complete fills the defaults of empty fields.
func (h *Host) Complete() {
	if h.Root == "" {
		h.Root = DefaultRoot
	}
	if h.OwnRoot == "" {
		h.OwnRoot = DefaultOwnRoot
	}
	if h.DriverRoot == "" {
		h.DriverRoot = DefaultDriverRoot
	}
	if h.MountInfo == "" {
		h.MountInfo = DefaultMountInfo
	}
	if h.SysDir == "" {
		h.SysDir = DefaultSysDir
	}
	if h.Kernel == nil {
		h.Kernel = System{}
	}
}

// Validate rejects paths the manager cannot work with.
func (h *Host) Validate() error {
	if !filepath.IsAbs(h.DriverRoot) || filepath.Clean(h.DriverRoot) == "/" {
		return fmt.Errorf("driver root %q: want an absolute path below / (e.g. %s)", h.DriverRoot, DefaultDriverRoot)
	}
	return nil
}

func (h Host) host(p ...string) string { return filepath.Join(append([]string{h.Root}, p...)...) }
func (h Host) own(p string) string     { return filepath.Join(h.OwnRoot, p) }

// StateFile is the file the containerized driver writes its DRIVER_CONFIG_DIGEST to, under Root.
func (h Host) StateFile() string { return h.host("run", "nvidia", "nvidia-driver.state") }

// PidFile is the containerized driver's pid file, next to the driver root, under OwnRoot.
func (h Host) PidFile() string {
	return filepath.Join(filepath.Dir(h.own(h.DriverRoot)), "nvidia-driver.pid")
}

// Module is a loaded NVIDIA kernel module.
type Module struct {
	Name string
	// Refcnt is the module's use count (-1 when unknown).
	Refcnt int
	// Holders are the loaded modules that depend on it.
	Holders []string
}

// Loaded returns the NVIDIA modules of UnloadOrder that are loaded, in that order: listed in proc/modules or
// with a sys/module/<m>/refcnt (only loadable modules have one).
func (h Host) Loaded() ([]Module, error) {
	listed := map[string]bool{}
	b, err := os.ReadFile(h.host("proc", "modules"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read loaded modules: %w", err)
	}
	for _, name := range ModuleNames(b) {
		listed[name] = true
	}
	var mods []Module
	for _, name := range UnloadOrder {
		_, statErr := os.Stat(h.host("sys", "module", name, "refcnt"))
		if !listed[name] && statErr != nil {
			continue
		}
		mods = append(mods, Module{Name: name, Refcnt: h.refcnt(name), Holders: h.holders(name)})
	}
	return mods, nil
}

// ModuleNames returns the names /proc/modules lists: the first field of each line, in order.
func ModuleNames(procModules []byte) []string {
	var out []string
	for line := range strings.Lines(string(procModules)) {
		if f := strings.Fields(line); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

func (h Host) refcnt(name string) int {
	b, err := os.ReadFile(h.host("sys", "module", name, "refcnt"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func (h Host) holders(name string) []string {
	entries, _ := os.ReadDir(h.host("sys", "module", name, "holders"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// HostDriver looks for a driver installed on the host (not by a driver pod): an nvidia-smi in hostdriver.Dirs
// under Root that runs (through RunHost). A leftover nvidia-smi that fails is not one: Result.Present says.
func (h Host) HostDriver(ctx context.Context) (hostdriver.Result, error) {
	run := h.RunHost
	if run == nil {
		run = hostdriver.Interpreted
	}
	return hostdriver.Lookup(ctx, hostfs.Root(h.Root), run)
}

// RecordedDigest returns the DRIVER_CONFIG_DIGEST the running containerized driver recorded, and whether it
// recorded one.
func (h Host) RecordedDigest() (string, bool, error) {
	b, err := os.ReadFile(h.StateFile())
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read driver state: %w", err)
	}
	return strings.TrimSpace(string(b)), true, nil
}

// OwnStateFile is StateFile as the manager writes it: next to the driver root, under OwnRoot (the host root is
// mounted read-only; /run/nvidia is the pod's own, shared, mount of the host's).
func (h Host) OwnStateFile() string {
	return filepath.Join(filepath.Dir(h.own(h.DriverRoot)), "nvidia-driver.state")
}

// RecordDigest writes digest to the driver's state file, as the driver container does once its driver is loaded:
// a driver container started with that DRIVER_CONFIG_DIGEST then keeps the loaded modules and installs only the
// userspace. Written whole (a temporary file renamed), so a kill leaves the old record or the new one.
func (h Host) RecordDigest(digest string) error {
	p := h.OwnStateFile()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(digest+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the driver config digest: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("record the driver config digest: %w", err)
	}
	return nil
}

// Module flavours of the nvidia module (the driver container's KERNEL_MODULE_TYPE once resolved).
const (
	FlavourOpen        = "open"
	FlavourProprietary = "proprietary"
)

// LoadedDriver is what the host says of the loaded nvidia module, whoever loaded it.
type LoadedDriver struct {
	// Version is the module's version (sys/module/nvidia/version, e.g. 580.95.05).
	Version string
	// Flavour is FlavourOpen or FlavourProprietary (proc/driver/nvidia/version).
	Flavour string
}

// LoadedDriver reads the loaded nvidia module's version and flavour. Both files are the kernel's own: the module's
// MODULE_VERSION in sysfs (NVIDIA's recommended source of the version), and the NVRM banner in procfs, which names
// the open flavour "NVIDIA UNIX Open Kernel Module for <arch>" and the proprietary one "NVIDIA UNIX <arch> Kernel
// Module" (NVIDIA's README, "Open Linux Kernel Modules"; some open builds print "NVIDIA UNIX Open Kernel <arch>
// Kernel Module"). Anything unreadable or unrecognised is an error: the caller must not act on a guess.
func (h Host) LoadedDriver() (LoadedDriver, error) {
	var d LoadedDriver
	b, err := os.ReadFile(h.host("sys", "module", "nvidia", "version"))
	if err != nil {
		return d, fmt.Errorf("read the loaded driver's version: %w", err)
	}
	d.Version = strings.TrimSpace(string(b))
	if !driverVersion.MatchString(d.Version) {
		return d, fmt.Errorf("loaded driver's version %q (sys/module/nvidia/version) is not a driver version", d.Version)
	}
	b, err = os.ReadFile(h.host("proc", "driver", "nvidia", "version"))
	if err != nil {
		return d, fmt.Errorf("read the loaded driver's flavour: %w", err)
	}
	banner, _, _ := strings.Cut(string(b), "\n")
	switch {
	case !strings.HasPrefix(banner, "NVRM version:") || !strings.Contains(banner, d.Version):
		return d, fmt.Errorf("loaded driver's banner %q (proc/driver/nvidia/version) does not name version %s", strings.TrimSpace(banner), d.Version)
	case strings.Contains(banner, " Open Kernel "):
		d.Flavour = FlavourOpen
	case strings.Contains(banner, "Kernel Module"):
		d.Flavour = FlavourProprietary
	default:
		return d, fmt.Errorf("loaded driver's banner %q (proc/driver/nvidia/version) names no kernel module flavour", strings.TrimSpace(banner))
	}
	return d, nil
}

// driverVersion is a driver release: 580.95.05, 550.54 (a branch alone, 580, is not one).
var driverVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// DriverPodFiles reports what a containerized driver left on the node: its state file, its pid file or a mount
// on the driver root. A node with any of them is not a host-driver node.
func (h Host) DriverPodFiles() ([]string, error) {
	var found []string
	for _, p := range []string{h.StateFile(), h.PidFile()} {
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		}
	}
	mounts, err := h.DriverRootMounts()
	if err != nil {
		return nil, err
	}
	return append(found, mounts...), nil
}

// DriverRootMounts returns the mount points at or below DriverRoot in MountInfo, as paths in the manager's
// namespace, in unmount order: deepest first, and of mounts stacked on one path the latest first.
func (h Host) DriverRootMounts() ([]string, error) {
	b, err := os.ReadFile(h.own(h.MountInfo))
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	root := filepath.Clean(h.DriverRoot)
	var mps []string
	for _, mp := range MountPoints(b) {
		if mp == root || strings.HasPrefix(mp, root+"/") {
			mps = append(mps, mp)
		}
	}
	slices.Reverse(mps) // later mounts sit on top of earlier ones
	slices.SortStableFunc(mps, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return mps, nil
}

// MountPoints returns the mount points of a mountinfo table (proc(5): the fifth field), unescaped, in table order;
// lines too short to have one are skipped.
func MountPoints(mountinfo []byte) []string {
	var out []string
	for line := range strings.Lines(string(mountinfo)) {
		if f := strings.Fields(line); len(f) >= 5 {
			out = append(out, unescapeMountPath(f[4]))
		}
	}
	return out
}

// unescapeMountPath undoes the kernel's octal escapes in mountinfo (\040 for a space, \011, \012, \134).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// UnmountDriverRoot unmounts everything at or below DriverRoot, deepest first, and returns what it unmounted. A
// path that is no longer a mount point (a parent's unmount took it along) is not an error.
func (h Host) UnmountDriverRoot() ([]string, error) {
	mps, err := h.DriverRootMounts()
	if err != nil {
		return nil, err
	}
	var done []string
	for _, mp := range mps {
		err := h.Kernel.Unmount(h.own(mp))
		switch {
		case err == nil:
			done = append(done, mp)
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		default:
			return done, fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return done, nil
}

// RemovePidFile removes the driver's stale pid file and reports whether there was one.
func (h Host) RemovePidFile() (bool, error) {
	err := os.Remove(h.PidFile())
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("remove stale pid file: %w", err)
	}
	return true, nil
}

// BusyError is a module that cannot be removed because something uses it.
type BusyError struct {
	Module string
	// Refcnt is its use count (-1 when unknown).
	Refcnt int
	// Holders are the loaded modules that depend on it.
	Holders []string
	// Processes have a /dev/nvidia* device open.
	Processes []Process
	// Err is the system call's error.
	Err error
}

// Error names the module and what holds it, so the message says what to stop.
func (e *BusyError) Error() string {
	var why []string
	if e.Refcnt >= 0 {
		why = append(why, fmt.Sprintf("use count %d", e.Refcnt))
	}
	if len(e.Holders) > 0 {
		why = append(why, "held by modules "+strings.Join(e.Holders, ", "))
	}
	if len(e.Processes) > 0 {
		ps := make([]string, 0, len(e.Processes))
		for _, p := range e.Processes {
			ps = append(ps, p.String())
		}
		why = append(why, "/dev/nvidia* open in "+strings.Join(ps, ", "))
	} else {
		why = append(why, "no process on the node has /dev/nvidia* open")
	}
	return fmt.Sprintf("kernel module %s is in use (%s): %v", e.Module, strings.Join(why, "; "), e.Err)
}

// Unwrap returns the system call's error.
func (e *BusyError) Unwrap() error { return e.Err }

// CheckUnload says, before anything is removed, whether every loaded NVIDIA module can go: a module held by a
// module that is not removed with it, a use count above what the removed modules account for, or a process with a
// /dev/nvidia* device open makes it a *BusyError naming the module and what is in the way; nil when all can go.
// Removing them one by one and finding the last one busy would leave the node with half a driver.
func (h Host) CheckUnload() error {
	mods, err := h.Loaded()
	if err != nil {
		return err
	}
	removed := map[string]bool{}
	for _, m := range mods {
		removed[m.Name] = h.removable(m.Name)
	}
	procs, err := h.DeviceUsers()
	if err != nil {
		return err
	}
	for _, m := range mods {
		if !removed[m.Name] {
			continue
		}
		inside, outside := 0, false
		for _, holder := range m.Holders {
			if removed[holder] {
				inside++
			} else {
				outside = true
			}
		}
		switch {
		case outside:
			return &BusyError{Module: m.Name, Refcnt: m.Refcnt, Holders: m.Holders, Processes: procs, Err: unix.EAGAIN}
		case m.Refcnt > inside:
			return &BusyError{Module: m.Name, Refcnt: m.Refcnt, Holders: m.Holders, Processes: procs, Err: unix.EBUSY}
		}
	}
	if len(procs) > 0 {
		// open device files hold their module; a use count that does not show it is not to be trusted
		name := deviceModule(procs[0].Device)
		return &BusyError{Module: name, Refcnt: h.refcnt(name), Holders: h.holders(name), Processes: procs, Err: unix.EBUSY}
	}
	return nil
}

// deviceModule is the module a /dev/nvidia* device file belongs to.
func deviceModule(dev string) string {
	switch {
	case strings.HasPrefix(dev, "/dev/nvidia-uvm"):
		return "nvidia_uvm"
	case strings.HasPrefix(dev, "/dev/nvidia-modeset"):
		return "nvidia_modeset"
	}
	return "nvidia"
}

// removable: only a loadable module (one with a sys/module/<m>/refcnt) is removed.
func (h Host) removable(name string) bool {
	_, err := os.Stat(h.host("sys", "module", name, "refcnt"))
	return err == nil
}

// Unload removes the loaded NVIDIA modules in UnloadOrder and returns the ones it removed. It removes nothing
// when CheckUnload finds one in use (a *BusyError). Should a removal still fail midway (a user arrived meanwhile,
// the kernel refused), it loads back what it had removed, through Kernel.LoadModule, and returns the failure with
// no module removed; when that reload fails too, a *PartialUnloadError lists the modules the node is left without,
// and those are what Unload returns.
func (h Host) Unload() ([]string, error) {
	if err := h.CheckUnload(); err != nil {
		return nil, err
	}
	var done []string
	for _, name := range UnloadOrder {
		if !h.removable(name) {
			continue
		}
		err := h.Kernel.DeleteModule(name)
		switch {
		case err == nil:
			done = append(done, name)
		case errors.Is(err, unix.ENOENT):
			// gone meanwhile
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EAGAIN):
			procs, _ := h.DeviceUsers()
			return h.reload(done, &BusyError{Module: name, Refcnt: h.refcnt(name), Holders: h.holders(name), Processes: procs, Err: err})
		default:
			return h.reload(done, fmt.Errorf("unload kernel module %s: %w", name, err))
		}
	}
	return done, nil
}

// reload loads back, in reverse, the modules a failed Unload removed before it failed with cause.
func (h Host) reload(removed []string, cause error) ([]string, error) {
	if len(removed) == 0 {
		return nil, cause
	}
	root := h.moduleRoot()
	for i := len(removed) - 1; i >= 0; i-- {
		if err := h.Kernel.LoadModule(root, removed[i]); err != nil {
			missing := slices.Clone(removed[:i+1])
			slices.Reverse(missing)
			return missing, &PartialUnloadError{Err: cause, Missing: missing, ReloadErr: err}
		}
	}
	return nil, fmt.Errorf("%w (the modules removed before it, %s, were loaded back)", cause, strings.Join(removed, ", "))
}

// moduleRoot is where the loaded driver's modules and modprobe are: the containerized driver's root while it is
// still mounted, else the host's root.
func (h Host) moduleRoot() string {
	if _, _, err := hostfs.Root(h.own(h.DriverRoot)).FindExecutable("modprobe", modprobeDirs); err == nil {
		return h.own(h.DriverRoot)
	}
	return h.Root
}

// PartialUnloadError is an unload that failed midway and could not load back what it had removed: the node is
// left with part of a driver.
type PartialUnloadError struct {
	// Err is why the unload failed (a *BusyError when a module turned out to be in use).
	Err error
	// Missing are the modules removed and not loaded back.
	Missing []string
	// ReloadErr is why loading them back failed.
	ReloadErr error
}

// Error names the modules the node lacks.
func (e *PartialUnloadError) Error() string {
	return fmt.Sprintf("%v; kernel modules %s were already removed and loading them back failed (%v): the node is left without a working NVIDIA driver",
		e.Err, strings.Join(e.Missing, ", "), e.ReloadErr)
}

// Unwrap returns the unload's and the reload's errors.
func (e *PartialUnloadError) Unwrap() []error { return []error{e.Err, e.ReloadErr} }

// Process is a host process.
type Process struct {
	PID  int
	Comm string
	// Device is the first /dev/nvidia* device it has open.
	Device string
	// PodUID is the UID of the pod it runs in, read from its cgroup ("" for none); Pod, when the caller found
	// that pod, is its namespace/name.
	PodUID, Pod string
}

// String is "pid 1234 (nv-hostengine)", followed by its pod when it runs in one.
func (p Process) String() string {
	s := fmt.Sprintf("pid %d (%s)", p.PID, p.Comm)
	switch {
	case p.Pod != "":
		s += " of pod " + p.Pod
	case p.PodUID != "":
		s += " of pod UID " + p.PodUID
	}
	return s
}

// DeviceUsers returns the host processes that have a /dev/nvidia* device open, by their proc/<pid>/fd links.
// Processes that exit or cannot be read meanwhile are skipped.
func (h Host) DeviceUsers() ([]Process, error) {
	entries, err := os.ReadDir(h.host("proc"))
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(h.host("proc", e.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(h.host("proc", e.Name(), "fd", fd.Name()))
			if err == nil && strings.HasPrefix(target, "/dev/nvidia") {
				out = append(out, Process{PID: pid, Comm: h.comm(e.Name()), Device: target, PodUID: h.podUID(e.Name())})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, nil
}

func (h Host) comm(pid string) string {
	f, err := os.Open(h.host("proc", pid, "comm"))
	if err != nil {
		return "?"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	if s.Scan() {
		return s.Text()
	}
	return "?"
}

// podUID reads the pod UID from a process's cgroup path, as the kubelet names the pod's cgroup: ".../kubepods/
// burstable/pod<uid>/<container>" (cgroupfs) or ".../kubepods-burstable-pod<uid_with_underscores>.slice/..." (systemd).
func (h Host) podUID(pid string) string {
	b, err := os.ReadFile(h.host("proc", pid, "cgroup"))
	if err != nil {
		return ""
	}
	return PodUIDFromCgroup(string(b))
}

// PodUIDFromCgroup returns the pod UID in a /proc/<pid>/cgroup file's paths, "" when there is none.
func PodUIDFromCgroup(cgroup string) string {
	for line := range strings.Lines(cgroup) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3) // hierarchy-ID:controllers:path
		if len(f) < 3 {
			continue
		}
		for el := range strings.SplitSeq(f[2], "/") {
			el = strings.TrimSuffix(el, ".slice")
			i := strings.LastIndex(el, "pod")
			if i < 0 || !strings.Contains(el, "kubepods") && i != 0 {
				continue
			}
			uid := strings.ReplaceAll(el[i+len("pod"):], "_", "-")
			if len(uid) == 36 && strings.Count(uid, "-") == 4 {
				return uid
			}
		}
	}
	return ""
}
