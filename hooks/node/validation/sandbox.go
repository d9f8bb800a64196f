package validation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// vfioDrivers are the drivers a passed-through GPU may be bound to (the second: Grace Hopper and later).
var vfioDrivers = []string{"vfio-pci", "nvgrace_gpu_vfio_pci"}

// workloadTypeFile holds the node's role; the sandbox device plugins wait for it.
const workloadTypeFile = "workload-type"

// workloadConfig is the node's role: its WorkloadConfigLabel when valid, else DefaultWorkloadConfig. Without API
// access (unit runs) it is the default.
func (o *Options) workloadConfig(ctx context.Context, p progress) (string, error) {
	if o.Client == nil || o.NodeName == "" {
		return o.DefaultWorkloadConfig, nil
	}
	node, err := o.Client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read node %s: %w", o.NodeName, err)
	}
	v, ok := node.Labels[WorkloadConfigLabel]
	if nodestate.ValidRole(v) {
		return v, nil
	}
	if ok {
		p.Logf("node label %s=%q is not container, vm-passthrough or vm-vgpu: using the default %s", WorkloadConfigLabel, v, o.DefaultWorkloadConfig)
	}
	return o.DefaultWorkloadConfig, nil
}

// sandboxCheck is the shape of the three VM-node checks: write workload-type, skip on other roles, else run the
// role's condition. A skipped check writes no status file of its own: sandbox device plugins start on
// vfio-pci-ready or vgpu-devices-ready, so a file from the other role would start them too early.
func (o *Options) sandboxCheck(name, role string, owns []string, cond func(ctx context.Context, p progress) result) check {
	return check{
		name: name,
		owns: owns,
		attempt: func(ctx context.Context, p progress) result {
			actual, err := o.workloadConfig(ctx, p)
			if err != nil {
				return waiting("%v", err)
			}
			wt := file{name: workloadTypeFile, data: []byte(actual)}
			if actual != role {
				return skipped(fmt.Sprintf("node's workload config is %s, not %s", actual, role), wt)
			}
			r := cond(ctx, p)
			r.files = append([]file{wt}, r.files...)
			return r
		},
	}
}

// vfioPCICheck: on vm-passthrough nodes every NVIDIA GPU is bound to a vfio driver, ready to be passed to a VM.
func (o *Options) vfioPCICheck() check {
	return o.sandboxCheck("vfio-pci", WorkloadVMPassthrough, []string{"vfio-pci-ready"}, func(context.Context, progress) result {
		devs, err := o.nvidiaDevices()
		if err != nil {
			return waiting("%v", err)
		}
		var gpus, unbound []string
		for _, d := range devs {
			if !isGPU(d) || d.SriovInfo.IsVF() {
				continue
			}
			gpus = append(gpus, d.Address)
			if slices.Contains(vfioDrivers, d.Driver) {
				continue
			}
			driver := d.Driver
			if driver == "" {
				driver = "no driver"
			}
			unbound = append(unbound, fmt.Sprintf("GPU %s is bound to %s, not vfio-pci", d.Address, driver))
		}
		switch {
		case len(gpus) == 0:
			return waiting("no NVIDIA GPU under %s", o.pciDevicesDir())
		case len(unbound) > 0:
			return waiting("%s", strings.Join(unbound, "; "))
		}
		return ready(file{name: "vfio-pci-ready"})
	})
}

// vgpuManagerCheck: on vm-vgpu nodes the vGPU manager (a host install, or the vgpu-manager operand's root) answers
// nvidia-smi, and the GPUs offer vGPUs: mdev parent devices, or SR-IOV virtual functions.
func (o *Options) vgpuManagerCheck() check {
	owns := []string{"vgpu-manager-ready", "host-vgpu-manager-ready"}
	return o.sandboxCheck("vgpu-manager", WorkloadVMVGPU, owns, func(ctx context.Context, p progress) result {
		done, where, r := o.vgpuManagerAnswers(ctx)
		if done == "" {
			return r
		}
		parents, err := hostfs.Root(o.HostRoot).ReadDirNames("sys/class/mdev_bus")
		if err != nil {
			return failed("%v", err)
		}
		if len(parents) == 0 {
			devs, err := o.nvidiaDevices()
			if err != nil {
				return waiting("%v", err)
			}
			for _, d := range devs {
				if pf := d.SriovInfo.PhysicalFunction; pf != nil && pf.NumVFs > 0 {
					parents = append(parents, d.Address)
				}
			}
		}
		if len(parents) == 0 {
			return waiting("the vGPU manager answers (%s) but no GPU offers vGPUs yet: %s is empty and no NVIDIA GPU has SR-IOV VFs enabled (sriov_numvfs is 0)",
				where, path.Join(o.HostRoot, "sys/class/mdev_bus"))
		}
		p.Logf("vGPU manager answers (%s); vGPU parents: %s", where, strings.Join(parents, ", "))
		return ready(file{name: done})
	})
}

