package validation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	nvidia    = "0x10de"
	gpu3D     = "0x030200"
	gpuVGA    = "0x030000"
	nvswitch  = "0x068000"
	mellanox  = "0x15b3"
	ethernet  = "0x020000"
	gpuAddr   = "0000:3b:00.0"
	gpuAddr2  = "0000:86:00.0"
	vfAddr    = "0000:3b:00.4"
	otherAddr = "0000:5e:00.0"
)

// sandboxCase is one run of a VM-node check: node labels, a host tree, the annotation and status files after.
type sandboxCase struct {
	name      string
	labels    map[string]string
	defaultWL string
	setup     func(e *env)
	want      string
	files     map[string]string // status file → content ("*": any)
	absent    []string
}

func runSandboxCases(t *testing.T, component string, cases []sandboxCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nodeWith(tc.labels, nil))
			o := e.options(component)
			if tc.defaultWL != "" {
				o.DefaultWorkloadConfig = tc.defaultWL
			}
			for _, f := range append([]string{"workload-type"}, tc.absent...) {
				writeFile(t, e.out, f, "stale", 0o644) // an earlier run's files
			}
			if tc.setup != nil {
				tc.setup(e)
			}
			err := e.run(o)
			want := strings.NewReplacer("@host", e.host, "@driver", e.driver, "@out", e.out).Replace(tc.want)
			if got := e.annotation(component); got != want {
				t.Fatalf("annotation:\n got %q\nwant %q\nlog: %s", got, want, e.log.String())
			}
			if (err != nil) != strings.HasPrefix(want, "failed") {
				t.Fatalf("err %v with annotation %q", err, want)
			}
			for name, content := range tc.files {
				got, ok := e.status(name)
				if !ok || (content != "*" && got != content) {
					t.Fatalf("%s = %q (exists %v), want %q", name, got, ok, content)
				}
			}
			for _, name := range tc.absent {
				if _, ok := e.status(name); ok {
					t.Fatalf("%s exists", name)
				}
			}
		})
	}
}

func TestVfioPCICheck(t *testing.T) {
	passthrough := map[string]string{WorkloadConfigLabel: WorkloadVMPassthrough}
	runSandboxCases(t, "vfio-pci", []sandboxCase{{
		name:   "container node: skipped, its role written, no vfio-pci-ready",
		labels: map[string]string{WorkloadConfigLabel: WorkloadContainer},
		want:   "skipped: node's workload config is container, not vm-passthrough",
		files:  map[string]string{"workload-type": "container"},
		absent: []string{"vfio-pci-ready"},
	}, {
		name:   "vm-vgpu node: skipped, so the sandbox device plugin still waits for vgpu-devices-ready",
		labels: map[string]string{WorkloadConfigLabel: WorkloadVMVGPU},
		want:   "skipped: node's workload config is vm-vgpu, not vm-passthrough",
		files:  map[string]string{"workload-type": "vm-vgpu"},
		absent: []string{"vfio-pci-ready"},
	}, {
		name:   "every GPU bound to a vfio driver; NVSwitch, VF and other vendors ignored",
		labels: passthrough,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "vfio-pci", numVFs: 2})
			addPCI(e.t, e.host, pciDevice{addr: vfAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", physfn: gpuAddr})
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr2, vendor: nvidia, class: gpuVGA, driver: "nvgrace_gpu_vfio_pci"})
			addPCI(e.t, e.host, pciDevice{addr: "0000:c1:00.0", vendor: nvidia, class: nvswitch, driver: "nvidia"})
			addPCI(e.t, e.host, pciDevice{addr: otherAddr, vendor: mellanox, class: ethernet, driver: "mlx5_core"})
		},
		want:  "ready",
		files: map[string]string{"workload-type": "vm-passthrough", "vfio-pci-ready": ""},
	}, {
		name:   "GPUs still on nouveau or no driver: each named",
		labels: passthrough,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "nouveau"})
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr2, vendor: nvidia, class: gpu3D})
			addPCI(e.t, e.host, pciDevice{addr: "0000:af:00.0", vendor: nvidia, class: gpu3D, driver: "vfio-pci"})
		},
		want:   "failed: GPU 0000:3b:00.0 is bound to nouveau, not vfio-pci; GPU 0000:86:00.0 is bound to no driver, not vfio-pci",
		files:  map[string]string{"workload-type": "vm-passthrough"},
		absent: []string{"vfio-pci-ready"},
	}, {
		name:   "no GPU at all",
		labels: passthrough,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: otherAddr, vendor: mellanox, class: ethernet, driver: "mlx5_core"})
		},
		want:   "failed: no NVIDIA GPU under @host/sys/bus/pci/devices",
		absent: []string{"vfio-pci-ready"},
	}, {
		name:      "no valid label: the default role applies",
		labels:    map[string]string{WorkloadConfigLabel: "gaming"},
		defaultWL: WorkloadVMPassthrough,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "vfio-pci"})
		},
		want:  "ready",
		files: map[string]string{"workload-type": "vm-passthrough", "vfio-pci-ready": ""},
	}})
}

