package kmod_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kmod/kmodtest"
)

func TestLoadedListsNVIDIAModulesInUnloadOrder(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadModule("i915") // not ours
	f.LoadDriver()
	f.LoadModule("nvidia_peermem", "nvidia")
	mods, err := f.Host().Loaded()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	want := []string{"nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia"}
	if !slices.Equal(names, want) {
		t.Fatalf("loaded = %v, want %v", names, want)
	}
	nvidia := mods[len(mods)-1]
	if nvidia.Refcnt != 3 || !slices.Equal(nvidia.Holders, []string{"nvidia_modeset", "nvidia_peermem", "nvidia_uvm"}) {
		t.Fatalf("nvidia = %+v, want refcnt 3 held by nvidia_modeset, nvidia_peermem, nvidia_uvm", nvidia)
	}
}

func TestUnloadRemovesModulesInDependencyOrder(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.LoadModule("nvidia_peermem", "nvidia")
	f.LoadModule("gdrdrv", "nvidia")
	done, err := f.Host().Unload()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "gdrdrv", "nvidia"}
	if !slices.Equal(done, want) {
		t.Fatalf("unloaded %v, want %v", done, want)
	}
	var calls []string
	for _, m := range want {
		calls = append(calls, "delete_module "+m)
	}
	if got := f.Kernel.CallList(); !slices.Equal(got, calls) {
		t.Fatalf("kernel calls %v, want %v (only loaded modules, in order)", got, calls)
	}
	if left := f.LoadedModules(); len(left) != 0 {
		t.Fatalf("modules left loaded: %v", left)
	}
	// Again: nothing loaded, nothing to do.
	if done, err := f.Host().Unload(); err != nil || len(done) != 0 {
		t.Fatalf("second unload: %v, %v; want nothing done", done, err)
	}
}

func TestBusyModuleNamesItsHoldersAndTheProcesses(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.LoadModule("nv_custom", "nvidia") // a module outside our list still holds nvidia
	f.Use("nvidia", 1)
	f.OpenDevice(4711, "python3", "/dev/nvidia0")
	f.OpenDevice(99, "nv-hostengine", "/dev/nvidiactl")
	f.OpenDevice(12, "bash", "/dev/pts/0")
	done, err := f.Host().Unload()
	var busy *kmod.BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("err = %v, want a BusyError", err)
	}
	if busy.Module != "nvidia" || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("busy = %+v, want nvidia failing with EAGAIN", busy)
	}
	if !slices.Equal(done, []string{"nvidia_drm", "nvidia_modeset", "nvidia_uvm"}) {
		t.Fatalf("unloaded before the busy one: %v", done)
	}
	msg := err.Error()
	for _, want := range []string{"nvidia is in use", "use count 2", "held by modules nv_custom", "pid 99 (nv-hostengine)", "pid 4711 (python3)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "bash") {
		t.Errorf("message %q names a process without a GPU device open", msg)
	}
}

func TestBusyWithoutHoldersSaysNoProcessHasTheDevicesOpen(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadModule("nvidia")
	f.Use("nvidia", 1)
	_, err := f.Host().Unload()
	if !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), "no process on the node has /dev/nvidia* open") {
		t.Fatalf("err = %v", err)
	}
}

func TestUnmountDriverRootDeepestFirstAndOnlyBelowIt(t *testing.T) {
	f := kmodtest.New(t)
	f.Mount("/run/nvidia/driver")
	f.Mount("/run/nvidia/driver/dev")
	f.Mount("/run/nvidia/driver") // stacked
	f.Mount("/run/nvidia/driver/dev/shm")
	f.Mount("/run/nvidia/driver-other") // a sibling, not below the root
	f.Mount("/run/nvidia/driver/with space")
	h := f.Host()
	done, err := h.UnmountDriverRoot()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/run/nvidia/driver/dev/shm", "/run/nvidia/driver/with space", "/run/nvidia/driver/dev", "/run/nvidia/driver", "/run/nvidia/driver"}
	if !slices.Equal(done, want) {
		t.Fatalf("unmounted %v, want %v", done, want)
	}
	if got := f.Mounts(); !slices.Equal(got, []string{"/run/nvidia/driver-other"}) {
		t.Fatalf("mounts left %v", got)
	}
	for _, c := range f.Kernel.CallList() {
		if !strings.HasPrefix(c, "umount "+f.Root+"/run/nvidia/driver") {
			t.Fatalf("call %q is not under the fixture's driver root", c)
		}
	}
}

func TestHostDriverAndDriverPodFiles(t *testing.T) {
	f := kmodtest.New(t)
	h := f.Host()
	if p := h.HostDriver(); p != "" {
		t.Fatalf("HostDriver = %q on an empty node", p)
	}
	f.HostNvidiaSMI("usr/sbin")
	if p := h.HostDriver(); !strings.HasSuffix(p, "/usr/sbin/nvidia-smi") {
		t.Fatalf("HostDriver = %q", p)
	}
	if files, err := h.DriverPodFiles(); err != nil || len(files) != 0 {
		t.Fatalf("DriverPodFiles = %v, %v on a node without a driver pod", files, err)
	}
	f.DriverState("abc")
	f.PidFile()
	f.Mount("/run/nvidia/driver")
	files, err := h.DriverPodFiles()
	if err != nil || len(files) != 3 {
		t.Fatalf("DriverPodFiles = %v, %v; want state file, pid file and the mount", files, err)
	}
	if d, ok, err := h.RecordedDigest(); d != "abc" || !ok || err != nil {
		t.Fatalf("RecordedDigest = %q %v %v", d, ok, err)
	}
	if removed, err := h.RemovePidFile(); !removed || err != nil || f.PidFileExists() {
		t.Fatalf("RemovePidFile = %v %v", removed, err)
	}
	if removed, err := h.RemovePidFile(); removed || err != nil {
		t.Fatalf("second RemovePidFile = %v %v; want nothing to remove", removed, err)
	}
}

func TestValidateRejectsARelativeOrRootDriverRoot(t *testing.T) {
	for _, dr := range []string{"run/nvidia/driver", "/"} {
		h := kmod.Host{DriverRoot: dr}
		h.Complete()
		if h.Validate() == nil {
			t.Errorf("driver root %q accepted", dr)
		}
	}
	h := kmod.Host{}
	h.Complete()
	if err := h.Validate(); err != nil || h.Root != "/host" || h.DriverRoot != "/run/nvidia/driver" {
		t.Fatalf("defaults: %+v %v", h, err)
	}
}
