// Package validatorcli is the `validator` command: the per-node checks run as init containers of the validator
// DaemonSets (one subcommand per component, configured by environment as the chart sets it), the node status
// exporter (metrics), the status-file barrier every operand uses (wait, cleanup), and the node GPU health agent
// (health).
package validatorcli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/statusfiles"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

// componentHelp is each component's one-line description.
var componentHelp = map[string]string{
	"driver":       "The driver answers (host install or driver container): writes driver-ready and the extra modules' files",
	"toolkit":      "GPUs are visible in a container of the nvidia runtime: writes toolkit-ready",
	"cuda":         "A CUDA sample pod runs on this node: writes cuda-ready",
	"plugin":       "The node advertises GPUs (and, with WITH_WORKLOAD, a pod gets one): writes plugin-ready",
	"dra":          "On a DRA node, the DRA driver published its ResourceSlices (and, with WITH_WORKLOAD, a pod gets a GPU through a ResourceClaim): writes dra-ready",
	"vfio-pci":     "On vm-passthrough nodes every NVIDIA GPU is bound to vfio-pci: writes workload-type, vfio-pci-ready",
	"vgpu-manager": "On vm-vgpu nodes the vGPU manager answers and GPUs offer vGPUs: writes workload-type, (host-)vgpu-manager-ready",
	"vgpu-devices": "On vm-vgpu nodes a vGPU device exists: writes workload-type, vgpu-devices-ready",
	"cc-manager":   "On CC-capable nodes the CC manager has set the CC mode: writes cc-manager-ready",
	"rdma":         "Kernel module nvidia_peermem is loaded: writes nvidia-peermem-ready",
	"gds":          "Kernel module nvidia_fs is loaded: writes nvidia-fs-ready",
	"gdrcopy":      "Kernel module gdrdrv is loaded: writes gdrcopy-ready",
	"ready":        "Say that every validation passed on this node and stay running (the validator pods' main container)",
	"metrics":      "Serve the status files and this node's driver upgrade state as Prometheus gauges on METRICS_PORT (the node status exporter)",
}

// NewCommand returns the validator root command writing its summary lines to out.
func NewCommand(out io.Writer) *cobra.Command { return NewCommandWith(out, nil) }

// NewCommandWith is NewCommand with adjust applied to each component's Options after they are read from the
// environment and before defaults are filled (tests inject a fake clientset, a command runner and NVML).
func NewCommandWith(out io.Writer, adjust func(*validation.Options)) *cobra.Command {
	dir := os.Getenv("OUTPUT_DIR")
	if dir == "" {
		dir = statusfiles.DefaultDir
	}
	root := &cobra.Command{
		Use:           "validator",
		Short:         "Per-node GPU stack checks and the status files operands wait on",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&dir, "dir", dir, "validations directory (env OUTPUT_DIR)")

	wait := statusfiles.WaitOptions{}
	waitCmd := &cobra.Command{
		Use:   "wait FILE...",
		Short: "Block until one of the status files exists (e.g. toolkit-ready)",
		RunE: func(cmd *cobra.Command, args []string) error {
			wait.Dir, wait.Files = dir, args
			wait.Complete()
			if err := wait.Validate(); err != nil {
				return err
			}
			found, err := statusfiles.Wait(cmd.Context(), wait, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s is present: continuing\n", found)
			return nil
		},
	}
	waitCmd.Flags().DurationVar(&wait.Interval, "interval", 0, "time between checks (default 5s)")
	waitCmd.Flags().DurationVar(&wait.Timeout, "timeout", 0, "give up after this long (0: wait until stopped)")

	cleanupCmd := &cobra.Command{
		Use:   "cleanup FILE...",
		Short: "Remove the named status files (run from preStop, so no stale \"ready\" outlives its check)",
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := statusfiles.Cleanup(dir, args)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "removed %d of %d status files from %s\n", n, len(args), dir)
			return nil
		},
	}
	root.AddCommand(waitCmd, cleanupCmd, healthCommand(out))

	for _, component := range validation.Components {
		root.AddCommand(&cobra.Command{
			Use:   component,
			Short: componentHelp[component],
			Long:  componentHelp[component] + ".\n\n" + envHelp,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				o, err := fromEnv(component, dir)
				if err != nil {
					return err
				}
				if adjust != nil {
					adjust(&o)
				}
				usesAPI := component != "ready" // metrics watches its Node for the upgrade state and driver
				if o.Client == nil && o.NodeName != "" && usesAPI {
					if o.Client, err = inCluster(); err != nil {
						lost := "outcomes are not recorded on node " + o.NodeName
						if component == "metrics" {
							lost = "only the status files are reported for node " + o.NodeName
						}
						fmt.Fprintf(out, "%s: no API access (%v): %s\n", component, err, lost)
					}
				}
				o.Complete()
				if err := o.Validate(); err != nil {
					return err
				}
				return o.Run(cmd.Context(), out)
			},
		})
	}
	return root
}

