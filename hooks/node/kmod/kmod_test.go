package kmod_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
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
	// nothing is removed: removing the modules above nvidia first would leave the node with half a driver
	if len(done) != 0 || len(f.Kernel.CallList()) != 0 || len(f.LoadedModules()) != 5 {
		t.Fatalf("unloaded %v (kernel calls %v, left %v); want nothing touched", done, f.Kernel.CallList(), f.LoadedModules())
	}
	msg := err.Error()
	for _, want := range []string{"nvidia is in use", "use count 4", "held by modules nv_custom", "pid 99 (nv-hostengine)", "pid 4711 (python3)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "bash") {
		t.Errorf("message %q names a process without a GPU device open", msg)
	}
}

func TestUnloadChecksEveryModuleBeforeRemovingAny(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(f *kmodtest.Fixture)
		module string
		errno  error
		says   string
	}{
		{"a use of the last module", func(f *kmodtest.Fixture) { f.Use("nvidia", 1) }, "nvidia", unix.EBUSY, "use count 3"},
		{"a use of a middle module", func(f *kmodtest.Fixture) { f.Use("nvidia_modeset", 1) }, "nvidia_modeset", unix.EBUSY, "use count 2"},
		{"a module outside ours holding one", func(f *kmodtest.Fixture) { f.LoadModule("nv_peer_custom", "nvidia_uvm") }, "nvidia_uvm", unix.EAGAIN, "held by modules nv_peer_custom"},
		{"a process with nvidia-uvm open, in a pod", func(f *kmodtest.Fixture) {
			f.OpenDevice(4711, "python3", "/dev/nvidia-uvm")
			f.Cgroup(4711, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/cri-containerd-abc.scope\n")
		}, "nvidia_uvm", unix.EBUSY, "pid 4711 (python3) of pod UID 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := kmodtest.New(t)
			f.LoadDriver()
			tc.setup(f)
			before := f.LoadedModules()
			done, err := f.Host().Unload()
			var busy *kmod.BusyError
			if !errors.As(err, &busy) || busy.Module != tc.module || !errors.Is(err, tc.errno) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("err = %v, want %s busy (%v) saying %q", err, tc.module, tc.errno, tc.says)
			}
			if len(done) != 0 || len(f.Kernel.CallList()) != 0 || !slices.Equal(f.LoadedModules(), before) {
				t.Fatalf("unloaded %v, kernel calls %v, left %v: want nothing removed", done, f.Kernel.CallList(), f.LoadedModules())
			}
		})
	}
}

func TestUnloadFailingMidwayLoadsBackWhatItRemoved(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.Kernel.FailUnload(3) // nvidia_uvm: a user arrived after the check
	done, err := f.Host().Unload()
	var busy *kmod.BusyError
	if !errors.As(err, &busy) || busy.Module != "nvidia_uvm" || !strings.Contains(err.Error(), "nvidia_drm, nvidia_modeset, were loaded back") {
		t.Fatalf("err = %v, want nvidia_uvm busy with the removed modules loaded back", err)
	}
	if len(done) != 0 {
		t.Fatalf("Unload says %v stay removed", done)
	}
	want := []string{"delete_module nvidia_drm", "delete_module nvidia_modeset", "delete_module nvidia_uvm", "modprobe nvidia_modeset", "modprobe nvidia_drm"}
	if got := f.Kernel.CallList(); !slices.Equal(got, want) {
		t.Fatalf("kernel calls %v, want %v", got, want)
	}
	mods, err := f.Host().Loaded()
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 4 || mods[0].Name != "nvidia_drm" || mods[1].Name != "nvidia_modeset" || mods[1].Refcnt != 1 || mods[3].Refcnt != 2 {
		t.Fatalf("after the reload: %+v; want the driver as it was (nvidia_modeset held by nvidia_drm, nvidia used twice)", mods)
	}
	// and the driver unloads cleanly afterwards
	if done, err := f.Host().Unload(); err != nil || len(done) != 4 {
		t.Fatalf("unload after the reload: %v, %v", done, err)
	}
}

