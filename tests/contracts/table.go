package contracts

import (
	"regexp"
	"slices"
)

// vars builds an Env map of optional vars.
func vars(names ...string) map[string]EnvVar {
	m := map[string]EnvVar{}
	for _, n := range names {
		m[n] = EnvVar{}
	}
	return m
}

// with returns m with the given entries set.
func with(m map[string]EnvVar, set map[string]EnvVar) map[string]EnvVar {
	for k, v := range set {
		m[k] = v
	}
	return m
}

const (
	busybox = "/bin/sh (busybox-static, applets under /busybox on PATH)"
	distro  = "/bin/bash and /bin/sh with the distribution's tools"
)

// driverHostPaths are the host paths the driver container's nvidia-driver script uses (gpu-driver-container
// ubuntu24.04/nvidia-driver, rhel9/nvidia-driver at 06a208c): `init` installs and runs the driver, the other
// subcommands (reload_nvidia_peermem in the peermem sidecar) need only the shared /run/nvidia.
var driverHostPaths = []HostPath{
	// RUN_DIR=/run/nvidia: the pid file and the driver root /run/nvidia/driver it installs into and shares.
	{Container: "/run/nvidia", Host: "/run/nvidia", Why: "RUN_DIR: pid file and the shared driver root /run/nvidia/driver"},
	// _load_driver: fw_path_config_file="/sys/module/firmware_class/parameters/path".
	{Subcommand: "init", Container: "/sys/module/firmware_class/parameters/path", Host: "/sys/module/firmware_class/parameters/path", Why: "points the kernel's firmware search at the driver root's firmware"},
	// GPU Operator assets/state-driver/0500_daemonset.yaml mounts the directory /sys/devices/system since v26.7.0
	// (v26.3.0 to v26.3.3 mounted the file memory/auto_online_blocks); that file is absent on kernels without memory
	// hotplug, so a file mount fails there.
	{Subcommand: "init", Container: "/sys/devices/system", Host: "/sys/devices/system", Why: "memory onlining for coherent-memory GPUs; mount the directory, the file auto_online_blocks is absent without memory hotplug"},
	// _start_daemons/_shutdown: /var/run/nvidia-fabricmanager/*.pid and /var/run/nvidia-topologyd/*.pid.
	{Subcommand: "init", Container: "/run/nvidia-fabricmanager", Host: "/run/nvidia-fabricmanager", Why: "Fabric Manager pid and state, shared with the host"},
	{Subcommand: "init", Container: "/run/nvidia-topologyd", Host: "/run/nvidia-topologyd", Why: "nvidia-topologyd pid (vGPU)"},
	// _gpu_direct_rdma_enabled / init: waits for /run/mellanox/drivers/.driver-ready (MOFED container).
	{Subcommand: "init", Container: "/run/mellanox/drivers", Host: "/run/mellanox/drivers", When: "GPU_DIRECT_RDMA_ENABLED", Why: "waits for the MOFED driver's .driver-ready"},
	// _link_ofa_kernel: links /run/mellanox/drivers/usr/src/ofa_kernel into /usr/src to build nvidia-peermem. With a
	// host MOFED those sources are the host's /usr/src (GPU Operator: mlnx-ofed-usr-src -> /usr/src when
	// useHostMofed).
	{Subcommand: "init", Container: "/run/mellanox/drivers/usr/src", Host: "/usr/src", When: "USE_HOST_MOFED", Why: "host MOFED's ofa_kernel sources for nvidia-peermem"},
}

// proxyEnv are the proxy variables of the driver container's package downloads (apt, dnf, zypper and curl read
// them while the driver builds; the chart sets them from global.proxy, as the GPU Operator does from the OpenShift
// cluster Proxy).
var proxyEnv = []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"}

// driverVars is vars with the proxy variables.
func driverVars(names ...string) map[string]EnvVar { return vars(append(names, proxyEnv...)...) }

// driverFiles are the files the driver container waits for.
var driverFiles = []File{
	// init, GPU_DIRECT_RDMA_ENABLED: `until ... [ -f /run/nvidia/validations/.driver-ctr-ready ]`.
	{Path: "/run/nvidia/validations/.driver-ctr-ready", Format: "presence; lines GDRCOPY_ENABLED, GDS_ENABLED, GPU_DIRECT_RDMA_ENABLED: KEY=VALUE from this chart's startup probe, `KEY: value` (YAML) from a GPU Operator driver's (a takeover); every reader here takes both", From: "the driver container's startup probe", When: "GPU_DIRECT_RDMA_ENABLED"},
}