const envHelp = `Environment (as the chart sets it):
  NODE_NAME                        this node (empty: outcomes are not recorded on the Node; metrics reports only
                                   the status files)
  OUTPUT_DIR                       status files directory (default /run/nvidia/validations; flag --dir)
  HOST_ROOT                        the host's / in this container (default /host)
  DRIVER_INSTALL_DIR               the driver container's root in this container (default /run/nvidia/driver)
  DRIVER_INSTALL_DIR_HOST_PATH     the same on the host, for driver-ready (default DRIVER_INSTALL_DIR)
  WITH_WAIT                        retry until the check passes (default false: one attempt, exit 1 on failure)
  SLEEP_INTERVAL_SECONDS           time between attempts (default 1)
  WORKLOAD_TIMEOUT_SECONDS         bound of each API wait: node GPU capacity, a workload pod (default 300)
  DRIVER_VALIDATION_SKIP_GPU_INIT  driver: only nvidia-smi --version, no NVML (default false)
  DEV_CHAR_DIR                     driver: the host's /dev/char in this container (default /host-dev-char)
  DISABLE_DEV_CHAR_SYMLINK_CREATION  driver: do not create /dev/char/<major>:<minor> links to the GPUs (default false)
  WITH_WORKLOAD                    plugin, dra: also run a pod that takes one GPU (device plugin / ResourceClaim) (default false)
  MIG_STRATEGY                     plugin: none, single (nvidia.com/gpu) or mixed (nvidia.com/mig-*) (default single)
  DRA_NODE_SELECTOR                plugin, dra: the nodes that allocate GPUs through DRA, a node selector as JSON
                                   ({"nodeSelectorTerms": [...]}); plugin skips them, dra checks only them (default: none)
  OPERATOR_NAMESPACE               cuda, plugin, dra: namespace of the workload pods
  CUDA_WORKLOAD_IMAGE              cuda, plugin, dra: image of the workload pods (default ` + validation.DefaultWorkloadImage + `)
  CUDA_WORKLOAD_COMMAND            cuda, plugin, dra: its command, split on spaces (default ` + validation.DefaultWorkloadCommand + `)
  VALIDATOR_IMAGE_PULL_POLICY      cuda, plugin, dra: pull policy of the workload image
  VALIDATOR_IMAGE_PULL_SECRETS     cuda, plugin, dra: comma-separated pull secret names
  VALIDATOR_RUNTIME_CLASS          cuda, plugin, dra: runtime class of the workload pods
  VALIDATOR_WORKLOAD_SERVICE_ACCOUNT  cuda, plugin, dra: service account of the workload pods (default: the namespace's default)
  DEFAULT_GPU_WORKLOAD_CONFIG      vfio-pci, vgpu-*: role of a node without a valid nvidia.com/gpu.workload.config (default container)
  METRICS_PORT                     metrics: port to serve /metrics on (default 8000)
  METRICS_SECURE                   metrics: true serves /metrics over TLS, only to callers the API server authenticates
                                   and lets GET /metrics (token and access reviews; /healthz stays open)`

