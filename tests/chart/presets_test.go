package chart

import (
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// The runtime presets are ordinary container-role profiles: every operand lands where container-only puts it
// (openshift's driver serves RHCOS nodes only: its row is in openshift_test.go).
func init() {
	for _, p := range []string{"k3s", "rke2", "microk8s", "k0s", "containerd-nri"} {
		roleMatrix[p] = sandboxOff(containerRole)
	}
}

// daemonSet decodes the rendered DaemonSet called name, failing the test when it is missing.
func daemonSet(t *testing.T, stream, name string) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() != "DaemonSet" || o.name() != name {
			continue
		}
		b, err := yaml.Marshal(o.Raw)
		if err != nil {
			t.Fatal(err)
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(b, &ds); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return &ds
	}
	t.Fatalf("no DaemonSet %s rendered", name)
	return nil
}

func containerEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

func hostPaths(ds *appsv1.DaemonSet) map[string]string {
	paths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	return paths
}

func toolkitContainer(t *testing.T, ds *appsv1.DaemonSet) corev1.Container {
	t.Helper()
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "nvidia-container-toolkit-ctr" {
			return c
		}
	}
	t.Fatal("the toolkit DaemonSet has no nvidia-container-toolkit-ctr container")
	return corev1.Container{}
}

// TestRuntimePresets renders each platform preset (its values/ profile, or --set overrides) and checks the
// toolkit's runtime env, the host directories behind its runtime mounts and the device plugin's kubelet socket dir.
func TestRuntimePresets(t *testing.T) {
	t.Parallel()
	profile := func(name string) []string { return profileFiles(t, name) }
	cases := []struct {
		name        string
		files       []string
		set         []string
		runtime     string
		config      string // RUNTIME_CONFIG (container path)
		dropIn      string // RUNTIME_DROP_IN_CONFIG (container path)
		dropInHost  string // RUNTIME_DROP_IN_CONFIG_HOST_PATH
		socket      string // RUNTIME_SOCKET (container path)
		configDir   string // host dirs of the runtime volumes
		dropInDir   string
		socketDir   string
		hooksDir    string // crio only
		crioMode    string // crio only
		kubeletRoot string // the kubelet root the exporter's pod-resources volume lies under
	}{
		{
			name: "generic", files: profile("container-only"), runtime: "containerd",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.toml",
			dropInHost: "/etc/containerd/conf.d/99-nvidia.toml", socket: "/runtime/sock-dir/containerd.sock",
			configDir: "/etc/containerd", dropInDir: "/etc/containerd/conf.d", socketDir: "/run/containerd",
			kubeletRoot: "/var/lib/kubelet",
		},
		{
			name: "generic-crio", set: []string{"toolkit.runtime=crio"}, runtime: "crio",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.conf",
			dropInHost: "/etc/crio/crio.conf.d/99-nvidia.conf", socket: "/runtime/sock-dir/crio.sock",
			configDir: "/etc/crio", dropInDir: "/etc/crio/crio.conf.d", socketDir: "/var/run/crio",
			hooksDir: "/usr/share/containers/oci/hooks.d", crioMode: "config",
			kubeletRoot: "/var/lib/kubelet",
		},
		{
			name: "k3s", files: profile("k3s"), runtime: "containerd",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.toml",
			dropInHost: "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/99-nvidia.toml",
			socket:     "/runtime/sock-dir/containerd.sock",
			configDir:  "/var/lib/rancher/k3s/agent/etc/containerd",
			dropInDir:  "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d",
			socketDir:  "/run/k3s/containerd", kubeletRoot: "/var/lib/kubelet",
		},
		{
			name: "rke2", files: profile("rke2"), runtime: "containerd",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.toml",
			dropInHost: "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/99-nvidia.toml",
			socket:     "/runtime/sock-dir/containerd.sock",
			configDir:  "/var/lib/rancher/rke2/agent/etc/containerd",
			dropInDir:  "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d",
			socketDir:  "/run/k3s/containerd", kubeletRoot: "/var/lib/kubelet",
		},
		{
			name: "microk8s", files: profile("microk8s"), runtime: "containerd",
			config: "/runtime/config-dir/containerd-template.toml", dropIn: "/runtime/config-dir.d/99-nvidia.toml",
			dropInHost: "/var/snap/microk8s/current/args/conf.d/99-nvidia.toml",
			socket:     "/runtime/sock-dir/containerd.sock",
			configDir:  "/var/snap/microk8s/current/args", dropInDir: "/var/snap/microk8s/current/args/conf.d",
			socketDir:   "/var/snap/microk8s/common/run",
			kubeletRoot: "/var/snap/microk8s/common/var/lib/kubelet",
		},
		{
			name: "k0s", files: profile("k0s"), runtime: "containerd",
			config: "/runtime/config-dir/containerd.toml", dropIn: "/runtime/config-dir.d/nvidia.toml",
			dropInHost: "/etc/k0s/containerd.d/nvidia.toml", socket: "/runtime/sock-dir/containerd.sock",
			configDir: "/etc/k0s", dropInDir: "/etc/k0s/containerd.d", socketDir: "/run/k0s",
			kubeletRoot: "/var/lib/k0s/kubelet",
		},
		{
			// openshift means CRI-O even though toolkit.runtime defaults to containerd
			name: "openshift", files: profile("openshift"), runtime: "crio",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.conf",
			dropInHost: "/etc/crio/crio.conf.d/99-nvidia.conf", socket: "/runtime/sock-dir/crio.sock",
			configDir: "/etc/crio", dropInDir: "/etc/crio/crio.conf.d", socketDir: "/var/run/crio",
			hooksDir: "/run/containers/oci/hooks.d", crioMode: "config",
			kubeletRoot: "/var/lib/kubelet",
		},
		{
			name: "openshift-without-cdi", files: profile("openshift"), set: []string{"global.cdi.enabled=false"}, runtime: "crio",
			config: "/runtime/config-dir/config.toml", dropIn: "/runtime/config-dir.d/99-nvidia.conf",
			dropInHost: "/etc/crio/crio.conf.d/99-nvidia.conf", socket: "/runtime/sock-dir/crio.sock",
			configDir: "/etc/crio", dropInDir: "/etc/crio/crio.conf.d", socketDir: "/var/run/crio",
			hooksDir: "/run/containers/oci/hooks.d", crioMode: "hook",
			kubeletRoot: "/var/lib/kubelet",
		},
		{
			// explicit runtimeConfig values win over the preset; an explicit kubelet root wins over the platform's
			name: "k3s-overridden", files: profile("k3s"),
			set: []string{
				"toolkit.runtimeConfig.config=/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl",
				"toolkit.runtimeConfig.socket=/run/containerd/containerd.sock",
				"global.hostPaths.kubeletRootDir=/data/kubelet",
			},
			runtime: "containerd",
			config:  "/runtime/config-dir/config-v3.toml.tmpl", dropIn: "/runtime/config-dir.d/99-nvidia.toml",
			dropInHost: "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/99-nvidia.toml",
			socket:     "/runtime/sock-dir/containerd.sock",
			configDir:  "/var/lib/rancher/k3s/agent/etc/containerd",
			dropInDir:  "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d",
			socketDir:  "/run/containerd", kubeletRoot: "/data/kubelet",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := render(t, newestKube, c.files, c.set...)
			tk := daemonSet(t, out, "nvidia-container-toolkit-daemonset")
			env := containerEnv(toolkitContainer(t, tk))
			for k, want := range map[string]string{
				"RUNTIME": c.runtime, "RUNTIME_CONFIG": c.config, "RUNTIME_DROP_IN_CONFIG": c.dropIn,
				"RUNTIME_DROP_IN_CONFIG_HOST_PATH": c.dropInHost, "RUNTIME_SOCKET": c.socket, "CRIO_CONFIG_MODE": c.crioMode,
			} {
				if got := env[k]; got != want {
					t.Errorf("toolkit env %s = %q, want %q", k, got, want)
				}
			}
			if _, nri := env["ENABLE_NRI_PLUGIN"]; nri {
				t.Error("toolkit has ENABLE_NRI_PLUGIN without global.cdi.nriPluginEnabled")
			}
			vols := hostPaths(tk)
			rt := c.runtime
			for name, want := range map[string]string{
				rt + "-config": c.configDir, rt + "-drop-in-config": c.dropInDir, rt + "-socket": c.socketDir, "crio-hooks": c.hooksDir,
			} {
				if got := vols[name]; got != want {
					t.Errorf("toolkit volume %s host path = %q, want %q", name, got, want)
				}
			}
			dp := daemonSet(t, out, "nvidia-device-plugin-daemonset")
			// the kubelet serves device plugins at this path whatever its root (k0s and microk8s too)
			if got := hostPaths(dp)["device-plugins"]; got != "/var/lib/kubelet/device-plugins" {
				t.Errorf("device plugin device-plugins host path = %q, want /var/lib/kubelet/device-plugins", got)
			}
			if got := hostPaths(daemonSet(t, out, "nvidia-dcgm-exporter"))["pod-resources"]; got != c.kubeletRoot+"/pod-resources" {
				t.Errorf("DCGM exporter pod-resources host path = %q, want %q", got, c.kubeletRoot+"/pod-resources")
			}
			// the runtime class is left off only where CRI-O injects by hook (OpenShift without CDI)
			wantClass := "nvidia"
			if c.crioMode == "hook" && strings.HasPrefix(c.name, "openshift") {
				wantClass = ""
			}
			if got := ptrString(dp.Spec.Template.Spec.RuntimeClassName); got != wantClass {
				t.Errorf("device plugin runtimeClassName = %q, want %q", got, wantClass)
			}
		})
	}
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestNRIPlugin: with global.cdi.nriPluginEnabled the toolkit runs its NRI plugin and mounts no runtime config, no
// RuntimeClass is rendered, and every pod that would run under the nvidia runtime class instead carries one
// nvidia.cdi.k8s.io/container.<name> annotation per container and no runtimeClassName.
func TestNRIPlugin(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"containerd", "crio"} {
		t.Run(rt, func(t *testing.T) {
			out := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "containerd-nri.yaml")}, "toolkit.runtime="+rt)
			tk := daemonSet(t, out, "nvidia-container-toolkit-daemonset")
			env := containerEnv(toolkitContainer(t, tk))
			if env["ENABLE_NRI_PLUGIN"] != "true" || env["NRI_SOCKET"] != "/var/run/nri/nri.sock" {
				t.Errorf("toolkit env ENABLE_NRI_PLUGIN=%q NRI_SOCKET=%q, want true and /var/run/nri/nri.sock", env["ENABLE_NRI_PLUGIN"], env["NRI_SOCKET"])
			}
			for _, k := range []string{"RUNTIME_CONFIG", "RUNTIME_DROP_IN_CONFIG", "RUNTIME_SOCKET", "CONTAINERD_CONFIG", "CRIO_CONFIG"} {
				if v, ok := env[k]; ok {
					t.Errorf("toolkit env has %s=%q under NRI", k, v)
				}
			}
			vols := hostPaths(tk)
			for name := range vols {
				if strings.HasPrefix(name, rt+"-") || name == "crio-hooks" {
					t.Errorf("toolkit mounts runtime volume %s under NRI", name)
				}
			}
			if vols["nri-socket"] != "/var/run/nri" {
				t.Errorf("toolkit nri-socket volume = %q, want /var/run/nri", vols["nri-socket"])
			}
			annotated := 0
			for _, o := range objects(t, out) {
				if o.kind() == "RuntimeClass" {
					t.Errorf("RuntimeClass %s rendered under NRI", o.name())
				}
				if o.kind() != "DaemonSet" {
					continue
				}
				ds := daemonSet(t, out, o.name())
				spec := ds.Spec.Template.Spec
				if spec.RuntimeClassName != nil {
					t.Errorf("%s has runtimeClassName %q under NRI", o.name(), *spec.RuntimeClassName)
				}
				ann := ds.Spec.Template.Annotations
				var nri []string
				for k := range ann {
					if strings.HasPrefix(k, "nvidia.cdi.k8s.io/container.") {
						nri = append(nri, k)
					}
				}
				if len(nri) == 0 {
					continue // a pod that never ran under the runtime class (toolkit, NFD, ...)
				}
				annotated++
				for _, c := range append(spec.InitContainers, spec.Containers...) {
					k := "nvidia.cdi.k8s.io/container." + c.Name
					if ann[k] != "management.nvidia.com/gpu=all" {
						t.Errorf("%s: annotation %s = %q, want management.nvidia.com/gpu=all", o.name(), k, ann[k])
					}
				}
				if len(nri) != len(spec.InitContainers)+len(spec.Containers) {
					t.Errorf("%s: %d NRI annotations for %d containers", o.name(), len(nri), len(spec.InitContainers)+len(spec.Containers))
				}
			}
			if annotated == 0 {
				t.Error("no DaemonSet carries NRI annotations; the device plugin at least should")
			}
			if ann := daemonSet(t, out, "nvidia-device-plugin-daemonset").Spec.Template.Annotations; ann["nvidia.cdi.k8s.io/container.nvidia-device-plugin"] == "" {
				t.Errorf("device plugin lacks its NRI annotation: %v", ann)
			}
		})
	}
}

// TestToolkitWaitsBeforeItsInstaller: the toolkit's installer starts toolkit.startDelaySeconds (5 by default, the GPU
// Operator's delay for containerd 1.6.9 and later) after the driver is ready, right before its exec; 0 starts it at
// once.
func TestToolkitWaitsBeforeItsInstaller(t *testing.T) {
	t.Parallel()
	files := []string{profileFile("container-only")}
	for set, want := range map[string]string{
		"":                             "set +a; sleep 5; exec nvidia-toolkit",
		"toolkit.startDelaySeconds=0":  "set +a; exec nvidia-toolkit",
		"toolkit.startDelaySeconds=12": "set +a; sleep 12; exec nvidia-toolkit",
	} {
		var sets []string
		if set != "" {
			sets = append(sets, set)
		}
		tk := daemonSet(t, render(t, newestKube, files, sets...), "nvidia-container-toolkit-daemonset")
		var script string
		for _, c := range tk.Spec.Template.Spec.Containers {
			if c.Name == "nvidia-container-toolkit-ctr" && len(c.Command) == 3 {
				script = c.Command[2]
			}
		}
		if !strings.HasSuffix(script, want) {
			t.Errorf("with %q the toolkit runs %q, want it to end %q", set, script, want)
		}
	}
}
