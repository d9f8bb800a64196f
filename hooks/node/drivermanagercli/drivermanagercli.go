// Package drivermanagercli is the `driver-manager` command: `uninstall-driver`, the init container of the driver
// and vGPU-manager pods (configured by the environment the chart sets), and `uncordon-when-valid`, which lifts the
// upgrade's cordon once the node validates with the new driver.
package drivermanagercli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// NewCommand returns the driver-manager root command writing its logs and summary lines to out.
func NewCommand(out io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "driver-manager",
		Short:         "Node-local driver changes: move GPU workloads off, pause operands, unload the driver",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(uninstallCommand(out), uncordonCommand(out), detectCommand(out))
	return root
}

func uninstallCommand(out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "uninstall-driver",
		Short: "Prepare the node for the driver about to start (configured by environment variables)",
		Long: `Prepare the node for the driver about to start: keep the loaded driver when DRIVER_CONFIG_DIGEST matches
the one it recorded. A driver another installer loaded (the GPU Operator's: no digest of ours recorded) is
adopted the same way when it is the DRIVER_VERSION and KERNEL_MODULE_TYPE (open, proprietary; auto: either) this
pod installs: our digest recorded, nothing evicted, the node validation-required. Otherwise cordon, evict GPU pods (ENABLE_GPU_POD_EVICTION, EVICTION_*), drain on failure
(ENABLE_AUTO_DRAIN, DRAIN_*), pause the GPU operands, unload the NVIDIA modules and clear the old driver root.
With DRA_PLUGIN_OPERAND (the DRA kubelet plugin's operand, dra-driver) on a node where that plugin runs, the
plugin is paused last, once no pod holds a gpu.nvidia.com claim (one left fails the run, the plugin untouched).
GPU_ALLOCATION (device-plugin or dra) is written as the node label nvidia.com/gpu.allocation, which places the
device plugin and the DRA kubelet plugin; a node labelled the other way goes through the change path above (its
GPU pods evicted, both plugins paused, the driver reloaded) even with an unchanged DRIVER_CONFIG_DIGEST.
Before the new driver installs: unload nouveau, release NVIDIA functions left on vfio-pci, and with
GPU_DIRECT_RDMA_ENABLED=true on a node with a Mellanox device wait for MOFED (USE_HOST_MOFED=true: mlx5_core on
the host). A host-installed driver marks the node pre-installed and fails, so the driver container never starts.
Stopped (SIGTERM), it leaves the node as it got it (cordon, paused operands, state) for the next driver pod.
Two driver pods on one node take turns: each run holds the Lease kube-gpu-stack-driver-<node> in
OPERATOR_NAMESPACE (POD_NAME names the holder); a killed holder's Lease expires after 15s. Losing it mid-run stops
the run as SIGTERM does.
Timeouts are Go durations ("300s"; a bare number is seconds; "0s" means the 5m default bound).
DRIVER_MANAGER_KERNEL=fixture is for tests only: every change goes to the fixture host tree at HOST_ROOT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := OptionsFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			if o.Client, err = client(); err != nil {
				return err
			}
			o.Log = slog.New(slog.NewTextHandler(out, nil))
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
}

func detectCommand(out io.Writer) *cobra.Command {
	var h kmod.Host
	cmd := &cobra.Command{
		Use:   "detect",
		Short: "Report what the driver manager sees on this node (host driver, loaded modules, who holds the GPUs); changes nothing",
		Long: `Report, read-only, what uninstall-driver would read of the node: a host-installed driver, a containerized
driver's files, the loaded NVIDIA modules and their users, nouveau, the processes holding /dev/nvidia*, and the
NVIDIA PCI functions with their drivers. No API access; nothing on the node is changed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if h.SysDir == "" {
				h.SysDir = filepath.Join(h.Root, "sys")
			}
			h.Complete()
			if err := h.Validate(); err != nil {
				return err
			}
			d, err := h.Detect(cmd.Context())
			if err != nil {
				return err
			}
			d.Write(out, h)
			return nil
		},
	}
	root := os.Getenv("HOST_ROOT")
	if root == "" {
		root = kmod.DefaultRoot
	}
	cmd.Flags().StringVar(&h.Root, "host-root", root, "where the host's / is (env HOST_ROOT; / when run on the host itself)")
	cmd.Flags().StringVar(&h.SysDir, "sys", "", "the host's sysfs (default <host-root>/sys)")
	cmd.Flags().StringVar(&h.OwnRoot, "own-root", kmod.DefaultOwnRoot,
		"the root of the mount namespace the driver container's root is mounted in (its mount table and pid file are read there)")
	return cmd
}