const healthEnvHelp = `Environment (as the chart sets it, from global.health):
  NODE_NAME                 this node, whose condition (and taint) the agent writes (required)
  HOST_ROOT                 the host's / in this container, searched first for libnvidia-ml.so.1 (default /host)
  DRIVER_INSTALL_DIR        the driver container's root, searched next (default /run/nvidia/driver)
  HEALTH_FATAL_XIDS         comma-separated Xids that make a GPU unhealthy
  HEALTH_APPLICATION_XIDS   comma-separated Xids that are the application's own fault (logged only)
  HEALTH_WATCHES            comma-separated health watches that count as fatal (eccDoubleBit, rowRemapFailure, rowRemapPending)
  HEALTH_CONDITION_TYPE     the node condition written (default nvidia.com/GPUHealthy)
  HEALTH_TAINT              KEY:EFFECT of the taint put on while the condition is False (empty: none)
  HEALTH_SOURCE             where the GPUs are read: nvml, dcgm-exporter, or auto (default: NVML in a cgo build, the
                            DCGM exporter in a static one)
  HEALTH_DCGM_EXPORTER_URL  the /metrics of this node's DCGM exporter (the dcgm-exporter source)`

// healthCommand is `validator health`, the node GPU health agent.
func healthCommand(out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "Watch this node's GPUs (through NVML or the node's DCGM exporter) and write their health, judged by the chart's policy, as a node condition (and optional taint)",
		Long: "Watch this node's GPUs and write their health, judged by the chart's policy, as a node condition (and " +
			"optional taint). Through NVML (a cgo build) it probes the GPUs afresh on start, so a condition left False " +
			"before a GPU reset or a reboot is cleared by a healthy probe. Through the node's DCGM exporter (any build) " +
			"it scrapes the exporter's Xid counts and health gauges; a fatal Xid stays latched until the node's boot " +
			"ID changes, and an exporter that does not answer turns the condition Unknown, never True. A static " +
			"build (CGO_ENABLED=0) without the exporter's URL cannot read the GPUs: it sets the condition Unknown " +
			"and exits non-zero.\n\n" + healthEnvHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := HealthOptionsFromEnv(os.Getenv)
			if err != nil {
				return err
			}
			if o.NodeName != "" {
				if o.Client, err = inCluster(); err != nil {
					return fmt.Errorf("health: no API access: %w", err)
				}
			}
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context(), out)
		},
	}
}

// HealthOptionsFromEnv reads the GPU health agent's Options from an environment (os.Getenv; a harness that runs
// the agent in-process passes its pod's), naming the variable that cannot be parsed.
func HealthOptionsFromEnv(getenv func(string) string) (gpuhealth.Options, error) {
	o := gpuhealth.Options{
		NodeName:         getenv("NODE_NAME"),
		HostRoot:         getenv("HOST_ROOT"),
		DriverInstallDir: getenv("DRIVER_INSTALL_DIR"),
		Source:           getenv("HEALTH_SOURCE"),
		ExporterURL:      getenv("HEALTH_DCGM_EXPORTER_URL"),
	}
	o.Policy.ConditionType = corev1.NodeConditionType(getenv("HEALTH_CONDITION_TYPE"))
	var err error
	if o.Policy.Fatal, err = gpuhealth.ParseXids(getenv("HEALTH_FATAL_XIDS")); err != nil {
		return o, fmt.Errorf("HEALTH_FATAL_XIDS: %w", err)
	}
	if o.Policy.Application, err = gpuhealth.ParseXids(getenv("HEALTH_APPLICATION_XIDS")); err != nil {
		return o, fmt.Errorf("HEALTH_APPLICATION_XIDS: %w", err)
	}
	for w := range strings.SplitSeq(getenv("HEALTH_WATCHES"), ",") {
		if w = strings.TrimSpace(w); w != "" {
			o.Policy.Watches = append(o.Policy.Watches, w)
		}
	}
	if o.Policy.Taint, err = gpuhealth.ParseTaint(getenv("HEALTH_TAINT")); err != nil {
		return o, fmt.Errorf("HEALTH_TAINT: %w", err)
	}
	return o, nil
}