// Table is the contract table: one row per third-party image repository and tag family the chart renders.
var Table = []Contract{
	{
		Repository: "nvidia/driver",
		Tags:       regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+-ubuntu(22|24)\.04$`),
		Source:     "github.com/NVIDIA/gpu-driver-container@06a208c ubuntu24.04/ ubuntu22.04/",
		// ubuntu24.04/Dockerfile: COPY nvidia-driver /usr/local/bin; ENTRYPOINT ["nvidia-driver", "init"]; no USER.
		Entrypoint: []string{"nvidia-driver", "init"},
		Binaries:   []string{"/usr/local/bin/nvidia-driver"},
		Shell:      distro,
		User:       "0",
		NeedsRoot:  true,
		// ubuntu24.04/nvidia-driver: DRIVER_VERSION and TARGETARCH are required (${VAR:?}) and come from the image's
		// ENV; the rest are optional.
		Env: with(driverVars("GPU_DIRECT_RDMA_ENABLED", "USE_HOST_MOFED", "KERNEL_MODULE_TYPE", "UBUNTU_PRO_TOKEN",
			"DRIVER_CONFIG_DIGEST", "NVFM_CONFIG_FABRIC_MODE", "DRIVER_TYPE", "DRIVER_BRANCH", "VGPU_LICENSE_SERVER_TYPE",
			"DISABLE_VGPU_VERSION_CHECK"), map[string]EnvVar{"DRIVER_VERSION": {}, "TARGETARCH": {}}),
		ReadsFiles: driverFiles,
		HostPaths:  driverHostPaths,
		// no kubectl, client or token read anywhere under ubuntu*/ rhel9/ vgpu-manager/ (only tests/scripts use kubectl)
		NoAPI:      true,
		Unverified: "the repository tags no driver versions: facts from the default branch at 06a208c (2026-08-17), which the 570/595 images may predate",
	},
	{
		Repository: "nvidia/driver",
		Tags:       regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+-rhel9$`),
		Source:     "github.com/NVIDIA/gpu-driver-container@06a208c rhel9/",
		// rhel9/Dockerfile: COPY nvidia-driver, common.sh /usr/local/bin; ENTRYPOINT ["nvidia-driver", "init"].
		Entrypoint: []string{"nvidia-driver", "init"},
		Binaries:   []string{"/usr/local/bin/nvidia-driver", "/usr/local/bin/common.sh"},
		Shell:      distro,
		User:       "0",
		NeedsRoot:  true,
		// rhel9/nvidia-driver and rhel9/common.sh (GDS_ENABLED, GDRCOPY_ENABLED: wait for the sidecars' modules).
		Env: with(driverVars("GPU_DIRECT_RDMA_ENABLED", "USE_HOST_MOFED", "KERNEL_MODULE_TYPE", "DRIVER_CONFIG_DIGEST",
			"NVFM_CONFIG_FABRIC_MODE", "DRIVER_TYPE", "DRIVER_BRANCH", "VGPU_LICENSE_SERVER_TYPE", "DISABLE_VGPU_VERSION_CHECK",
			"GDS_ENABLED", "GDRCOPY_ENABLED", "OPENSHIFT_VERSION", "RHEL_VERSION"), map[string]EnvVar{"DRIVER_VERSION": {}, "TARGETARCH": {}}),
		ReadsFiles: driverFiles,
		HostPaths:  driverHostPaths,
		// no kubectl, client or token read anywhere under ubuntu*/ rhel9/ vgpu-manager/ (only tests/scripts use kubectl)
		NoAPI:      true,
		Unverified: "the repository tags no driver versions: facts from the default branch at 06a208c (2026-08-17)",
	},
	{
		Repository: "nvidia/driver",
		Tags:       regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+-rhcos4\.[0-9]+$`),
		Source:     "github.com/NVIDIA/gpu-driver-container@06a208c rhel9/ (the rhcos4.x images are built from it)",
		// rhel9/Dockerfile: COPY nvidia-driver, common.sh, ocp_dtk_entrypoint /usr/local/bin; ENTRYPOINT
		// ["nvidia-driver", "init"]. With the Driver Toolkit the GPU Operator runs `ocp_dtk_entrypoint
		// nv-ctr-run-with-dtk` instead: it copies its installer and ocp_dtk_entrypoint into
		// /mnt/shared-nvidia-driver-toolkit, writes dir_prepared, waits for the DTK side container's build and loads it.
		Entrypoint: []string{"nvidia-driver", "init"},
		Binaries:   []string{"/usr/local/bin/nvidia-driver", "/usr/local/bin/common.sh", "/usr/local/bin/ocp_dtk_entrypoint"},
		Shell:      distro,
		User:       "0",
		NeedsRoot:  true,
		// rhel9/nvidia-driver, common.sh as the rhel9 row; rhel9/ocp_dtk_entrypoint reads RHCOS_VERSION and
		// RHCOS_IMAGE_MISSING; dnf and curl in the build read the proxy variables (the GPU Operator sets them from the
		// OpenShift cluster Proxy).
		Env: with(driverVars("GPU_DIRECT_RDMA_ENABLED", "USE_HOST_MOFED", "KERNEL_MODULE_TYPE", "DRIVER_CONFIG_DIGEST",
			"NVFM_CONFIG_FABRIC_MODE", "DRIVER_TYPE", "DRIVER_BRANCH", "VGPU_LICENSE_SERVER_TYPE", "DISABLE_VGPU_VERSION_CHECK",
			"GDS_ENABLED", "GDRCOPY_ENABLED", "OPENSHIFT_VERSION", "RHEL_VERSION", "RHCOS_VERSION", "RHCOS_IMAGE_MISSING"),
			map[string]EnvVar{"DRIVER_VERSION": {}, "TARGETARCH": {}}),
		ReadsFiles: driverFiles,
		HostPaths:  driverHostPaths,
		// no kubectl, client or token read anywhere under rhel9/ (ocp_dtk_entrypoint included)
		NoAPI:      true,
		Unverified: "the repository tags no driver versions: facts from the default branch at 06a208c; that rhcos4.x tags are built from rhel9/ and ship ocp_dtk_entrypoint, and which env ocp_dtk_entrypoint reads, are taken from the GPU Operator's DTK transform and not re-read at that commit",
	},
	{
		// The OpenShift Driver Toolkit, the cluster's driver-toolkit ImageStream (openshift namespace), tagged by RHCOS
		// build; the image is part of the OpenShift release payload.
		Repository: "openshift/driver-toolkit",
		Tags:       regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+$`),
		Source:     "github.com/openshift/driver-toolkit Dockerfile; GPU Operator assets/state-driver (openshift-driver-toolkit-ctr)",
		// RHEL-based with the build's kernel-devel, kernel-headers, gcc, make, elfutils and kmod; no ENTRYPOINT the chart
		// uses: the side container runs `bash -xc` and execs the ocp_dtk_entrypoint the driver container copied into
		// the shared emptyDir.
		Binaries:  []string{"/usr/bin/bash", "/usr/bin/sleep", "/mnt/shared-nvidia-driver-toolkit/ocp_dtk_entrypoint"},
		Shell:     distro,
		User:      "0",
		NeedsRoot: true,
		// ocp_dtk_entrypoint dtk-build-driver: RHCOS_VERSION (the build it runs for).
		Env:        vars("RHCOS_VERSION"),
		NoAPI:      true,
		Unverified: "the Driver Toolkit image is not pulled here; its contents are taken from the openshift/driver-toolkit Dockerfile and the GPU Operator's use of it",
	},
	{
		Repository: "nvidia/driver",
		Tags:       regexp.MustCompile(`^[0-9]+-[0-9.]+-[0-9]+-[a-z]+-ubuntu(22|24)\.04$`),
		Source:     "github.com/NVIDIA/gpu-driver-container@06a208c ubuntu22.04/precompiled/",
		// ubuntu22.04/precompiled/Dockerfile: COPY nvidia-driver /usr/local/bin; ENTRYPOINT ["nvidia-driver", "init"].
		Entrypoint: []string{"nvidia-driver", "init"},
		Binaries:   []string{"/usr/local/bin/nvidia-driver"},
		Shell:      distro,
		User:       "0",
		NeedsRoot:  true,
		// ubuntu22.04/precompiled/nvidia-driver reads no DRIVER_CONFIG_DIGEST.
		Env:        driverVars("GPU_DIRECT_RDMA_ENABLED", "USE_HOST_MOFED", "KERNEL_MODULE_TYPE", "DRIVER_BRANCH", "DRIVER_VERSION", "KERNEL_VERSION", "TARGETARCH"),
		ReadsFiles: driverFiles,
		HostPaths:  driverHostPaths,
		// no kubectl, client or token read anywhere under ubuntu*/ rhel9/ vgpu-manager/ (only tests/scripts use kubectl)
		NoAPI:      true,
		Unverified: "the repository tags no driver versions: facts from the default branch at 06a208c (2026-08-17)",
	},
	{
		Repository: "nvidia/k8s/container-toolkit",
		Tags:       regexp.MustCompile(`^v1\.20\.0$`),
		Source:     "github.com/NVIDIA/nvidia-container-toolkit@v1.20.0",
		// The real-node tier (tests/node) runs the installer and the programs it installs built from this source at
		// v1.20.0 (ci/build-toolkit.sh, with the Makefile's flags), in an image laid out as this row says, against
		// the node's real containerd 1.6 (TestToolkitConfiguresContainerd); libnvidia-container's files are
		// placeholders there, and CDI spec generation is off (it calls NVML).
		// deployments/container/Dockerfile: distroless/go + busybox; USER 0:0; binaries under /work (on PATH);
		// ENTRYPOINT ["/work/nvidia-ctk-installer"]; RUN ln -s /work/nvidia-ctk-installer /work/nvidia-toolkit.
		Entrypoint: []string{"/work/nvidia-ctk-installer"},
		// The build stage makes only cmd-nvidia-ctk-installer into /artifacts/bin -> /work. The toolkit's own
		// programs (nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime{,.cdi,.legacy},
		// nvidia-container-runtime-hook) and libnvidia-container's (nvidia-container-cli, libnvidia-container.so.1,
		// libnvidia-container-go.so.1) are its deb and rpm packages, unpacked at image build into /artifacts/deb and
		// /artifacts/rpm; the installer copies them from there (deb unless the host root has /usr/bin/rpm) into
		// ROOT/toolkit, the runtimes behind shell wrappers that exec runc directly while no nvidia module is loaded.
		Binaries:  []string{"/work/nvidia-ctk-installer", "/work/nvidia-toolkit"},
		Shell:     busybox,
		User:      "0",
		NeedsRoot: true,
		// RUNTIME_RESTART_MODE defaults to signal for containerd: SIGHUP to the pid behind RUNTIME_SOCKET, which
		// containerd (1.6 on the real node) does not handle, so it exits and its service manager starts it again;
		// the pid comes from the credentials of containerd's first message, with SO_PASSCRED set only after the
		// connect: a message sent before carries pid 0, and the SIGHUP then goes to the installer's own group;
		// RUNTIME_CONFIG_SOURCES defaults to "command,file": `chroot HOST_ROOT_MOUNT containerd config dump` first,
		// then RUNTIME_CONFIG.
		// cmd/nvidia-ctk-installer/{main.go,toolkit/toolkit.go,container/**}: cli.EnvVars sources. None is required;
		// DRIVER_ROOT_CTR_PATH defaults to /run/nvidia/driver, so a driver root mounted elsewhere needs it (the
		// chart's wrapper takes it from driver-ready).
		Env: with(vars("ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED",
			"CDI_ENABLED", "ENABLE_CDI", "CDI_KIND", "CDI_OUTPUT_DIR", "CONTAINERD_CONFIG", "CONTAINERD_RUNTIME_CLASS",
			"CONTAINERD_RUNTIME_CONFIG_OVERRIDE", "CONTAINERD_RUNTIME_TYPE", "CONTAINERD_SET_AS_DEFAULT", "CONTAINERD_SOCKET",
			"CONTAINERD_USE_LEGACY_CONFIG", "CREATE_DEVICE_NODES", "CRIO_CONFIG_MODE", "CRIO_HOOKS_DIR", "CRIO_HOOK_FILENAME",
			"DEV_ROOT", "NVIDIA_DEV_ROOT", "DEV_ROOT_CTR_PATH", "DOCKER_CONFIG", "DOCKER_RUNTIME_NAME", "DOCKER_SET_AS_DEFAULT",
			"DOCKER_SOCKET", "DRIVER_ROOT", "NVIDIA_DRIVER_ROOT", "ENABLE_NRI_PLUGIN", "HOST_ROOT_MOUNT", "NO_DAEMON",
			"NO_RUNTIME_CONFIG", "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES", "NRI_NAMESPACE", "NRI_PLUGIN_INDEX", "NRI_SOCKET",
			"NVIDIA_CONTAINER_CLI_DEBUG", "NVIDIA_CONTAINER_RUNTIME_DEBUG", "NVIDIA_CONTAINER_RUNTIME_HOOK_SKIP_MODE_DETECTION",
			"NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL", "NVIDIA_CONTAINER_RUNTIME_MODE", "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES",
			"NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", "NVIDIA_CONTAINER_RUNTIME_RUNTIMES", "NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES",
			"NVIDIA_RUNTIME_NAME", "NVIDIA_RUNTIME_SET_AS_DEFAULT", "PID_FILE", "TOOLKIT_PID_FILE", "ROOT", "TOOLKIT_INSTALL_DIR",
			"RUNTIME", "RUNTIME_CONFIG", "RUNTIME_CONFIG_OVERRIDE", "RUNTIME_CONFIG_SOURCE", "RUNTIME_CONFIG_SOURCES",
			"RUNTIME_DROP_IN_CONFIG", "RUNTIME_DROP_IN_CONFIG_HOST_PATH", "RUNTIME_ENABLE_CDI", "RUNTIME_EXECUTABLE_PATH",
			"RUNTIME_RESTART_MODE", "RUNTIME_SOCKET", "TOOLKIT_DEBUG", "TOOLKIT_PACKAGE_TYPE", "TOOLKIT_SOURCE_ROOT"),
			map[string]EnvVar{"DRIVER_ROOT_CTR_PATH": {Required: true}}),
		HostPaths: []HostPath{
			// main.go: defaultToolkitInstallDir = "/usr/local/nvidia" (ROOT); installs the runtime and hooks there.
			{Container: "/usr/local/nvidia", Why: "toolkit install dir (ROOT), referenced by the runtime config by its host path"},
			// main.go: defaultPidFile = "/run/nvidia/toolkit/toolkit.pid".
			{Container: "/run/nvidia/toolkit", Host: "/run/nvidia/toolkit", Why: "pid file other operands wait on"},
			// toolkit.go: driver-root-ctr-path; the chart's driver-ready gives /driver-root.
			{Container: "/driver-root", Why: "the driver root it generates CDI specs and hooks from"},
			// cdi-output-dir default /var/run/cdi.
			{Container: "/var/run/cdi", Host: "/var/run/cdi", Why: "management CDI specs for the runtime"},
		},
	},
	{
		Repository: "nvidia/k8s-device-plugin",
		Tags:       regexp.MustCompile(`^v0\.20\.0$`),
		Source:     "github.com/NVIDIA/k8s-device-plugin@v0.20.0",
		// The real-node tier (tests/node TestDevicePluginOnNode) runs nvidia-device-plugin, gpu-feature-discovery and
		// config-manager built from v0.18.0's source (ci/build-device-plugin.sh), in an image laid out as this row
		// says: the Go module proxy does not serve v0.20.0 (December 2026), so the gap between the two tags is not
		// run there; the env and flag facts below stay v0.20.0's, and the chart is checked against them.
		// deployments/container/Dockerfile: distroless/go + busybox, USER 0:0, the four binaries in /usr/bin,
		// ENTRYPOINT ["nvidia-device-plugin"]. The device plugin, GFD and the MPS control daemon share it.
		Entrypoint: []string{"nvidia-device-plugin"},
		Binaries:   []string{"/usr/bin/nvidia-device-plugin", "/usr/bin/gpu-feature-discovery", "/usr/bin/mps-control-daemon", "/usr/bin/config-manager"},
		Shell:      busybox,
		User:       "0",
		NeedsRoot:  true,
		// config-manager only reads its node's label and copies a ConfigMap key into a shared emptyDir.
		Rootless: []string{"config-manager"},
		// cmd/nvidia-device-plugin/main.go, cmd/gpu-feature-discovery/main.go, cmd/mps-control-daemon/main.go,
		// cmd/config-manager/main.go (ONESHOT ... PROCESS_TO_SIGNAL), internal/flags/{node,kubeclient}.go, internal/rm/health.go (os.Getenv).
		// GDS_ENABLED / MOFED_ENABLED / GDRCOPY_ENABLED make the plugin hand /dev/nvidia-fs*, /dev/infiniband and
		// /dev/gdrdrv to pods: required where the driver pool enables GDS, RDMA or GDRCopy (the test checks that).
		// internal/rm/health.go: the Xid health check is a deny list. DP_DISABLE_HEALTHCHECKS (comma-separated Xids)
		// adds to the six it always ignores (13, 31, 43, 45, 68, 109); DP_ENABLE_HEALTHCHECKS takes Xids back out of
		// that list; "all" or "xids" in DISABLE turns the check off before any event is registered, and then an ENABLE
		// list does nothing (IsAllDisabled reads only the "all" entry), so "only these Xids are fatal" cannot be said.
		// Only XidCriticalError events count: the ECC events it registers for are skipped. The chart renders both from
		// global.health.xids (tests/chart/gpuhealth_test.go reads them as this code does).
		Env: with(vars("MIG_STRATEGY", "GFD_MIG_STRATEGY", "FAIL_ON_INIT_ERROR", "GFD_FAIL_ON_INIT_ERROR", "NVIDIA_DRIVER_ROOT",
			"NVIDIA_DEV_ROOT", "PASS_DEVICE_SPECS", "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "GDRCOPY_ENABLED", "GDS_ENABLED",
			"MOFED_ENABLED", "CDI_ANNOTATION_PREFIX", "NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH", "DRIVER_ROOT_CTR_PATH",
			"CONTAINER_DRIVER_ROOT", "MPS_ROOT", "SHARED_DEVICES_ALLOCATION_POLICY", "DEVICE_DISCOVERY_STRATEGY", "IMEX_CHANNEL_IDS",
			"IMEX_REQUIRED", "KUBELET_SOCKET", "CONFIG_FILE", "GFD_CONFIG_FILE", "CDI_FEATURE_FLAGS", "CDI_DISABLE_HOOKS",
			"GFD_ONESHOT", "GFD_NO_TIMESTAMP", "GFD_SLEEP_INTERVAL", "GFD_OUTPUT_FILE", "GFD_MACHINE_TYPE_FILE",
			"GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API", "NAMESPACE", "POD_NAME", "KUBECONFIG", "KUBE_API_QPS",
			"KUBE_API_BURST", "DP_DISABLE_HEALTHCHECKS", "DP_ENABLE_HEALTHCHECKS", "DEFAULT_CONFIG", "FALLBACK_STRATEGIES",
			"NODE_LABEL", "CONFIG_FILE_SRCDIR", "CONFIG_FILE_DST", "SEND_SIGNAL", "SIGNAL", "PROCESS_TO_SIGNAL", "ONESHOT"),
			map[string]EnvVar{
				// internal/flags/node.go: NODE_NAME names the node whose NodeFeature GFD writes (config-manager: the
				// node whose label it follows).
				"NODE_NAME": {Required: true, Binaries: []string{"gpu-feature-discovery", "config-manager"}},
				// the plugin finds the driver under /driver-root unless told (driver-root-ctr-path default).
				"DRIVER_ROOT_CTR_PATH": {},
			}),
		HostPaths: []HostPath{
			// kubelet-socket default /var/lib/kubelet/device-plugins/kubelet.sock: the kubelet serves it there whatever
			// its --root-dir (the device plugin API's DevicePluginPath), on every distribution.
			{Container: "/var/lib/kubelet/device-plugins", Host: "/var/lib/kubelet/device-plugins", Binaries: []string{"nvidia-device-plugin"}, Why: "the kubelet's device-plugin socket directory"},
		},
	},
	{
		Repository: "dra-driver-nvidia/dra-driver-nvidia-gpu",
		Tags:       regexp.MustCompile(`^v0\.4\.1$`),
		Source:     "github.com/kubernetes-sigs/dra-driver-nvidia-gpu@v0.4.1 (764900e)",
		// deployments/container/Dockerfile: gcr.io/distroless/cc:debug (busybox under /busybox, on PATH) plus a
		// static /bin/bash; USER root; the binaries, scripts and nvidia-cdi-hook in /usr/bin. One image for the
		// kubelet plugins, the ComputeDomain controller and daemon, and the webhook. ENV NVIDIA_VISIBLE_DEVICES=all,
		// so every pod sets void.
		Binaries: []string{"/usr/bin/gpu-kubelet-plugin", "/usr/bin/compute-domain-kubelet-plugin",
			"/usr/bin/compute-domain-controller", "/usr/bin/compute-domain-daemon", "/usr/bin/webhook",
			"/usr/bin/nvidia-cdi-hook", "/usr/bin/kubelet-plugin-prestart.sh", "/usr/bin/bind_to_driver.sh",
			"/usr/bin/unbind_from_driver.sh"},
		Shell:     "/bin/bash (static) and /busybox/sh (busybox-static of distroless cc:debug, applets on PATH)",
		User:      "0",
		NeedsRoot: true,
		// the controller and the webhook only talk to the API server
		Rootless: []string{"compute-domain-controller", "webhook"},
		// cmd/gpu-kubelet-plugin/main.go, cmd/compute-domain-kubelet-plugin/main.go,
		// cmd/compute-domain-controller/main.go (flags with EnvVars), pkg/flags/{kubeclient,utils}.go (KUBECONFIG,
		// KUBE_API_QPS/BURST; --feature-gates as FEATURE_GATES), the chart's kubeletplugin.yaml and controller.yaml.
		Env: with(vars("HOST_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH", "CDI_ROOT", "NVIDIA_CDI_HOOK_PATH",
			"FEATURE_GATES", "KUBELET_REGISTRAR_DIRECTORY_PATH", "KUBELET_PLUGINS_DIRECTORY_PATH", "HEALTHCHECK_PORT",
			"HTTP_ENDPOINT", "METRICS_PATH", "PPROF_PATH", "MASK_NVIDIA_DRIVER_PARAMS", "ALT_PROC_DEVICES_PATH",
			"ADDITIONAL_XIDS_TO_IGNORE", "SERVICE_ACCOUNT_NAME", "IMAGE_NAME", "POD_NAME", "LOG_VERBOSITY",
			"LOG_VERBOSITY_CD_DAEMON", "CD_DAEMON_IMAGE_PULL_SECRET_NAMES", "LEADER_ELECTION_ENABLED",
			"LEADER_ELECTION_LEASE_LOCK_NAME", "LEADER_ELECTION_LEASE_LOCK_NAMESPACE", "LEADER_ELECTION_LEASE_DURATION",
			"LEADER_ELECTION_RENEW_DEADLINE", "LEADER_ELECTION_RETRY_PERIOD", "MAX_NODES_PER_IMEX_DOMAIN",
			"ADDITIONAL_NAMESPACES", "KUBECONFIG", "KUBE_API_QPS", "KUBE_API_BURST"),
			map[string]EnvVar{
				// the plugins publish their node's ResourceSlices and label their node: NODE_NAME names it; both
				// plugins and the controller work in NAMESPACE (cliques, MPS daemons, ComputeDomain daemons)
				"NODE_NAME": {Required: true, Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin"}},
				"NAMESPACE": {Required: true, Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin", "compute-domain-controller"}},
				// the controller starts ComputeDomain daemons from its own image
				"IMAGE_NAME": {Required: true, Binaries: []string{"compute-domain-controller"}},
			}),
		HostPaths: []HostPath{
			// kubeletplugin.RegistrarDirectoryPath / PluginDataDirectoryPath: <driver>-reg.sock and
			// <driver>/dra.sock, at the host paths the kubelet reads (its root varies by distribution)
			{Container: "/var/lib/kubelet/plugins_registry", Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin"}, Why: "plugin registration sockets the kubelet watches"},
			{Container: "/var/lib/kubelet/plugins", Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin"}, Why: "the DRA sockets and checkpoints (Bidirectional), and the nvidia-cdi-hook copy"},
			// CDI_ROOT: the CDI specs of prepared claims, read by the container runtime on the host
			{Container: "/var/run/cdi", Host: "/var/run/cdi", Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin"}, Why: "CDI specs of prepared devices, read by the host's container runtime"},
			// --container-driver-root default /driver-root: the driver's libraries and nvidia-smi
			{Container: "/driver-root", Binaries: []string{"gpu-kubelet-plugin", "compute-domain-kubelet-plugin"}, Why: "the driver root (NVML, nvidia-smi)"},
		},
		Unverified: "the image's ENTRYPOINT/CMD were not recorded (the chart always renders a command); whether the binaries need NODE_NAME and NAMESPACE or only use them is read from the chart, which always sets them",
	},
	{
		Repository: "nvidia/cloud-native/dcgm",
		Tags:       regexp.MustCompile(`^4\.6\.0-1-(ubuntu24\.04|ubuntu22\.04|ubi9)$`),
		Source:     "none readable: the DCGM container's Dockerfile is not in a public repository the index holds",
		User:       "0",
		Unverified: "entrypoint, user and env could not be read from source; the chart renders no command (the image's own entrypoint, nv-hostengine per the GPU Operator's assets/state-dcgm/0400_dcgm.yml) and sets no env",
		// Nothing rendered is checked against unread facts: no command (entrypoint unknown), no env.
		Entrypoint:    []string{"(image entrypoint)"},
		Binaries:      []string{"(image entrypoint)"},
		EnvUnverified: true,
	},
	{
		Repository: "nvidia/k8s/dcgm-exporter",
		Tags:       regexp.MustCompile(`^4\.6\.0-4\.8\.3-distroless$`),
		Source:     "github.com/NVIDIA/dcgm-exporter@4.5.3-4.8.2 (4.6.0-4.8.3 is not tagged in the mirror)",
		// docker/Dockerfile runtime-distroless: USER root:root; ENTRYPOINT ["/usr/bin/dcgm-exporter-entrypoint.sh"],
		// which execs /usr/bin/dcgm-exporter "$@"; /bin/sh and bash copied in. The ubuntu22.04 and ubi9 flavours
		// differ (dcgmExporterDistro).
		Entrypoint: []string{"/usr/bin/dcgm-exporter-entrypoint.sh"},
		Binaries:   []string{"/usr/bin/dcgm-exporter-entrypoint.sh", "/usr/bin/dcgm-exporter"},
		Shell:      "/bin/sh and /usr/bin/bash copied from ubuntu",
		User:       "0",
		// pkg/cmd/app.go EnvVars; internal/pkg/hostname/hostname.go and transformation/kubernetes.go read NODE_NAME.
		Env: vars("DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE", "DCGM_EXPORTER_COLLECTORS", "DCGM_EXPORTER_CONFIGMAP_DATA",
			"DCGM_EXPORTER_CPU_DEVICES_STR", "DCGM_EXPORTER_DCGM_LOG_LEVEL", "DCGM_EXPORTER_DEBUG", "DCGM_EXPORTER_DEVICES_STR",
			"DCGM_EXPORTER_DUMP_COMPRESSION", "DCGM_EXPORTER_DUMP_DIRECTORY", "DCGM_EXPORTER_DUMP_ENABLED", "DCGM_EXPORTER_DUMP_RETENTION",
			"DCGM_EXPORTER_ENABLE_DCGM_LOG", "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH", "DCGM_EXPORTER_ENABLE_PPROF",
			"DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL", "DCGM_EXPORTER_INTERVAL", "DCGM_EXPORTER_KUBERNETES",
			"DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",
			"DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX", "DCGM_EXPORTER_LISTEN", "DCGM_EXPORTER_LOG_FORMAT",
			"DCGM_EXPORTER_NO_HOSTNAME", "DCGM_EXPORTER_OTHER_DEVICES_STR", "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME",
			"DCGM_EXPORTER_SYSTEMD_SOCKET", "DCGM_EXPORTER_USE_FAKE_GPUS", "DCGM_EXPORTER_USE_OLD_NAMESPACE",
			"DCGM_EXPORTER_WEB_CONFIG_FILE", "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "DCGM_HPC_JOB_MAPPING_DIR",
			"DCGM_POD_RESOURCES_KUBELET_SOCKET", "DCGM_REMOTE_HOSTENGINE_INFO", "DISABLE_STARTUP_VALIDATE", "KUBERNETES_ENABLE_DRA",
			"KUBERNETES_VIRTUAL_GPUS", "NVIDIA_RESOURCE_NAMES", "NODE_NAME"),
		HostPaths: []HostPath{
			// pkg/cmd/app.go: pod-resources socket default /var/lib/kubelet/pod-resources/kubelet.sock.
			{Container: "/var/lib/kubelet/pod-resources", When: "DCGM_EXPORTER_KUBERNETES", Why: "maps GPUs to pods through the kubelet's pod-resources API"},
		},
		Unverified: "tag 4.6.0-4.8.3 is absent from the mirror; facts from 4.5.3-4.8.2, the newest tag present",
		// What the GPU health agent's dcgm-exporter source (hooks/node/gpuhealth/exporter.go) relies on, read at
		// 4.5.3-4.8.2 and the mirror's head after it (d5e5f51):
		// - internal/pkg/collector/xid_collector.go, expcollector.go: DCGM_EXP_XID_ERRORS_COUNT is exported only when
		//   the collectors CSV lists it (the image's dcp-metrics-included.csv does not; the chart's health profile
		//   does). Per GPU it is the number of DCGM_FI_DEV_XID_ERRORS samples since now minus the window
		//   (GetValuesSince), one series per xid label, with window_size_in_ms; a GPU with none has one series valued 0
		//   and no xid label. pkg/cmd/app.go: --xid-count-window-size / DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE, default
		//   300000 ms. So a count drops back to 0 one window after the Xid: the agent latches fatal Xids itself.
		// - gpu_health_collector.go: DCGM_EXP_GPU_HEALTH_STATUS per health_watch (PCIE ... DRIVER, and ALL for
		//   GPU-wide Xids such as 79) with the DCGM result as value (PASS 0, WARN 10, FAIL 20) and health_error_code.
		// - base_collector.go createMetric: labels gpu, UUID (uuid with --use-old-namespace), pci_bus_id, device,
		//   modelName, Hostname (renamed hostname at d5e5f51, after the tag). The GPU list is read once at the
		//   exporter's start (deviceinfo), so a GPU that falls off the bus keeps its series and its Xid 79 is
		//   counted; the agent does not rely on series vanishing.
	},
	{
		Repository: "nvidia/cloud-native/k8s-mig-manager",
		Tags:       regexp.MustCompile(`^v0\.15\.0$`),
		Source:     "github.com/NVIDIA/mig-parted@v0.15.0",
		// deployments/container/Dockerfile: distroless/go + busybox; USER 0:0; /usr/bin/nvidia-mig-parted,
		// /usr/bin/nvidia-mig-manager, /usr/bin/nvidia-ctk; ENTRYPOINT ["nvidia-mig-manager"].
		Entrypoint: []string{"nvidia-mig-manager"},
		Binaries:   []string{"/usr/bin/nvidia-mig-manager", "/usr/bin/nvidia-mig-parted", "/usr/bin/nvidia-ctk"},
		Shell:      busybox,
		User:       "0",
		NeedsRoot:  true,
		// cmd/nvidia-mig-manager/main.go: cli.EnvVars sources and os.Getenv.
		Env: with(vars("KUBECONFIG", "RECONFIGURE_SCRIPT", "HOST_ROOT_MOUNT", "HOST_NVIDIA_DIR", "HOST_MIG_MANAGER_STATE_FILE",
			"HOST_KUBELET_SYSTEMD_SERVICE", "GPU_CLIENTS_FILE", "WITH_REBOOT", "WITH_SHUTDOWN_HOST_GPU_CLIENTS",
			"DEFAULT_GPU_CLIENTS_NAMESPACE", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH", "CDI_ENABLED",
			"NVIDIA_DEV_ROOT", "DEV_ROOT_CTR_PATH", "NVIDIA_CDI_HOOK_PATH", "DEFAULT_CONFIG_FILE"),
			map[string]EnvVar{
				// validateFlags: "invalid -n <node-name> flag: must not be empty string".
				"NODE_NAME": {Required: true},
				// createNodeConfigMap: without POD_NAMESPACE/POD_NAME the config it generated from the hardware (the
				// path taken when CONFIG_FILE is unset) is not published as the node's ConfigMap; setupMigConfig
				// only warns ("Failed to create node ConfigMap") and goes on with it, so they are optional.
				"POD_NAME":      {},
				"POD_NAMESPACE": {},
				// setupMigConfig: a set CONFIG_FILE is used as is and no config is generated from the hardware; it is
				// how an admin's named config is given (the GPU Operator sets it only with one; the chart too, with
				// migManager.config.name). DEFAULT_CONFIG_FILE is the fallback for hardware it cannot profile.
				"CONFIG_FILE": {},
			}),
		HostPaths: []HostPath{
			// DefaultHostRootMount = "/host": reboots, host GPU clients, systemd state.
			{Container: "/host", Host: "/", Why: "host root for host GPU clients and systemd state"},
			// DefaultDriverRootCtrPath = "/run/nvidia/driver" unless DRIVER_ROOT_CTR_PATH says otherwise.
			{Container: "/driver-root", Why: "the driver root (chart's driver-ready gives /driver-root)"},
		},
	},
	{
		Repository: "nvidia/cloud-native/k8s-driver-manager",
		Tags:       regexp.MustCompile(`^v0\.12\.0$`),
		Source:     "github.com/NVIDIA/k8s-driver-manager@v0.12.0",
		// deployments/container/Dockerfile.distroless: distroless/cc + busybox (/bin/sh link), USER 0:0,
		// COPY vfio-manage, driver-manager /usr/bin; ENTRYPOINT ["driver-manager", "preflight_check"].
		Entrypoint: []string{"driver-manager", "preflight_check"},
		Binaries:   []string{"/usr/bin/driver-manager", "/usr/bin/vfio-manage"},
		Shell:      busybox,
		User:       "0",
		NeedsRoot:  true,
		// cmd/vfio-manage/bind.go: HOST_ROOT (default "/", used when loading vfio-pci), BIND_NVSWITCHES.
		Env: vars("HOST_ROOT", "BIND_NVSWITCHES"),
		HostPaths: []HostPath{
			// vfio-manage binds through sysfs (/sys/bus/pci) and loads vfio-pci from HOST_ROOT's /lib/modules.
			{Container: "/sys", Host: "/sys", Why: "PCI driver binding through sysfs"},
		},
		// cmd/vfio-manage imports no Kubernetes client (only cmd/driver-manager uses internal/kubernetes).
		NoAPI:      true,
		Unverified: "driver-manager's own env (the k8s driver manager binary) is not listed: the chart runs only vfio-manage from this image",
	},
	{
		Repository: "nvidia/cloud-native/vgpu-device-manager",
		Tags:       regexp.MustCompile(`^v0\.5\.0$`),
		Source:     "github.com/NVIDIA/vgpu-device-manager@v0.5.0",
		// deployments/container/Dockerfile.distroless: distroless/go + busybox, USER 0:0, /usr/bin/nvidia-vgpu-dm,
		// /usr/bin/nvidia-k8s-vgpu-dm, /usr/bin/nvidia-mig-parted; ENTRYPOINT ["nvidia-k8s-vgpu-dm"].
		Entrypoint: []string{"nvidia-k8s-vgpu-dm"},
		Binaries:   []string{"/usr/bin/nvidia-k8s-vgpu-dm", "/usr/bin/nvidia-vgpu-dm", "/usr/bin/nvidia-mig-parted"},
		Shell:      busybox,
		User:       "0",
		NeedsRoot:  true,
		// cmd/nvidia-k8s-vgpu-dm/main.go: EnvVars; validateFlags rejects an empty node name, namespace, config file
		// and default vGPU config.
		Env: with(vars("KUBECONFIG", "HOST_ROOT_MOUNT", "HOST_MIG_MANAGER_STATE_FILE", "HOST_KUBELET_SYSTEMD_SERVICE",
			"DRIVER_ROOT_CTR_PATH", "GPU_CLIENTS_FILE", "WITH_REBOOT", "WITH_SHUTDOWN_HOST_GPU_CLIENTS", "VGPU_DM_CONFIG_FILE",
			"VGPU_DM_DEBUG", "VGPU_DM_SELECTED_CONFIG", "VGPU_DM_VALID_CONFIG"),
			map[string]EnvVar{"NODE_NAME": {Required: true}, "NAMESPACE": {Required: true}, "CONFIG_FILE": {Required: true},
				"DEFAULT_VGPU_CONFIG": {Required: true}}),
		HostPaths: []HostPath{
			// defaultHostRootMount = "/host"; defaultDriverRootCtrPath = "/driver-root".
			{Container: "/host", Host: "/", Why: "host root for host GPU clients and systemd state"},
			{Container: "/driver-root", Why: "the driver root it loads NVML from"},
			// internal/nvlib uses the vendored go-nvlib nvpci/nvmdev: PCIDevicesRoot = "/sys/bus/pci/devices".
			{Container: "/sys", Host: "/sys", Why: "mdev and SR-IOV vGPU devices under /sys/bus/pci/devices"},
		},
	},
	{
		Repository: "nvidia/kubevirt-gpu-device-plugin",
		Tags:       regexp.MustCompile(`^v1\.6\.0$`),
		Source:     "github.com/NVIDIA/kubevirt-gpu-device-plugin@v1.6.0",
		// deployments/container/Dockerfile.distroless: distroless/go (no shell), USER 0:0,
		// COPY nvidia-kubevirt-gpu-device-plugin /usr/bin/; CMD ["nvidia-kubevirt-gpu-device-plugin"].
		Cmd:       []string{"nvidia-kubevirt-gpu-device-plugin"},
		Binaries:  []string{"/usr/bin/nvidia-kubevirt-gpu-device-plugin"},
		User:      "0",
		NeedsRoot: true,
		// no os.Getenv or flag in the non-vendored code.
		Env: vars(),
		HostPaths: []HostPath{
			// pkg/device_plugin/generic_device_plugin.go: vfioDevicePath = "/dev/vfio", only watched (fsnotify on
			// /dev/vfio/<group>) and named in the kubelet's DeviceSpecs: no open, create or write there (commit d26f237).
			{Container: "/dev/vfio", Host: "/dev/vfio", Why: "VFIO group devices it names to the kubelet for VMs (watched, never written)"},
			{Container: "/var/lib/kubelet/device-plugins", Host: "/var/lib/kubelet/device-plugins", Why: "the kubelet's device-plugin socket directory (where the kubelet serves it whatever its root)"},
		},
	},
	{
		Repository: "nvidia/cloud-native/nvidia-sandbox-device-plugin",
		Tags:       regexp.MustCompile(`^v0\.0\.5$`),
		Source:     "github.com/NVIDIA/sandbox-device-plugin Dockerfile at 054a9fb (the index holds no v0.0.5 tag)",
		// Dockerfile: distroless/go + busybox (/bin/sh), USER 0:0, /usr/bin/nvidia-sandbox-device-plugin and
		// /usr/bin/gpu-feature-discovery; ENTRYPOINT ["/usr/bin/nvidia-sandbox-device-plugin"].
		Entrypoint:    []string{"/usr/bin/nvidia-sandbox-device-plugin"},
		Binaries:      []string{"/usr/bin/nvidia-sandbox-device-plugin", "/usr/bin/gpu-feature-discovery"},
		Shell:         busybox,
		User:          "0",
		NeedsRoot:     true,
		EnvUnverified: true,
		HostPaths: []HostPath{
			{Container: "/var/lib/kubelet/device-plugins", Host: "/var/lib/kubelet/device-plugins", Why: "the kubelet's device-plugin socket directory (where the kubelet serves it whatever its root)"},
		},
		Unverified: "tag v0.0.5 not found in the index (Dockerfile read at commit 054a9fb); the env it reads (the chart sets NODE_NAME, POD_NAMESPACE, POD_SERVICE_ACCOUNT) was not read from its source",
	},
	{
		Repository: "nvidia/cloud-native/k8s-cc-manager",
		Tags:       regexp.MustCompile(`^v0\.4\.3$`),
		Source:     "github.com/NVIDIA/k8s-cc-manager@v0.4.3",
		// deployments/container/Dockerfile.distroless: distroless/python, COPY main.py gpu_operator_eviction.py /app/,
		// USER 0:0, ENTRYPOINT ["python3", "/app/main.py"]. No k8s-cc-manager executable exists.
		Entrypoint: []string{"python3", "/app/main.py"},
		Binaries:   []string{"python3", "/app/main.py"},
		User:       "0",
		NeedsRoot:  true,
		// main.py: os.environ.get.
		Env: with(vars("KUBECONFIG", "DEFAULT_CC_MODE", "CC_READINESS_FILE", "EVICT_OPERATOR_COMPONENTS"), map[string]EnvVar{
			// "NODE_NAME environment variable must be set for k8s-cc-manager" (exit 1).
			"NODE_NAME": {Required: true},
			// the namespace whose operand pods it evicts; defaults to gpu-operator, wrong in any other namespace.
			"OPERATOR_NAMESPACE": {Required: true},
		}),
		HostPaths: []HostPath{
			// READINESS_FILE default /run/nvidia/validations/.cc-manager-ctr-ready: it writes it once the CC mode is
			// applied, for the sandbox validator.
			{Container: "/run/nvidia/validations", Host: "/run/nvidia/validations", Why: "writes .cc-manager-ctr-ready for the sandbox validator"},
			// is_host_cc_enabled: /sys/module/kvm_intel/parameters/tdx, /sys/module/kvm_amd/parameters/sev_snp.
			{Container: "/sys", Host: "/sys", Why: "host CC capability and GPU PCI config"},
		},
	},
	{
		Repository: "nvidia/cloud-native/nvidia-fs",
		// rhcos4.x tags: the GPU Operator appends the node's OS tag on OpenShift too; same contents as rhel9.
		Tags:       regexp.MustCompile(`^2\.29\.4-(ubuntu22\.04|ubuntu24\.04|rhel9|rhel8|rhcos4\.[0-9]+)$`),
		Source:     "none readable: github.com/NVIDIA/gds-nvidia-fs holds the module source only (tags up to v2.28.4), not the container",
		Entrypoint: []string{"(image entrypoint)"},
		// GPU Operator assets/state-driver/0500_daemonset.yaml (v26.3.3): `bash -xc "... exec nvidia-gds-driver install"`.
		Binaries:      []string{"nvidia-gds-driver"},
		Shell:         "unverified: a distribution base (the GPU Operator runs its wrapper with bash -xc in it)",
		User:          "0",
		NeedsRoot:     true,
		EnvUnverified: true,
		HostPaths: []HostPath{
			// builds against the driver sources the driver container exposes under /run/nvidia/driver/usr/src.
			{Container: "/run/nvidia", Host: "/run/nvidia", Why: "the driver root with the NVIDIA kernel sources"},
		},
		Unverified: "the container's Dockerfile and script are not public: the binary name comes from the GPU Operator's driver DaemonSet asset, the env it reads is unknown",
	},
	{
		Repository: "nvidia/cloud-native/gdrdrv",
		// rhcos4.x tags: the GPU Operator appends the node's OS tag on OpenShift too; same contents as rhel9.
		Tags:       regexp.MustCompile(`^v2\.6-(ubuntu22\.04|ubuntu24\.04|rhel9|rhel8|rhcos4\.[0-9]+)$`),
		Source:     "none readable: github.com/NVIDIA/gdrcopy@v2.6 holds the library and module, not the container",
		Entrypoint: []string{"(image entrypoint)"},
		// GPU Operator assets/state-driver/0500_daemonset.yaml (v26.3.3): `exec nvidia-gdrcopy-driver install`.
		Binaries:      []string{"nvidia-gdrcopy-driver"},
		Shell:         "unverified: a distribution base (the GPU Operator runs its wrapper with bash -xc in it)",
		User:          "0",
		NeedsRoot:     true,
		EnvUnverified: true,
		HostPaths: []HostPath{
			{Container: "/run/nvidia", Host: "/run/nvidia", Why: "the driver root with the NVIDIA kernel sources"},
		},
		Unverified: "the container's Dockerfile and script are not public: the binary name comes from the GPU Operator's driver DaemonSet asset, the env it reads is unknown",
	},
	{
		Repository: "nvidia/k8s/cuda-sample",
		Tags:       regexp.MustCompile(`^vectoradd-cuda[0-9.]+-(ubuntu22\.04|ubuntu24\.04|ubi9)$`),
		Source:     "github.com/NVIDIA/k8s-samples deployments/container/Dockerfile at its default branch (the mirror tags no vectoradd build)",
		// deployments/container/Dockerfile: CUDA base (ubuntu22.04), no USER; COPY the sample to
		// /cuda-samples/${SAMPLE_NAME}, ln -s it to /cuda-samples/sample; ENTRYPOINT ["/cuda-samples/sample"].
		Entrypoint: []string{"/cuda-samples/sample"},
		Binaries:   []string{"/cuda-samples/vectorAdd", "/cuda-samples/sample"},
		Shell:      distro,
		User:       "0",
		Env:        vars(),
		Unverified: "the vectoradd-cuda12.5.0 build predates the Dockerfile read (default branch, CUDA 13 base); the validator launches it as a workload, so no rendered container runs it",
	},
	{
		Repository: "nfd/node-feature-discovery",
		Tags:       regexp.MustCompile(`^v0\.19\.0(-minimal)?$`),
		Source:     "github.com/kubernetes-sigs/node-feature-discovery@v0.19.0",
		// The real-node tier (tests/node) runs nfd-master, nfd-worker and nfd-gc built from this source at v0.19.0
		// (ci/build-nfd.sh, with the Makefile's ldflags), in an image laid out as this row says.
		// Dockerfile minimal stage: scratch, USER 65534:65534, nfd-master, nfd-worker, nfd-topology-updater, nfd-gc,
		// kubectl-nfd, nfd in /usr/bin; no ENTRYPOINT (the deployment names the binary).
		Binaries: []string{"/usr/bin/nfd-master", "/usr/bin/nfd-worker", "/usr/bin/nfd-topology-updater", "/usr/bin/nfd-gc", "/usr/bin/kubectl-nfd", "/usr/bin/nfd"},
		User:     "65534",
		// pkg/utils/kubernetes.go (NODE_NAME, KUBERNETES_NAMESPACE), pkg/nfd-worker/nfd-worker.go (POD_NAME, POD_UID),
		// cmd/nfd-topology-updater/main.go (NODE_ADDRESS).
		Env: with(vars("KUBERNETES_NAMESPACE", "POD_NAME", "POD_UID", "NODE_ADDRESS"), map[string]EnvVar{
			// nfd-worker.go resolveNodeOwnerReference: "cannot resolve Node owner reference: NODE_NAME not specified".
			"NODE_NAME": {Required: true, Binaries: []string{"nfd-worker", "nfd-topology-updater"}},
		}),
		HostPaths: []HostPath{
			// pkg/utils/hostpath: the worker reads the host's sysfs and os-release under /host-*: the image's build
			// sets that prefix (Makefile, Dockerfile: -X .../pkg/utils/hostpath.pathPrefix=/host-; the source's
			// default is /).
			{Container: "/host-sys", Host: "/sys", Binaries: []string{"nfd-worker"}, Why: "PCI and kernel features (worker)"},
			{Container: "/host-etc/os-release", Host: "/etc/os-release", Binaries: []string{"nfd-worker"}, Why: "system-os_release labels the driver pools select on (worker)"},
		},
	},
}

// dcgmExporterDistro is the DCGM exporter's ubuntu22.04 and ubi9 flavours (docker/Dockerfile runtime-ubuntu and
// runtime-ubi on cuda base images, USER root): the same binary and environment as the distroless row, but the
// entrypoint script is /usr/local/dcgm/dcgm-exporter-entrypoint.sh, and the distro's shell and tools are there.
func dcgmExporterDistro() Contract {
	i := slices.IndexFunc(Table, func(c Contract) bool { return c.Repository == "nvidia/k8s/dcgm-exporter" })
	c := Table[i]
	c.Tags = regexp.MustCompile(`^4\.6\.0-4\.8\.3-(ubuntu22\.04|ubi9)$`)
	c.Entrypoint = []string{"/usr/local/dcgm/dcgm-exporter-entrypoint.sh"}
	c.Binaries = []string{"/usr/local/dcgm/dcgm-exporter-entrypoint.sh", "/usr/bin/dcgm-exporter"}
	c.Shell = distro
	return c
}

func init() { Table = append(Table, dcgmExporterDistro()) }