// vgpuManagerAnswers runs the vGPU manager's nvidia-smi, the host's first; it returns the status file to write
// and where the manager is.
func (o *Options) vgpuManagerAnswers(ctx context.Context) (string, string, result) {
	root, done := hostfs.Root(o.HostRoot), "host-vgpu-manager-ready"
	dir, _, err := root.FindExecutable("nvidia-smi", hostfs.BinDirs)
	if errors.Is(err, fs.ErrNotExist) {
		root, done = hostfs.Root(o.DriverInstallDir), "vgpu-manager-ready"
		dir, _, err = root.FindExecutable("nvidia-smi", hostfs.BinDirs)
		if errors.Is(err, fs.ErrNotExist) {
			return "", "", waiting("no vGPU manager: no nvidia-smi under %s or %s in %s (is the vgpu-manager operand running on this node?)",
				o.HostRoot, o.DriverInstallDir, strings.Join(hostfs.BinDirs, ", "))
		}
	}
	if err != nil {
		return "", "", failed("%v", err)
	}
	where := filepath.Join(root.String(), dir)
	if out, err := o.Runner.Run(ctx, Command{Root: root.String(), Path: "/" + dir + "/nvidia-smi"}); err != nil {
		return "", "", waiting("nvidia-smi under %s failed: %s", where, describeRun(out, err))
	}
	return done, where, result{}
}

// vgpuDevicesCheck: on vm-vgpu nodes at least one vGPU exists (an mdev device, or a VF with a vGPU type).
func (o *Options) vgpuDevicesCheck() check {
	return o.sandboxCheck("vgpu-devices", WorkloadVMVGPU, []string{"vgpu-devices-ready"}, func(context.Context, progress) result {
		mdevs, err := hostfs.Root(o.HostRoot).ReadDirNames("sys/bus/mdev/devices")
		if err != nil {
			return failed("%v", err)
		}
		if len(mdevs) > 0 {
			return ready(file{name: "vgpu-devices-ready"})
		}
		devs, err := o.nvidiaDevices()
		if err != nil {
			return waiting("%v", err)
		}
		for _, d := range devs {
			if !d.SriovInfo.IsVF() {
				continue
			}
			raw, err := os.ReadFile(filepath.Join(d.Path, "nvidia", "current_vgpu_type"))
			if err == nil && strings.TrimSpace(string(raw)) != "0" && strings.TrimSpace(string(raw)) != "" {
				return ready(file{name: "vgpu-devices-ready"})
			}
		}
		return waiting("no vGPU device yet: %s is empty and no NVIDIA VF has a vGPU type (nvidia/current_vgpu_type is 0); the vGPU device manager creates them",
			path.Join(o.HostRoot, "sys/bus/mdev/devices"))
	})
}

// ccManagerCheck: on CC-capable nodes the CC manager has set the GPUs' CC mode (it writes .cc-manager-ctr-ready).
func (o *Options) ccManagerCheck() check {
	return check{
		name: "cc-manager",
		owns: []string{"cc-manager-ready"},
		attempt: func(ctx context.Context, p progress) result {
			capable := false
			if o.Client != nil && o.NodeName != "" {
				node, err := o.Client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
				if err != nil {
					return waiting("read node %s: %v", o.NodeName, err)
				}
				capable = node.Labels[CCCapableLabel] == "true"
			}
			done := file{name: "cc-manager-ready"}
			if !capable {
				return skipped(fmt.Sprintf("node is not CC-capable (label %s is not true)", CCCapableLabel), done)
			}
			ok, err := hostfs.Root(o.OutputDir).Exists(CCManagerCtrReadyFile)
			if err != nil {
				return failed("%v", err)
			}
			if !ok {
				return waiting("node is CC-capable (%s=true) and the CC manager has not set the CC mode yet (no %s in %s)",
					CCCapableLabel, CCManagerCtrReadyFile, o.OutputDir)
			}
			return ready(done)
		},
	}
}

func (o *Options) pciDevicesDir() string { return path.Join(o.HostRoot, "sys/bus/pci/devices") }

// nvidiaDevices lists the NVIDIA PCI devices in the host's sysfs.
func (o *Options) nvidiaDevices() ([]*nvpci.NvidiaPCIDevice, error) {
	dir, err := hostfs.Root(o.HostRoot).Path("sys/bus/pci/devices")
	if err != nil {
		return nil, err
	}
	all, err := nvpci.New(nvpci.WithPCIDevicesRoot(dir), nvpci.WithLogger(quiet{})).GetAllDevices()
	if err != nil {
		return nil, fmt.Errorf("list PCI devices under %s: %w", o.pciDevicesDir(), err)
	}
	var devs []*nvpci.NvidiaPCIDevice
	for _, d := range all {
		if d.Vendor == nvpci.PCINvidiaVendorID {
			devs = append(devs, d)
		}
	}
	return devs, nil
}

// isGPU: PCI base class 0x03 (display controller: VGA, 3D, other).
func isGPU(d *nvpci.NvidiaPCIDevice) bool { return d.Class>>16 == 0x03 }

// quiet drops nvpci's warnings (a missing PCI name database, a host without iommufd): they say nothing about the
// check.
type quiet struct{}

func (quiet) Warningf(string, ...any) {}