func TestUnloadFailingMidwayWithoutReloadSaysWhatIsMissing(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.Kernel.FailUnload(4) // nvidia, the last one
	f.Kernel.FailLoad()
	missing, err := f.Host().Unload()
	var partial *kmod.PartialUnloadError
	if !errors.As(err, &partial) || !errors.Is(err, unix.EBUSY) || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("err = %v, want a PartialUnloadError of the busy nvidia and the failed modprobe", err)
	}
	want := []string{"nvidia_uvm", "nvidia_modeset", "nvidia_drm"}
	if !slices.Equal(missing, want) || !slices.Equal(partial.Missing, want) {
		t.Fatalf("missing %v / %v, want %v", missing, partial.Missing, want)
	}
	if !strings.Contains(err.Error(), "kernel modules nvidia_uvm, nvidia_modeset, nvidia_drm were already removed") {
		t.Fatalf("message %q does not name the missing modules", err)
	}
}

func TestPodUIDFromCgroup(t *testing.T) {
	for cg, want := range map[string]string{
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6b8e2c4a_1d2f_4e5b_9c8d_7a6b5c4d3e2f.slice/cri-containerd-1.scope\n": "6b8e2c4a-1d2f-4e5b-9c8d-7a6b5c4d3e2f",
		"12:memory:/kubepods/burstable/pod6b8e2c4a-1d2f-4e5b-9c8d-7a6b5c4d3e2f/0123abcd\n1:name=systemd:/init.scope\n":                            "6b8e2c4a-1d2f-4e5b-9c8d-7a6b5c4d3e2f",
		"0::/kubepods.slice/kubepods-pod6b8e2c4a_1d2f_4e5b_9c8d_7a6b5c4d3e2f.slice/x.scope":                                                       "6b8e2c4a-1d2f-4e5b-9c8d-7a6b5c4d3e2f",
		"0::/system.slice/nvidia-persistenced.service\n":                                                                                          "",
		"0::/user.slice/podman-pod1234.scope\n":                                                                                                   "",
		"":                                                                                                                                        "",
	} {
		if got := kmod.PodUIDFromCgroup(cg); got != want {
			t.Errorf("PodUIDFromCgroup(%q) = %q, want %q", cg, got, want)
		}
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
	if r, err := h.HostDriver(t.Context()); err != nil || r.Present() || r.Path != "" {
		t.Fatalf("HostDriver = %+v, %v on an empty node", r, err)
	}
	f.HostNvidiaSMI("usr/sbin")
	if r, err := h.HostDriver(t.Context()); err != nil || !r.Present() || !strings.HasSuffix(r.Path, "/usr/sbin/nvidia-smi") {
		t.Fatalf("HostDriver = %+v, %v", r, err)
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

// Flatcar keeps a host driver's nvidia-smi in /opt/bin; an nvidia-smi that fails (no modules loaded) is a leftover,
// not a host driver.
func TestHostDriverIsAnNvidiaSMIThatRuns(t *testing.T) {
	f := kmodtest.New(t)
	f.HostNvidiaSMI("opt/bin")
	r, err := f.Host().HostDriver(t.Context())
	if err != nil || !r.Present() || r.Dir != "opt/bin" {
		t.Fatalf("Flatcar host driver: %+v, %v; want found in opt/bin", r, err)
	}
	f = kmodtest.New(t)
	f.LeftoverNvidiaSMI("usr/bin")
	r, err = f.Host().HostDriver(t.Context())
	if err != nil || r.Present() || r.Path == "" || !strings.Contains(r.String(), "exit 9: NVIDIA-SMI has failed") {
		t.Fatalf("leftover nvidia-smi: %+v (%s), %v; want found, failing, not a host driver", r, r, err)
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
