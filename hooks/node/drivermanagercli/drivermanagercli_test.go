package drivermanagercli

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpudrain"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
)

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// The environment the chart renders (operands/driver: driver.managerEnv, gpu-stack-lib.driverManagerContainer).
func TestOptionsFromTheChartsEnvironment(t *testing.T) {
	o, err := OptionsFromEnv(getenv(map[string]string{
		"NODE_NAME": "gpu-1", "OPERATOR_NAMESPACE": "gpu-system", "POD_NAME": "nvidia-driver-daemonset-x7k2p", "HOST_ROOT": "/host", "DRIVER_ROOT": "/run/nvidia/driver",
		"DRIVER_CONFIG_DIGEST":    " abc \n",
		"ENABLE_GPU_POD_EVICTION": "true", "EVICTION_USE_FORCE": "false", "EVICTION_TIMEOUT_SECONDS": "300s",
		"EVICTION_DELETE_EMPTYDIR_DATA": "false", "ENABLE_AUTO_DRAIN": "true", "DRAIN_USE_FORCE": "true",
		"DRAIN_POD_SELECTOR_LABEL": "app!=critical", "DRAIN_TIMEOUT_SECONDS": "0s", "DRAIN_DELETE_EMPTYDIR_DATA": "true",
		"DRA_PLUGIN_OPERAND": "dra-driver", "GPU_ALLOCATION": "dra",
		"DRIVER_VERSION": " 580.95.05\n", "KERNEL_MODULE_TYPE": "open",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "gpu-1" || o.Namespace != "gpu-system" || o.Digest != "abc" || o.Host.Root != "/host" || o.Lease.Identity != "nvidia-driver-daemonset-x7k2p" {
		t.Fatalf("%+v", o)
	}
	if !o.Eviction.Enabled || o.Eviction.Force || o.Eviction.Timeout != 300*time.Second {
		t.Fatalf("eviction %+v", o.Eviction)
	}
	if !o.Drain.Enabled || !o.Drain.Force || !o.Drain.DeleteEmptyDirData || o.Drain.PodSelector != "app!=critical" {
		t.Fatalf("drain %+v", o.Drain)
	}
	if o.DriverVersion != "580.95.05" || o.KernelModuleType != "open" {
		t.Fatalf("driver version %q, module type %q: what the pod installs, for adopting a loaded driver", o.DriverVersion, o.KernelModuleType)
	}
	if o.DRAPlugin != "dra-driver" || o.Allocation != "dra" {
		t.Fatalf("DRA plugin operand %q, allocation %q, want dra-driver, dra", o.DRAPlugin, o.Allocation)
	}
	// "0s" is "no bound" upstream; here it takes the default bound.
	o.Complete()
	if o.Drain.Timeout != gpudrain.DefaultTimeout {
		t.Fatalf("drain timeout %s, want the default bound %s", o.Drain.Timeout, gpudrain.DefaultTimeout)
	}
}

func TestOptionsFromEnvDefaultsAndBareSeconds(t *testing.T) {
	o, err := OptionsFromEnv(getenv(map[string]string{"EVICTION_TIMEOUT_SECONDS": "90"}))
	if err != nil {
		t.Fatal(err)
	}
	if !o.Eviction.Enabled || o.Drain.Enabled || o.ForceReinstall || o.Eviction.Timeout != 90*time.Second {
		t.Fatalf("%+v", o)
	}
}

func TestOptionsFromEnvNamesBadValues(t *testing.T) {
	_, err := OptionsFromEnv(getenv(map[string]string{"ENABLE_AUTO_DRAIN": "yes please", "DRAIN_TIMEOUT_SECONDS": "5 minutes"}))
	if err == nil || !strings.Contains(err.Error(), "ENABLE_AUTO_DRAIN") || !strings.Contains(err.Error(), "DRAIN_TIMEOUT_SECONDS") {
		t.Fatalf("err = %v", err)
	}
}

func TestCommandsAreWired(t *testing.T) {
	var out bytes.Buffer
	cmd := NewCommand(&out)
	for _, name := range []string{"uninstall-driver", "uncordon-when-valid", "detect"} {
		if c, _, err := cmd.Find([]string{name}); err != nil || c.Name() != name {
			t.Errorf("subcommand %s: %v", name, err)
		}
	}
	c, _, _ := cmd.Find([]string{"uncordon-when-valid"})
	for _, f := range []string{"validator-component", "timeout", "hold"} {
		if c.Flags().Lookup(f) == nil {
			t.Errorf("uncordon-when-valid lacks --%s", f)
		}
	}
}

func TestRDMAEnvironment(t *testing.T) {
	o, err := OptionsFromEnv(getenv(map[string]string{"GPU_DIRECT_RDMA_ENABLED": "true", "USE_HOST_MOFED": "true"}))
	if err != nil || !o.GPUDirectRDMA || !o.HostMOFED {
		t.Fatalf("%+v, %v", o, err)
	}
	o, err = OptionsFromEnv(getenv(nil))
	if err != nil || o.GPUDirectRDMA || o.HostMOFED {
		t.Fatalf("%+v, %v", o, err)
	}
}

func TestKernelSelection(t *testing.T) {
	o, err := OptionsFromEnv(getenv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := o.Host.Kernel.(kmod.System); !ok {
		t.Fatalf("default kernel %T, want kmod.System", o.Host.Kernel)
	}
	if _, err := OptionsFromEnv(getenv(map[string]string{KernelEnv: "fake"})); err == nil || !strings.Contains(err.Error(), KernelEnv) {
		t.Fatalf("err %v", err)
	}

	// the fixture kernel acts on the fixture host tree, reads the fixture's mount table, and leaves the real
	// kernel alone
	f := kmodtest.New(t)
	f.LoadDriver()
	f.AddPCIFunction("0000:01:00.0", kmod.VendorNVIDIA, "vfio-pci", "vfio-pci")
	table := filepath.Join(f.Root, "proc/self/mountinfo")
	if err := os.WriteFile(table, []byte("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n100 22 0:99 / /run/nvidia/driver rw - overlay overlay rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err = OptionsFromEnv(getenv(map[string]string{KernelEnv: KernelFixture, "HOST_ROOT": f.Root}))
	if err != nil {
		t.Fatal(err)
	}
	o.Host.Complete()
	if _, ok := o.Host.Kernel.(*kmod.FixtureKernel); !ok {
		t.Fatalf("kernel %T, want *kmod.FixtureKernel", o.Host.Kernel)
	}
	unloaded, err := o.Host.Unload()
	if err != nil || len(unloaded) != 4 || len(f.LoadedModules()) != 0 {
		t.Fatalf("unloaded %v, %v; left %v", unloaded, err, f.LoadedModules())
	}
	unmounted, err := o.Host.UnmountDriverRoot()
	if err != nil || !slices.Equal(unmounted, []string{"/run/nvidia/driver"}) {
		t.Fatalf("unmounted %v, %v", unmounted, err)
	}
	if b, _ := os.ReadFile(table); strings.Contains(string(b), "/run/nvidia/driver") {
		t.Fatalf("mount record left:\n%s", b)
	}
	released, err := o.Host.UnbindVFIO()
	if drv, override := f.PCIDriver("0000:01:00.0"); err != nil || len(released) != 1 || drv != "" || override != "" {
		t.Fatalf("released %v, %v: bound to %q, override %q", released, err, drv, override)
	}
}

// snapshot is every path under root with its content or link target.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[p] = "-> " + target
		case d.Type().IsRegular():
			b, _ := os.ReadFile(p)
			out[p] = string(b)
		default:
			out[p] = "dir"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDetectReportsAndChangesNothing(t *testing.T) {
	f := kmodtest.New(t)
	f.LoadDriver()
	f.HostNvidiaSMI("usr/bin")
	f.OpenDevice(4321, "nv-hostengine", "/dev/nvidia0")
	f.AddPCIFunction("0000:01:00.0", kmod.VendorNVIDIA, "nvidia", "")
	before := snapshot(t, f.Root)
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs([]string{"detect", "--host-root", f.Root, "--own-root", f.Root})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"host driver:                found: " + filepath.Join(f.Root, "usr/bin/nvidia-smi"),
		"NVIDIA modules loaded:      nvidia_drm (use count 0), nvidia_modeset (use count 1, held by nvidia_drm), nvidia_uvm (use count 0), nvidia (use count 2, held by nvidia_modeset nvidia_uvm)",
		"/dev/nvidia* held open by:  pid 4321 (nv-hostengine)",
		"NVIDIA PCI functions:       0000:01:00.0 (nvidia)",
		"verdict:                    host driver",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if after := snapshot(t, f.Root); len(after) != len(before) {
		t.Fatalf("detect changed the host tree: %d paths before, %d after", len(before), len(after))
	} else {
		for p, v := range before {
			if after[p] != v {
				t.Fatalf("detect changed %s", p)
			}
		}
	}
	if calls := f.Kernel.CallList(); len(calls) != 0 {
		t.Fatalf("kernel calls: %v", calls)
	}
}

// A leftover nvidia-smi on the host (it fails: no driver loaded) is reported, and is no host driver.
func TestDetectReportsALeftoverNvidiaSMI(t *testing.T) {
	f := kmodtest.New(t)
	f.LeftoverNvidiaSMI("opt/bin")
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs([]string{"detect", "--host-root", f.Root, "--own-root", f.Root})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"host driver:                none (nvidia-smi under " + filepath.Join(f.Root, "opt/bin") + " failed: exit 9: NVIDIA-SMI has failed",
		"verdict:                    no NVIDIA GPU and no NVIDIA driver found",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