// fromEnv reads a component's Options from the environment, naming the variable that cannot be parsed.
func fromEnv(component, dir string) (validation.Options, error) {
	o := validation.Options{
		Component:                component,
		NodeName:                 os.Getenv("NODE_NAME"),
		OutputDir:                dir,
		HostRoot:                 os.Getenv("HOST_ROOT"),
		DriverInstallDir:         os.Getenv("DRIVER_INSTALL_DIR"),
		DriverInstallDirHostPath: os.Getenv("DRIVER_INSTALL_DIR_HOST_PATH"),
		DevCharDir:               os.Getenv("DEV_CHAR_DIR"),
		MIGStrategy:              os.Getenv("MIG_STRATEGY"),
		Namespace:                os.Getenv("OPERATOR_NAMESPACE"),
		WorkloadImage:            os.Getenv("CUDA_WORKLOAD_IMAGE"),
		WorkloadCommand:          strings.Fields(os.Getenv("CUDA_WORKLOAD_COMMAND")),
		PullPolicy:               os.Getenv("VALIDATOR_IMAGE_PULL_POLICY"),
		RuntimeClass:             os.Getenv("VALIDATOR_RUNTIME_CLASS"),
		WorkloadServiceAccount:   os.Getenv("VALIDATOR_WORKLOAD_SERVICE_ACCOUNT"),
		DefaultWorkloadConfig:    os.Getenv("DEFAULT_GPU_WORKLOAD_CONFIG"),
	}
	for s := range strings.SplitSeq(os.Getenv("VALIDATOR_IMAGE_PULL_SECRETS"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.PullSecrets = append(o.PullSecrets, s)
		}
	}
	var err error
	for name, dst := range map[string]*bool{
		"WITH_WAIT": &o.WithWait, "WITH_WORKLOAD": &o.WithWorkload, "DRIVER_VALIDATION_SKIP_GPU_INIT": &o.SkipGPUInit,
		"DISABLE_DEV_CHAR_SYMLINK_CREATION": &o.DisableDevCharSymlinks, "METRICS_SECURE": &o.MetricsSecure,
	} {
		if *dst, err = envBool(name); err != nil {
			return o, err
		}
	}
	for name, dst := range map[string]*time.Duration{
		"SLEEP_INTERVAL_SECONDS": &o.SleepInterval, "WORKLOAD_TIMEOUT_SECONDS": &o.Timeout,
	} {
		if *dst, err = envSeconds(name); err != nil {
			return o, err
		}
	}
	if sel := os.Getenv("DRA_NODE_SELECTOR"); sel != "" {
		o.DRANodes = &corev1.NodeSelector{}
		if err := json.Unmarshal([]byte(sel), o.DRANodes); err != nil || len(o.DRANodes.NodeSelectorTerms) == 0 {
			return o, fmt.Errorf("DRA_NODE_SELECTOR=%q: want a node selector as JSON, {\"nodeSelectorTerms\": [...]}", sel)
		}
	}
	if port := os.Getenv("METRICS_PORT"); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return o, fmt.Errorf("METRICS_PORT=%q: want a port number", port)
		}
		o.MetricsAddr = ":" + port
	}
	return o, nil
}

func envBool(name string) (bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return b, nil
}

func envSeconds(name string) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want a positive number of seconds", name, v)
	}
	return time.Duration(n) * time.Second, nil
}

func inCluster() (kubernetes.Interface, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}
