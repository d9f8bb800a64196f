// Package validation holds the node-local checks of the validator: each proves one layer of the GPU stack works on
// its node (driver, container toolkit, CUDA, device plugin or DRA driver, vfio-pci, vGPU manager and devices, CC manager, kernel
// modules), writes the status file the next operands wait on under the validations directory, and records its
// outcome on the Node (annotation kube-gpu-stack.io/validation.<check>, see hooks/upgrade/nodestate) so the cluster-level
// gate can say per node what works and what does not, and why.
//
// Every host access goes through HostRoot, DriverInstallDir and OutputDir, every API call through Client, every
// program through Runner and NVML through an NVMLProbe, so the checks run against fixture trees, a fake clientset
// and the go-nvml mock. A static build (CGO_ENABLED=0) has no NVML: its driver and toolkit checks rest on nvidia-smi.
package validation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/statusfiles"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// Components are the validator's subcommands, in the order the chart runs them.
var Components = []string{
	"driver", "toolkit", "cuda", "plugin", "dra", "vfio-pci", "vgpu-manager", "vgpu-devices", "cc-manager",
	"rdma", "gds", "gdrcopy", "ready", "metrics",
}

// Workload configs (node label WorkloadConfigLabel): the node's GPU role.
const (
	WorkloadContainer     = nodestate.RoleContainer
	WorkloadVMPassthrough = nodestate.RoleVMPassthrough
	WorkloadVMVGPU        = nodestate.RoleVMVGPU
)

// Node labels the checks read (set by the admin, NFD or GFD; never written here).
const (
	WorkloadConfigLabel = nodestate.WorkloadConfigLabel
	CCCapableLabel      = "nvidia.com/cc.capable"
)

// Defaults of the workload pods the cuda and plugin checks run.
const (
	DefaultWorkloadImage   = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"
	DefaultWorkloadCommand = "/cuda-samples/vectorAdd"
)

// Options configure one validator component.
type Options struct {
	// Component is one of Components.
	Component string
	// NodeName is this node; empty skips recording outcomes on the Node (unit runs).
	NodeName string
	// OutputDir holds the status files (default statusfiles.DefaultDir).
	OutputDir string
	// HostRoot is where the host's "/" is mounted (default /host).
	HostRoot string
	// CtrRoot is this container's own "/", where the nvidia runtime injects nvidia-smi and libnvidia-ml for the
	// toolkit check (default "/"; tests point it at a fixture tree).
	CtrRoot string
	// DriverInstallDir is where the containerized driver's root is mounted (default /run/nvidia/driver).
	DriverInstallDir string
	// DriverInstallDirHostPath is DriverInstallDir's path on the host, written to driver-ready as
	// NVIDIA_DRIVER_ROOT (default: DriverInstallDir, the chart mounts it at the same path).
	DriverInstallDirHostPath string

	// WithWait retries a check that is not passing yet every SleepInterval until it passes or the context ends;
	// false makes one attempt and fails (the kubelet restarts the init container).
	WithWait bool
	// SleepInterval is the time between attempts (default 1s; the GPU Operator's 5 s would add up to 5 s to every
	// batch of a driver rollout, as the node's gate waits on this check. An attempt that fails is cheap: a stat of the
	// driver root, or one nvidia-smi that answers at once).
	SleepInterval time.Duration
	// Timeout bounds each wait on the API inside one attempt: the node's GPU capacity, a workload pod (default 5m).
	Timeout time.Duration
	// SkipGPUInit runs only `nvidia-smi --version` for the driver check: no GPU is initialised, no NVML.
	SkipGPUInit bool
	// DevCharDir is where the host's /dev/char is mounted (default DefaultDevCharDir); the driver check links the
	// driver's character devices there. A directory that does not exist is skipped.
	DevCharDir string
	// DisableDevCharSymlinks keeps the driver check from creating the /dev/char links.
	DisableDevCharSymlinks bool

	// WithWorkload makes the plugin check also run a pod that requests one GPU, and the dra check one that claims one.
	WithWorkload bool
	// MIGStrategy is the device plugin's: single or none (nvidia.com/gpu), mixed (nvidia.com/mig-*).
	MIGStrategy string
	// DRANodes selects the nodes whose driver pool allocates GPUs through DRA (no device plugin runs there): the
	// plugin check skips them and the dra check checks only them. nil: every node has the device plugin.
	DRANodes *corev1.NodeSelector
	// Namespace receives the workload pods (the validator's own namespace).
	Namespace string
	// WorkloadImage runs the CUDA sample of the cuda and plugin workload pods (default DefaultWorkloadImage).
	WorkloadImage string
	// WorkloadCommand is the sample's command (default DefaultWorkloadCommand).
	WorkloadCommand []string
	// PullPolicy, PullSecrets and RuntimeClass configure the workload pods.
	PullPolicy   string
	PullSecrets  []string
	RuntimeClass string
	// WorkloadServiceAccount runs the workload pods: an account with no rights (the chart's admission policy lets
	// the validator create pods only with it), so a pod the validator creates never holds another operand's token.
	// Empty: the namespace's default account.
	WorkloadServiceAccount string

	// DefaultWorkloadConfig is the node's role when it has no valid WorkloadConfigLabel (default container).
	DefaultWorkloadConfig string

	// MetricsAddr is where the metrics component listens (default ":8000").
	MetricsAddr string
	// MetricsSecure serves /metrics over TLS to callers the API server authenticates and authorizes (GET on the
	// non-resource URL /metrics), through Client's account; /healthz stays open for the kubelet's probe.
	MetricsSecure bool

	// Client reaches the API server; nil skips recording outcomes (cuda and plugin need it).
	Client kubernetes.Interface
	// Runner runs nvidia-smi (default ExecRunner).
	Runner Runner
	// NVML counts GPUs and reads the driver version (default GoNVMLProbe; in a CGO_ENABLED=0 build one that
	// returns ErrNVMLNotBuiltIn).
	NVML NVMLProbe
}