func uncordonCommand(out io.Writer) *cobra.Command {
	o := drivermanager.UncordonOptions{}
	cmd := &cobra.Command{
		Use:   "uncordon-when-valid",
		Short: "After a driver change, uncordon the node once its validator is Ready with the new driver",
		Long: `Run next to the driver container (a sidecar with --hold): when the node is validation-required, wait
(watching, bounded by --timeout) until the node's validator pod is Ready with the new driver, then lift the
cordon the driver manager made and mark the node upgrade-done. On an upgrade-failed node it waits, never Ready,
until the node is retried (the node keeps its rollout slot). In any other state it does nothing. Only the
timeout marks the node upgrade-failed; stopped (SIGTERM), it leaves the node validation-required.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			o.NodeName, o.Namespace, o.PodName = os.Getenv("NODE_NAME"), os.Getenv("OPERATOR_NAMESPACE"), os.Getenv("POD_NAME")
			o.ManagerOptions = OptionsFromEnv
			if o.Client, err = client(); err != nil {
				return err
			}
			o.Log = slog.New(slog.NewTextHandler(out, nil))
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
	cmd.Flags().AddFlagSet(uncordonFlags(&o))
	return cmd
}

func uncordonFlags(o *drivermanager.UncordonOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("uncordon-when-valid", pflag.ContinueOnError)
	fs.StringVar(&o.Component, "validator-component", drivermanager.DefaultValidatorComponent, "app.kubernetes.io/component of the node's validator pods")
	fs.DurationVar(&o.Timeout, "timeout", drivermanager.DefaultValidationTimeout, "how long to wait for the validator before marking the node upgrade-failed (it stays cordoned)")
	fs.DurationVar(&o.DriverStartup, "driver-startup-timeout", 0, "the driver container's startup budget (its startup probe's): --timeout then counts from the driver container's start (needs POD_NAME); 0: from the gate's start")
	fs.BoolVar(&o.Hold, "hold", false, "keep running after success until stopped (for a sidecar container)")
	fs.StringVar(&o.ReadyFile, "ready-file", "", "write this file once the node validated (the sidecar's startup probe waits for it)")
	fs.BoolVar(&o.Replace, "replace-outdated", false, "then, when the pod's DaemonSet installs another driver, empty the node (canary, slots, cordon, evict, pause) and evict this pod (an OnDelete DaemonSet)")
	fs.StringVar(&o.StopFile, "stop-file", "", "with --replace-outdated, write this file when the pod is deleted, once the node was emptied for the DaemonSet's next pod (the driver container's preStop waits for it)")
	fs.BoolVar(&o.OnRequest, "on-request", false, "with --replace-outdated, wait for the node's "+drivermanager.UpgradeRequestedAnnotation+"=true annotation (autoUpgrade=false)")
	return fs
}

// UncordonOptionsFromArgs reads `uncordon-when-valid`'s flags and environment as the command does (for a harness
// that runs the sidecar in-process).
func UncordonOptionsFromArgs(args []string, getenv func(string) string) (drivermanager.UncordonOptions, error) {
	var o drivermanager.UncordonOptions
	err := uncordonFlags(&o).Parse(args)
	o.NodeName, o.Namespace, o.PodName = getenv("NODE_NAME"), getenv("OPERATOR_NAMESPACE"), getenv("POD_NAME")
	o.ManagerOptions = OptionsFromEnv
	e := env{get: getenv}
	o.Maintenance = e.maintenance()
	return o, errors.Join(append([]error{err}, e.errs...)...)
}

// OptionsFromEnv reads the driver manager's environment (the names the GPU Operator's driver manager uses).
func OptionsFromEnv(getenv func(string) string) (drivermanager.Options, error) {
	e := env{get: getenv}
	o := drivermanager.Options{
		NodeName:       getenv("NODE_NAME"),
		Namespace:      getenv("OPERATOR_NAMESPACE"),
		Digest:         strings.TrimSpace(getenv("DRIVER_CONFIG_DIGEST")),
		ForceReinstall: e.bool("FORCE_REINSTALL", false),
		Lease:          drivermanager.Lease{Identity: getenv("POD_NAME")},
		Host:           kmod.Host{Root: getenv("HOST_ROOT"), DriverRoot: getenv("DRIVER_ROOT")},
		GPUDirectRDMA:  e.bool("GPU_DIRECT_RDMA_ENABLED", false),
		HostMOFED:      e.bool("USE_HOST_MOFED", false),
		DRAPlugin:      strings.TrimSpace(getenv("DRA_PLUGIN_OPERAND")),
		Allocation:     strings.TrimSpace(getenv("GPU_ALLOCATION")),
		// what the driver container installs: a driver another installer loaded is adopted when it is exactly that
		DriverVersion:    strings.TrimSpace(getenv("DRIVER_VERSION")),
		KernelModuleType: strings.TrimSpace(getenv("KERNEL_MODULE_TYPE")),
		Eviction: drivermanager.Eviction{
			Enabled:            e.bool("ENABLE_GPU_POD_EVICTION", true),
			Force:              e.bool("EVICTION_USE_FORCE", false),
			DeleteEmptyDirData: e.bool("EVICTION_DELETE_EMPTYDIR_DATA", false),
			Timeout:            e.duration("EVICTION_TIMEOUT_SECONDS"),
		},
		Drain: drivermanager.Drain{
			Enabled:            e.bool("ENABLE_AUTO_DRAIN", false),
			Force:              e.bool("DRAIN_USE_FORCE", false),
			DeleteEmptyDirData: e.bool("DRAIN_DELETE_EMPTYDIR_DATA", false),
			PodSelector:        getenv("DRAIN_POD_SELECTOR_LABEL"),
			Timeout:            e.duration("DRAIN_TIMEOUT_SECONDS"),
		},
	}
	o.Maintenance = e.maintenance()
	if err := SelectKernel(&o.Host, getenv(KernelEnv)); err != nil {
		e.errs = append(e.errs, err)
	}
	return o, errors.Join(e.errs...)
}

// KernelEnv selects the kernel the driver manager acts on: unset or KernelSystem is the running kernel;
// KernelFixture is for tests only.
const KernelEnv = "DRIVER_MANAGER_KERNEL"

// Values of KernelEnv.
const (
	// KernelSystem: delete_module(2), umount2(2) and sysfs writes on the node (the default).
	KernelSystem = "system"
	// KernelFixture, for tests only: the host root (HOST_ROOT) is a fixture GPU host tree, and every change goes
	// to that tree instead of the kernel (kmod.FixtureKernel): a module is removed from its proc/modules and
	// sys/module, an unmount removes the mount from its mount table <HOST_ROOT>/proc/self/mountinfo (which the
	// manager then also reads instead of its own), and the PCI functions are those of <HOST_ROOT>/sys. A driver
	// manager in a real container on a test node, whose kernel has no NVIDIA modules, so works on the fixture.
	KernelFixture = "fixture"
)

// SelectKernel sets h's Kernel (and, for the fixture, the paths that must point into it) from KernelEnv's value.
func SelectKernel(h *kmod.Host, kernel string) error {
	switch strings.TrimSpace(kernel) {
	case "", KernelSystem:
		h.Kernel = kmod.System{}
		return nil
	case KernelFixture:
		if h.Root == "" {
			h.Root = kmod.DefaultRoot
		}
		if h.OwnRoot == "" {
			h.OwnRoot = kmod.DefaultOwnRoot
		}
		h.MountInfo = filepath.Join(h.Root, "proc", "self", "mountinfo") // under OwnRoot "/": the fixture's table
		h.SysDir = filepath.Join(h.Root, "sys")
		h.Kernel = kmod.NewFixtureKernel(*h)
		return nil
	}
	return fmt.Errorf("%s=%q: want %s (the default) or %s (tests only)", KernelEnv, kernel, KernelSystem, KernelFixture)
}

// maintenance reads how a driver change marks its node for remediation controllers: the GPU health agent's
// condition (HEALTH_CONDITION_TYPE) and an opt-out label (MAINTENANCE_LABEL, key=value).
func (e *env) maintenance() drivermanager.Maintenance {
	mt := drivermanager.Maintenance{Condition: corev1.NodeConditionType(strings.TrimSpace(e.get("HEALTH_CONDITION_TYPE")))}
	var err error
	if mt.LabelKey, mt.LabelValue, err = nodestate.ParseMaintenanceLabel(strings.TrimSpace(e.get("MAINTENANCE_LABEL"))); err != nil {
		e.errs = append(e.errs, fmt.Errorf("MAINTENANCE_LABEL: %w", err))
	}
	return mt
}

type env struct {
	get  func(string) string
	errs []error
}

func (e *env) bool(name string, def bool) bool {
	v := strings.TrimSpace(e.get(name))
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want true or false", name, v))
		return def
	}
	return b
}

// duration reads a Go duration; a bare number is seconds (the variables' names say seconds). 0 means the
// package default bound.
func (e *env) duration(name string) time.Duration {
	v := strings.TrimSpace(e.get(name))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: want a duration such as 300s or 5m", name, v))
		return 0
	}
	return d
}

// client uses $KUBECONFIG when set, else the pod's service account.
func client() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kc := os.Getenv("KUBECONFIG"); kc != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kc)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client config: %w", err)
	}
	cfg.UserAgent = "kube-gpu-stack-driver-manager"
	// protobuf, as the kubelet and the control plane speak: every node's gate watches nodes, pods and Leases for the
	// whole rollout, and JSON costs several times the CPU on both ends (every type it reads is built in)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubernetes.NewForConfig(cfg)
}
