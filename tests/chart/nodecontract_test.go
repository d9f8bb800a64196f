package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// What the rendered pods promise the images and hosts they run on, checked against the images' upstream sources
// (named per test) and real hosts: the facts kwok nodes cannot show.

func profileFile(name string) string {
	return filepath.Join(chartrender.RepoRoot(), "values", name+".yaml")
}

func containerNamed(t *testing.T, ds *appsv1.DaemonSet, name string) corev1.Container {
	t.Helper()
	spec := ds.Spec.Template.Spec
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("DaemonSet %s has no container %s", ds.Name, name)
	return corev1.Container{}
}

func envVar(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// decodeNamed decodes the rendered object of kind and name into T.
func decodeNamed[T any](t *testing.T, stream, kind, name string) *T {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() == kind && o.name() == name {
			b, err := yaml.Marshal(o.Raw)
			if err != nil {
				t.Fatal(err)
			}
			var out T
			if err := yaml.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return &out
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// TestCCManagerRunsTheImageEntrypoint: k8s-cc-manager v0.4.3 (deployments/container/Dockerfile.distroless) is
// ENTRYPOINT ["python3", "/app/main.py"] and has no k8s-cc-manager binary; it reads OPERATOR_NAMESPACE
// (main.py, default gpu-operator) and lists pods there while it evicts the sandbox operands
// (gpu_operator_eviction.py list_namespaced_pod), which needs a namespaced pods Role.
func TestCCManagerRunsTheImageEntrypoint(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("confidential")})
	ds := daemonSet(t, stream, "nvidia-cc-manager")
	c := containerNamed(t, ds, "nvidia-cc-manager")
	if len(c.Command) > 0 || len(c.Args) > 0 {
		t.Errorf("cc-manager overrides the image's entrypoint with command %q args %q", c.Command, c.Args)
	}
	if e, ok := envVar(c, "OPERATOR_NAMESPACE"); !ok || e.Value != chartrender.Namespace {
		t.Errorf("OPERATOR_NAMESPACE = %+v; want the release namespace %s (the operands' pods live there)", e, chartrender.Namespace)
	}
	role := decodeNamed[rbacv1.Role](t, stream, "Role", "nvidia-cc-manager")
	if !allows(role.Rules, "", "pods", "list") {
		t.Errorf("Role nvidia-cc-manager does not let it list pods: %+v", role.Rules)
	}
	binding := decodeNamed[rbacv1.RoleBinding](t, stream, "RoleBinding", "nvidia-cc-manager")
	if binding.RoleRef.Name != "nvidia-cc-manager" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("RoleBinding nvidia-cc-manager does not bind the Role to the pod's ServiceAccount: %+v", binding)
	}
}

// TestDriverMountsExistOnEveryKernel: a hostPath to /sys/devices/system/memory/auto_online_blocks keeps the driver
// pod from starting on kernels without memory hotplug (the file is absent); the directory /sys/devices/system
// always exists, and the driver image writes below it.
func TestDriverMountsExistOnEveryKernel(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"container-only", "driver-pools"} {
		stream := render(t, newestKube, []string{profileFile(p)})
		for _, o := range objects(t, stream) {
			if o.kind() != "DaemonSet" || !strings.HasPrefix(o.name(), "nvidia-driver-") {
				continue
			}
			ds := daemonSet(t, stream, o.name())
			var devicesSystem *corev1.Volume
			for i, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath == nil {
					continue
				}
				if strings.HasPrefix(v.HostPath.Path, "/sys/devices/system/") {
					t.Errorf("%s: hostPath %s exists only on some kernels", ds.Name, v.HostPath.Path)
				}
				if v.HostPath.Path == "/sys/devices/system" {
					devicesSystem = &ds.Spec.Template.Spec.Volumes[i]
				}
			}
			if devicesSystem == nil || devicesSystem.HostPath.Type == nil || *devicesSystem.HostPath.Type != corev1.HostPathDirectory {
				t.Errorf("%s: want hostPath /sys/devices/system of type Directory, got %+v", ds.Name, devicesSystem)
				continue
			}
			c := containerNamed(t, ds, "nvidia-driver-ctr")
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == devicesSystem.Name && m.MountPath == "/sys/devices/system" && m.SubPath == ""
			}) {
				t.Errorf("%s: nvidia-driver-ctr does not mount /sys/devices/system there: %+v", ds.Name, c.VolumeMounts)
			}
		}
	}
}