// Complete fills defaults.
func (o *Options) Complete() {
	if o.OutputDir == "" {
		o.OutputDir = statusfiles.DefaultDir
	}
	if o.HostRoot == "" {
		o.HostRoot = "/host"
	}
	if o.CtrRoot == "" {
		o.CtrRoot = "/"
	}
	if o.DevCharDir == "" {
		o.DevCharDir = DefaultDevCharDir
	}
	if o.DriverInstallDir == "" {
		o.DriverInstallDir = "/run/nvidia/driver"
	}
	if o.DriverInstallDirHostPath == "" {
		o.DriverInstallDirHostPath = o.DriverInstallDir
	}
	if o.SleepInterval <= 0 {
		o.SleepInterval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.MIGStrategy == "" {
		o.MIGStrategy = "single"
	}
	if o.WorkloadImage == "" {
		o.WorkloadImage = DefaultWorkloadImage
	}
	if len(o.WorkloadCommand) == 0 {
		o.WorkloadCommand = []string{DefaultWorkloadCommand}
	}
	if o.DefaultWorkloadConfig == "" {
		o.DefaultWorkloadConfig = WorkloadContainer
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = ":8000"
	}
	if o.Runner == nil {
		o.Runner = ExecRunner{}
	}
	if o.NVML == nil {
		o.NVML = defaultNVMLProbe()
	}
}

// Validate rejects options the component cannot act on, naming the setting at fault.
func (o *Options) Validate() error {
	if !slices.Contains(Components, o.Component) {
		return fmt.Errorf("unknown component %q: one of %s", o.Component, strings.Join(Components, ", "))
	}
	if !nodestate.ValidRole(o.DefaultWorkloadConfig) {
		return fmt.Errorf("DEFAULT_GPU_WORKLOAD_CONFIG %q: one of container, vm-passthrough, vm-vgpu", o.DefaultWorkloadConfig)
	}
	switch o.MIGStrategy {
	case "none", "single", "mixed":
	default:
		return fmt.Errorf("MIG_STRATEGY %q: one of none, single, mixed", o.MIGStrategy)
	}
	if o.Component == "cuda" || o.Component == "plugin" || o.Component == "dra" {
		var missing []string
		if o.Client == nil {
			missing = append(missing, "API access (in-cluster config)")
		}
		if o.NodeName == "" {
			missing = append(missing, "NODE_NAME")
		}
		if o.Namespace == "" {
			missing = append(missing, "OPERATOR_NAMESPACE")
		}
		if len(missing) > 0 {
			return fmt.Errorf("the %s check runs a pod on this node and needs %s", o.Component, strings.Join(missing, ", "))
		}
	}
	return nil
}

// Run runs the component: a check writes its status files and returns nil once it passes (or was skipped), or an
// error saying why it did not; ready and metrics run until ctx ends.
func (o *Options) Run(ctx context.Context, out io.Writer) error {
	switch o.Component {
	case "ready":
		node := o.NodeName
		if node == "" {
			node = "this node"
		}
		fmt.Fprintf(out, "all validations passed on %s\n", node)
		<-ctx.Done()
		return nil
	case "metrics":
		return o.serveMetrics(ctx, out)
	}
	c, err := o.check()
	if err != nil {
		return err
	}
	return o.run(ctx, out, c)
}

func (o *Options) check() (check, error) {
	switch o.Component {
	case "driver":
		return o.driverCheck(), nil
	case "toolkit":
		return o.toolkitCheck(), nil
	case "cuda":
		return o.cudaCheck(), nil
	case "plugin":
		return o.pluginCheck(), nil
	case "dra":
		return o.draCheck(), nil
	case "vfio-pci":
		return o.vfioPCICheck(), nil
	case "vgpu-manager":
		return o.vgpuManagerCheck(), nil
	case "vgpu-devices":
		return o.vgpuDevicesCheck(), nil
	case "cc-manager":
		return o.ccManagerCheck(), nil
	case "rdma", "gds", "gdrcopy":
		return o.moduleCheck(o.Component), nil
	}
	return check{}, errors.New("no check named " + o.Component)
}