func TestVGPUManagerCheck(t *testing.T) {
	vgpu := map[string]string{WorkloadConfigLabel: WorkloadVMVGPU}
	runSandboxCases(t, "vgpu-manager", []sandboxCase{{
		name:   "vm-passthrough node: skipped",
		labels: map[string]string{WorkloadConfigLabel: WorkloadVMPassthrough},
		want:   "skipped: node's workload config is vm-passthrough, not vm-vgpu",
		files:  map[string]string{"workload-type": "vm-passthrough"},
		absent: []string{"vgpu-manager-ready", "host-vgpu-manager-ready"},
	}, {
		name:   "host vGPU manager with mdev parents",
		labels: vgpu,
		setup: func(e *env) {
			installDriver(e.t, e.host)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			writeFile(e.t, e.host, "sys/class/mdev_bus/"+gpuAddr+"/uevent", "", 0o644)
		},
		want:   "ready",
		files:  map[string]string{"workload-type": "vm-vgpu", "host-vgpu-manager-ready": ""},
		absent: []string{"vgpu-manager-ready"},
	}, {
		name:   "vgpu-manager operand with SR-IOV VFs",
		labels: vgpu,
		setup: func(e *env) {
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", numVFs: 16})
		},
		want:   "ready",
		files:  map[string]string{"vgpu-manager-ready": ""},
		absent: []string{"host-vgpu-manager-ready"},
	}, {
		name:   "manager answers but no GPU offers vGPUs",
		labels: vgpu,
		setup: func(e *env) {
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "nvidia"})
		},
		want: "failed: the vGPU manager answers (@driver/usr/bin) but no GPU offers vGPUs yet: @host/sys/class/mdev_bus is empty " +
			"and no NVIDIA GPU has SR-IOV VFs enabled (sriov_numvfs is 0)",
		absent: []string{"vgpu-manager-ready"},
	}, {
		name:   "no manager anywhere",
		labels: vgpu,
		want: "failed: no vGPU manager: no nvidia-smi under @host or @driver in usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin " +
			"(is the vgpu-manager operand running on this node?)",
	}, {
		name:   "manager's nvidia-smi fails",
		labels: vgpu,
		setup: func(e *env) {
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{out: "No devices were found\n", err: exitError(6)}
		},
		want: "failed: nvidia-smi under @driver/usr/bin failed: exit 6: No devices were found",
	}})
}

func TestVGPUDevicesCheck(t *testing.T) {
	vgpu := map[string]string{WorkloadConfigLabel: WorkloadVMVGPU}
	runSandboxCases(t, "vgpu-devices", []sandboxCase{{
		name:   "container node: skipped",
		want:   "skipped: node's workload config is container, not vm-vgpu",
		files:  map[string]string{"workload-type": "container"},
		absent: []string{"vgpu-devices-ready"},
	}, {
		name:   "an mdev vGPU exists",
		labels: vgpu,
		setup: func(e *env) {
			writeFile(e.t, e.host, "sys/bus/mdev/devices/c0b26072-dd1b-4340-84fe-bf338c510818/uevent", "", 0o644)
		},
		want:  "ready",
		files: map[string]string{"workload-type": "vm-vgpu", "vgpu-devices-ready": ""},
	}, {
		name:   "a VF with a vGPU type",
		labels: vgpu,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", numVFs: 2})
			addPCI(e.t, e.host, pciDevice{addr: vfAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", physfn: gpuAddr, vgpuType: "0"})
			addPCI(e.t, e.host, pciDevice{addr: "0000:3b:00.5", vendor: nvidia, class: gpu3D, driver: "nvidia", physfn: gpuAddr, vgpuType: "557"})
		},
		want:  "ready",
		files: map[string]string{"vgpu-devices-ready": ""},
	}, {
		name:   "VFs without a vGPU type",
		labels: vgpu,
		setup: func(e *env) {
			addPCI(e.t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", numVFs: 1})
			addPCI(e.t, e.host, pciDevice{addr: vfAddr, vendor: nvidia, class: gpu3D, driver: "nvidia", physfn: gpuAddr, vgpuType: "0"})
		},
		want: "failed: no vGPU device yet: @host/sys/bus/mdev/devices is empty and no NVIDIA VF has a vGPU type " +
			"(nvidia/current_vgpu_type is 0); the vGPU device manager creates them",
		absent: []string{"vgpu-devices-ready"},
	}})
}

func TestCCManagerCheck(t *testing.T) {
	runSandboxCases(t, "cc-manager", []sandboxCase{{
		name:  "not CC-capable: skipped, passes",
		want:  "skipped: node is not CC-capable (label nvidia.com/cc.capable is not true)",
		files: map[string]string{"cc-manager-ready": ""},
	}, {
		name:   "CC-capable, CC manager not done",
		labels: map[string]string{CCCapableLabel: "true"},
		want:   "failed: node is CC-capable (nvidia.com/cc.capable=true) and the CC manager has not set the CC mode yet (no .cc-manager-ctr-ready in @out)",
		absent: []string{"cc-manager-ready"},
	}, {
		name:   "CC-capable, CC manager done",
		labels: map[string]string{CCCapableLabel: "true"},
		setup:  func(e *env) { writeFile(e.t, e.out, CCManagerCtrReadyFile, "", 0o644) },
		want:   "ready",
		files:  map[string]string{"cc-manager-ready": ""},
	}})
}

// Unit runs without a cluster take the default role.
func TestWorkloadConfigWithoutAPIAccessIsTheDefault(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("vfio-pci")
	o.Client, o.NodeName, o.DefaultWorkloadConfig = nil, "", WorkloadVMPassthrough
	addPCI(t, e.host, pciDevice{addr: gpuAddr, vendor: nvidia, class: gpu3D, driver: "vfio-pci"})
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.out, "workload-type")); err != nil || string(b) != WorkloadVMPassthrough {
		t.Fatalf("workload-type %q, %v", b, err)
	}
}