// TestDriverMofedSources: nvidia-peermem builds against the MOFED sources (ofa_kernel) under
// /run/mellanox/drivers/usr/src in the driver container: the network operator's driver container provides them
// there, a host MOFED in the host's /usr/src (the GPU Operator repoints the same volume).
func TestDriverMofedSources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"driver.rdma.enabled=true"}, "/run/mellanox/drivers/usr/src"},
		{[]string{"driver.rdma.enabled=true", "driver.rdma.useHostMofed=true"}, "/usr/src"},
		{nil, "/run/mellanox/drivers/usr/src"},
	} {
		ds := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}, tc.set...), "nvidia-driver-daemonset-ubuntu2204")
		if got := hostPaths(ds)["mlnx-ofed-usr-src"]; got != tc.want {
			t.Errorf("%v: mlnx-ofed-usr-src is hostPath %q, want %q", tc.set, got, tc.want)
		}
		c := containerNamed(t, ds, "nvidia-driver-ctr")
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "mlnx-ofed-usr-src" && m.MountPath == "/run/mellanox/drivers/usr/src"
		}) {
			t.Errorf("%v: nvidia-driver-ctr does not mount mlnx-ofed-usr-src at /run/mellanox/drivers/usr/src", tc.set)
		}
	}
}

// TestDriverCertConfigKeepsTheImageBundle: each listed key of the certConfig ConfigMap is mounted as one file in
// the OS's CA directory (subPath), so the image's own CA bundle in that directory stays visible.
func TestDriverCertConfigKeepsTheImageBundle(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("container-only")},
		"driver.certConfig.name=proxy-ca", "driver.certConfig.keys={proxy.crt,mirror.crt}")
	for ds, dir := range map[string]string{
		"nvidia-driver-daemonset-ubuntu2204": "/usr/local/share/ca-certificates",
		"nvidia-driver-daemonset-rhel9":      "/etc/pki/ca-trust/extracted/pem",
	} {
		d := daemonSet(t, stream, ds)
		c := containerNamed(t, d, "nvidia-driver-ctr")
		var got []string
		for _, m := range c.VolumeMounts {
			if m.Name != "cert-config" {
				continue
			}
			if m.MountPath == dir || m.SubPath == "" {
				t.Errorf("%s: cert-config mounted over the whole directory %s (hides the image's CA bundle)", ds, m.MountPath)
			}
			got = append(got, m.MountPath+"<-"+m.SubPath)
		}
		want := []string{dir + "/proxy.crt<-proxy.crt", dir + "/mirror.crt<-mirror.crt"}
		if !slices.Equal(got, want) {
			t.Errorf("%s: cert-config mounts %v, want %v", ds, got, want)
		}
	}
}

// TestDevicePluginGPUDirectFollowsTheDriver runs the device plugin's rendered start script against a fixture
// validations directory and reads the environment nvidia-device-plugin would start with. k8s-device-plugin v0.20.0
// (cmd/nvidia-device-plugin/main.go) reads GDS_ENABLED, MOFED_ENABLED and GDRCOPY_ENABLED to give containers
// /dev/nvidia-fs*, /dev/infiniband and /dev/gdrdrv. They must follow the driver's settings on the node (the driver
// pod's .driver-ctr-ready, in this chart's KEY=VALUE form or the GPU Operator driver's `KEY: value`), MOFED_ENABLED
// with GDS alone as the GPU Operator sets it, and be off where the driver turned nothing on (the GPU Operator 26.3.3
// regression turned them on everywhere).
func TestDevicePluginGPUDirectFollowsTheDriver(t *testing.T) {
	t.Parallel()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("no sh to run the script with: %v", err)
	}
	ds := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}), "nvidia-device-plugin-daemonset")
	c := containerNamed(t, ds, "nvidia-device-plugin")
	if len(c.Command) != 3 || c.Command[0] != "sh" || c.Command[1] != "-c" {
		t.Fatalf("device plugin command is not sh -c SCRIPT: %q", c.Command)
	}
	for _, name := range []string{"GDS_ENABLED", "MOFED_ENABLED", "GDRCOPY_ENABLED"} {
		if e, ok := envVar(c, name); ok {
			t.Errorf("%s is rendered as a fixed env var (%+v): it must come from the node's driver", name, e)
		}
	}
	const exe = "exec nvidia-device-plugin"
	if !strings.HasSuffix(c.Command[2], exe) {
		t.Fatalf("the script does not end by starting the plugin: %q", c.Command[2])
	}
	for _, tc := range []struct {
		name        string
		driverReady string // .driver-ctr-ready; "" = absent (host driver)
		want        map[string]string
	}{
		{"host driver", "", map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "false"}},
		{"nothing on", "GPU_DIRECT_RDMA_ENABLED=false\nGDS_ENABLED=false\nGDRCOPY_ENABLED=false\n",
			map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "false"}},
		{"gds", "GPU_DIRECT_RDMA_ENABLED=false\nGDS_ENABLED=true\nGDRCOPY_ENABLED=false\n",
			map[string]string{"GDS_ENABLED": "true", "MOFED_ENABLED": "true", "GDRCOPY_ENABLED": "false"}},
		// GPUDirect RDMA alone hands no /dev/infiniband to GPU containers: the RDMA device plugin accounts for them
		{"rdma", "GPU_DIRECT_RDMA_ENABLED=true\nGDS_ENABLED=false\nGDRCOPY_ENABLED=false\n",
			map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "false"}},
		{"quoted, exported", "export GDS_ENABLED=\"true\"\nGDRCOPY_ENABLED='true'\n",
			map[string]string{"GDS_ENABLED": "true", "MOFED_ENABLED": "true", "GDRCOPY_ENABLED": "true"}},
		// a GPU Operator driver's startup probe writes `KEY: value` lines (met during a takeover)
		{"gpu operator driver", "GDRCOPY_ENABLED: true\nGDS_ENABLED: true\nGPU_DIRECT_RDMA_ENABLED: true",
			map[string]string{"GDS_ENABLED": "true", "MOFED_ENABLED": "true", "GDRCOPY_ENABLED": "true"}},
		{"gpu operator driver, nothing on", "GDRCOPY_ENABLED: false\nGDS_ENABLED: false\nGPU_DIRECT_RDMA_ENABLED: true\n",
			map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "false"}},
		// only the three switches, only "true": nothing else in the file runs or leaks into the plugin's environment
		{"anything else", "GDS_ENABLED=yes\nPATH=/nowhere\n$(touch /tmp/x)\nGDRCOPY_ENABLED=true; echo\n",
			map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "false"}},
		{"gdrcopy", "GPU_DIRECT_RDMA_ENABLED=false\nGDS_ENABLED=false\nGDRCOPY_ENABLED=true\n",
			map[string]string{"GDS_ENABLED": "false", "MOFED_ENABLED": "false", "GDRCOPY_ENABLED": "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "driver-ready"), []byte("IS_HOST_DRIVER=false\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.driverReady != "" {
				if err := os.WriteFile(filepath.Join(dir, ".driver-ctr-ready"), []byte(tc.driverReady), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			script := strings.ReplaceAll(c.Command[2], "/run/nvidia/validations", dir)
			script = strings.TrimSuffix(script, exe) + "exec env"
			cmd := exec.Command(sh, "-c", script)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("script failed: %v\n%s", err, out)
			}
			env := map[string]string{}
			for _, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok {
					env[k] = v
				}
			}
			for k, v := range tc.want {
				if env[k] != v {
					t.Errorf("%s=%q in the plugin's environment, want %q", k, env[k], v)
				}
			}
		})
	}
}

// TestMIGManagerGeneratesItsConfig: k8s-mig-manager v0.15.0 (cmd/nvidia-mig-manager/main.go setupMigConfig) uses
// CONFIG_FILE as is and skips generating the config from the hardware; DEFAULT_CONFIG_FILE is its fallback where no
// MIG profile is discovered. It stores the generated config in ConfigMap <node>-mig-config owned by its pod, read
// through POD_NAME / POD_NAMESPACE, and acts only on the nvidia.com/mig.config label.
func TestMIGManagerGeneratesItsConfig(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("container-only")})
	ds := daemonSet(t, stream, "nvidia-mig-manager")
	c := containerNamed(t, ds, "nvidia-mig-manager")
	if e, ok := envVar(c, "CONFIG_FILE"); ok {
		t.Errorf("CONFIG_FILE=%s: the manager would never generate its config from the hardware", e.Value)
	}
	if e, _ := envVar(c, "DEFAULT_CONFIG_FILE"); e.Value != "/mig-parted-config/config.yaml" {
		t.Errorf("DEFAULT_CONFIG_FILE = %q, want the chart's config /mig-parted-config/config.yaml", e.Value)
	}
	for name, field := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"} {
		if e, _ := envVar(c, name); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("%s is not the pod's %s: %+v", name, field, e)
		}
	}
	role := decodeNamed[rbacv1.Role](t, stream, "Role", "nvidia-mig-manager")
	for _, verb := range []string{"get", "create", "update"} {
		if !allows(role.Rules, "", "configmaps", verb) {
			t.Errorf("Role nvidia-mig-manager does not allow configmaps %s (it stores <node>-mig-config)", verb)
		}
	}
	if !allows(role.Rules, "", "pods", "get") {
		t.Error("Role nvidia-mig-manager does not allow pods get (it reads its own pod to own the ConfigMap)")
	}

	// an admin's config is used as is
	custom := containerNamed(t, daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}, "migManager.config.name=my-mig"), "nvidia-mig-manager"), "nvidia-mig-manager")
	if e, _ := envVar(custom, "CONFIG_FILE"); e.Value != "/mig-parted-config/config.yaml" {
		t.Errorf("with migManager.config.name, CONFIG_FILE = %q, want /mig-parted-config/config.yaml", e.Value)
	}
	if _, ok := envVar(custom, "DEFAULT_CONFIG_FILE"); ok {
		t.Error("with migManager.config.name, DEFAULT_CONFIG_FILE is set too")
	}

	// migManager.config.default reaches unlabelled nodes: an init container seeds the label the manager acts on
	seed := containerNamed(t, ds, "mig-config-default")
	if got, want := strings.Join(append(seed.Command, seed.Args...), " "), "kube-gpu-stack seed-label --node=$(NODE_NAME) nvidia.com/mig.config=all-disabled"; got != want {
		t.Errorf("seed container runs %q, want %q", got, want)
	}
	if e, _ := envVar(seed, "NODE_NAME"); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("seed container's NODE_NAME is not the node's name: %+v", e)
	}
	cr := decodeNamed[rbacv1.ClusterRole](t, stream, "ClusterRole", "nvidia-mig-manager-"+chartrender.Namespace)
	if !allows(cr.Rules, "", "nodes", "update") {
		t.Error("ClusterRole of the MIG manager does not allow nodes update (the seed)")
	}
	off := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}, "migManager.config.default="), "nvidia-mig-manager")
	for _, ic := range off.Spec.Template.Spec.InitContainers {
		if ic.Name == "mig-config-default" {
			t.Error("migManager.config.default empty still seeds a label")
		}
	}
}

// TestMIGProfilesHaveDeviceFilters: every entry of every shipped MIG profile names the GPUs (PCI device IDs) it is
// written for, so mig-parted leaves a GPU it does not fit alone instead of failing the node's change.
func TestMIGProfilesHaveDeviceFilters(t *testing.T) {
	t.Parallel()
	cm := decodeNamed[corev1.ConfigMap](t, render(t, newestKube, []string{profileFile("container-only")}), "ConfigMap", "default-mig-parted-config")
	var cfg struct {
		MigConfigs map[string][]map[string]any `json:"mig-configs"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.MigConfigs) == 0 {
		t.Fatal("no MIG profiles shipped")
	}
	for name, entries := range cfg.MigConfigs {
		for i, e := range entries {
			f, ok := e["device-filter"].([]any)
			if !ok || len(f) == 0 {
				t.Errorf("profile %s entry %d has no device-filter", name, i)
			}
		}
	}
}

// gfdConfig is the device plugin config GFD's config manager reads: the ConfigMap mounted as available-configs and
// the config manager's DEFAULT_CONFIG; empty when GFD runs with its built-in config (no config manager).
func gfdConfig(t *testing.T, set ...string) (name, def string) {
	t.Helper()
	ds := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}, set...), "gpu-feature-discovery")
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "available-configs" && v.ConfigMap != nil {
			name = v.ConfigMap.Name
		}
	}
	if name == "" {
		return "", ""
	}
	e, _ := envVar(containerNamed(t, ds, "config-manager"), "DEFAULT_CONFIG")
	if e, ok := envVar(containerNamed(t, ds, "gpu-feature-discovery"), "CONFIG_FILE"); !ok || e.Value != "/config/config.yaml" {
		t.Errorf("GFD reads no config file (CONFIG_FILE %+v)", e)
	}
	return name, e.Value
}

// TestGFDFollowsDevicePluginConfig: the sharing settings of the device plugin's config (time-slicing replicas,
// MPS) change the labels GPU feature discovery publishes (nvidia.com/gpu.replicas, gpu.sharing-strategy, the
// product's -SHARED suffix), so GFD reads the same config the plugin reads on each node unless gfd.config names its
// own; with the device plugin off there is no config to follow.
func TestGFDFollowsDevicePluginConfig(t *testing.T) {
	t.Parallel()
	plugin := []string{"devicePlugin.config.name=plugin-configs", "devicePlugin.config.default=time-sliced"}
	for _, tc := range []struct {
		name          string
		set           []string
		wantCM, wantD string
	}{
		{"device plugin config", plugin, "plugin-configs", "time-sliced"},
		{"gfd's own", append(slices.Clone(plugin), "gfd.config.name=gfd-configs", "gfd.config.default=plain"), "gfd-configs", "plain"},
		{"none", nil, "", ""},
		{"device plugin off", append(slices.Clone(plugin), "devicePlugin.enabled=false"), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if cm, def := gfdConfig(t, tc.set...); cm != tc.wantCM || def != tc.wantD {
				t.Errorf("GFD reads ConfigMap %q default %q, want %q %q", cm, def, tc.wantCM, tc.wantD)
			}
		})
	}
}

// The consumers' mounts driver-ready names (consumerDriverRoot, consumerHostRoot; the package
// is not imported here: it links NVML).
const (
	consumerDriverRoot = "/driver-root"
	consumerHostRoot   = "/host"
)

// sourcesDriverReady: the container's command sources the validations dir's driver-ready (gpu-stack-lib.withDriverEnv).
func sourcesDriverReady(c map[string]any) bool {
	cmd, _ := c["command"].([]any)
	return strings.Contains(fmt.Sprint(cmd...), ". /run/nvidia/validations/driver-ready")
}

// hostPathOf returns the hostPath of the pod's volume mounted at mountPath in c ("" when none).
func hostPathOf(ps, c map[string]any, mountPath string) string {
	mounts, _ := c["volumeMounts"].([]any)
	for _, m := range mounts {
		mm := m.(map[string]any)
		if mm["mountPath"] != mountPath {
			continue
		}
		vols, _ := ps["volumes"].([]any)
		for _, v := range vols {
			vm := v.(map[string]any)
			if vm["name"] == mm["name"] {
				hp, _ := vm["hostPath"].(map[string]any)
				s, _ := hp["path"].(string)
				return s
			}
		}
	}
	return ""
}

// TestDriverReadyConsumersMountWhatItNames: driver-ready names DRIVER_ROOT_CTR_PATH=/driver-root (containerized
// driver) or /host (host driver), and the same for DEV_ROOT_CTR_PATH. Every container that sources it must mount
// the driver install dir (the host path the validator checks) at /driver-root and the host's / at /host.
func TestDriverReadyConsumersMountWhatItNames(t *testing.T) {
	t.Parallel()
	consumers := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, append(everythingOn, "devicePlugin.mps.controlDaemon=true")...))
		// the host paths the driver validation looks at, from its own mounts
		var driverDir, hostRoot string
		for _, o := range objs {
			for _, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					if c["name"] == "driver-validation" && driverDir == "" {
						driverDir, hostRoot = hostPathOf(ps, c, "/run/nvidia/driver"), hostPathOf(ps, c, "/host")
					}
				}
			}
		}
		if driverDir == "" || hostRoot == "" {
			continue // a profile without the container stack (vm-passthrough, vm-vgpu)
		}
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					if !sourcesDriverReady(c) {
						continue
					}
					consumers++
					name := fmt.Sprintf("%s: %s container %s", p.name, where, c["name"])
					if got := hostPathOf(ps, c, consumerDriverRoot); got != driverDir {
						t.Errorf("%s sources driver-ready but mounts %q at %s, want the driver install dir %s", name, got, consumerDriverRoot, driverDir)
					}
					if got := hostPathOf(ps, c, consumerHostRoot); got != hostRoot {
						t.Errorf("%s sources driver-ready but mounts %q at %s, want the host root %s", name, got, consumerHostRoot, hostRoot)
					}
				}
			}
		}
	}
	if consumers == 0 {
		t.Fatal("no container sources driver-ready: is withDriverEnv's script matched?")
	}
}
