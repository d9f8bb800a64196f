package contracts

import (
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestContractLookup(t *testing.T) {
	for ref, want := range map[string]string{
		"nvcr.io/nvidia/k8s-device-plugin:v0.20.0":                                     "nvidia/k8s-device-plugin",
		"registry.gpu.internal:5000/nvidia/k8s-device-plugin:v0.20.0":                  "nvidia/k8s-device-plugin",
		"localhost/nvidia/k8s-device-plugin:v0.20.0@sha256:" + strings.Repeat("a", 64): "nvidia/k8s-device-plugin",
		"nvcr.io/nvidia/driver:595.91.07-ubuntu24.04":                                  "nvidia/driver",
		"nvcr.io/nvidia/driver:580-5.15.0-140-generic-ubuntu22.04":                     "nvidia/driver",
		"nvcr.io/nvidia/cloud-native/nvidia-fs:2.29.4-rhel9":                           "nvidia/cloud-native/nvidia-fs",
		"registry.k8s.io/nfd/node-feature-discovery:v0.19.0":                           "nfd/node-feature-discovery",
	} {
		c, ok := Lookup(ref)
		if !ok || c.Repository != want {
			t.Errorf("Lookup(%s) = %q, %v; want %s", ref, c.Repository, ok, want)
		}
	}
	// Another tag is another contract: the row must be read again at that tag.
	for _, ref := range []string{"nvcr.io/nvidia/k8s-device-plugin:v0.19.0", "nvcr.io/nvidia/driver:595.91.07", "docker.io/library/busybox:1"} {
		if c, ok := Lookup(ref); ok {
			t.Errorf("Lookup(%s) matched the row of %s", ref, c.Repository)
		}
	}
	// The DCGM exporter's image flavour picks its entrypoint (docker/Dockerfile).
	for tag, want := range map[string]string{"4.6.0-4.8.3-distroless": "/usr/bin/dcgm-exporter-entrypoint.sh",
		"4.6.0-4.8.3-ubuntu22.04": "/usr/local/dcgm/dcgm-exporter-entrypoint.sh", "4.6.0-4.8.3-ubi9": "/usr/local/dcgm/dcgm-exporter-entrypoint.sh"} {
		if c, ok := Lookup("nvcr.io/nvidia/k8s/dcgm-exporter:" + tag); !ok || !slices.Equal(c.Entrypoint, []string{want}) {
			t.Errorf("dcgm-exporter:%s: entrypoint %v (found %v), want %s", tag, c.Entrypoint, ok, want)
		}
	}
	// The OS suffix picks the row: rhel9 reads GDS_ENABLED (common.sh), ubuntu does not.
	rhel, _ := Lookup("nvcr.io/nvidia/driver:595.91.07-rhel9")
	ubuntu, _ := Lookup("nvcr.io/nvidia/driver:595.91.07-ubuntu24.04")
	if _, ok := rhel.Env["GDS_ENABLED"]; !ok {
		t.Error("the rhel9 driver row does not read GDS_ENABLED")
	}
	if _, ok := ubuntu.Env["GDS_ENABLED"]; ok {
		t.Error("the ubuntu driver row reads GDS_ENABLED")
	}
}

func TestContractTableRows(t *testing.T) {
	for _, c := range Table {
		if c.Repository == "" || c.Tags == nil || c.Source == "" || c.User == "" {
			t.Errorf("row %q lacks its repository, tags, source or user", c.Repository)
		}
		if len(c.Binaries) == 0 {
			t.Errorf("row %s names no binary", c.Repository)
		}
		if c.EnvUnverified && c.Unverified == "" {
			t.Errorf("row %s skips its env checks without saying why (Unverified)", c.Repository)
		}
	}
}

func container(command []string, env map[string]string, mounts ...corev1.VolumeMount) corev1.Container {
	c := corev1.Container{Name: "c", Command: command, VolumeMounts: mounts}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range env {
			if !yield(k) {
				return
			}
		}
	}) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: env[k]})
	}
	return c
}

func hostPath(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

// wants reports whether the violations hold one with every fragment.
func wants(t *testing.T, got []string, fragments ...string) {
	t.Helper()
	if !slices.ContainsFunc(got, func(v string) bool {
		for _, f := range fragments {
			if !strings.Contains(v, f) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("no violation with %q in %q", fragments, got)
	}
}

func TestContractCheck(t *testing.T) {
	mig, _ := Lookup("nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0")
	wrapper := []string{"sh", "-c", "until [ -f " + DriverReadyFile + " ]; do sleep 5; done; set -a; . " + DriverReadyFile + "; set +a; exec nvidia-mig-manager"}
	vols := []corev1.Volume{hostPath("host", "/"), hostPath("driver", "/run/nvidia/driver")}
	mounts := []corev1.VolumeMount{{Name: "host", MountPath: "/host"}, {Name: "driver", MountPath: "/driver-root"}}

	good := container(wrapper, map[string]string{"NODE_NAME": "n", "POD_NAME": "p", "POD_NAMESPACE": "ns",
		"DEFAULT_CONFIG_FILE": "/c.yaml", "NVIDIA_VISIBLE_DEVICES": "all"}, mounts...)
	if got := mig.Check(good, vols); len(got) != 0 {
		t.Errorf("a container keeping the MIG manager's contract: %q", got)
	}
	// driver-ready's variables count as set when the wrapper sources it.
	if r := mig.Resolve(good); r.Program != "nvidia-mig-manager" || slices.Contains(r.Programs, "sleep") {
		t.Errorf("Resolve = program %q, programs %q", r.Program, r.Programs)
	}

	// POD_NAME/POD_NAMESPACE are optional (the generated config is then not published) and CONFIG_FILE is an
	// admin's named config: neither is a violation
	if got := mig.Check(container(wrapper, map[string]string{"NODE_NAME": "n", "CONFIG_FILE": "/c.yaml"}, mounts...), vols); len(got) != 0 {
		t.Errorf("the MIG manager with a named config and no POD_*: %q", got)
	}
	// a variable the chart must not set (Avoid), shown on a copy of the row
	avoiding := mig
	avoiding.Env = maps.Clone(mig.Env)
	avoiding.Env["WITH_REBOOT"] = EnvVar{Avoid: "the node would reboot on every MIG change"}
	bad := container(wrapper, map[string]string{"WITH_REBOOT": "true", "WHATEVER": "x"}, mounts[:1]...)
	got := avoiding.Check(bad, vols)
	wants(t, got, "sets env WHATEVER")
	wants(t, got, "sets env WITH_REBOOT", "would reboot")
	wants(t, got, "does not set env NODE_NAME")
	wants(t, got, "mounts nothing at /driver-root")

	// A wrong host path behind the right container path.
	wrongHost := container(nil, map[string]string{"NODE_NAME": "n", "POD_NAME": "p", "POD_NAMESPACE": "ns"}, mounts...)
	wants(t, mig.Check(wrongHost, []corev1.Volume{hostPath("host", "/srv"), hostPath("driver", "/run/nvidia/driver")}), "mounts host /srv at /host", "needs host /")

	// A command the image does not hold, and a shell an image without one cannot run.
	cc, _ := Lookup("nvcr.io/nvidia/cloud-native/k8s-cc-manager:v0.4.3")
	wants(t, cc.Check(container([]string{"k8s-cc-manager"}, nil), nil), `runs "k8s-cc-manager"`)
	wants(t, cc.Check(container([]string{"sh", "-c", "exec python3 /app/main.py"}, nil), nil), "no shell")
	ccVols := []corev1.Volume{hostPath("sys", "/sys"), hostPath("validations", "/run/nvidia/validations")}
	ccMounts := []corev1.VolumeMount{{Name: "sys", MountPath: "/sys"}, {Name: "validations", MountPath: "/run/nvidia/validations"}}
	if got := cc.Check(container(nil, map[string]string{"NODE_NAME": "n", "OPERATOR_NAMESPACE": "x"}, ccMounts...), ccVols); len(got) != 0 {
		t.Errorf("the cc manager's entrypoint with its env and mounts: %q", got)
	}
	wants(t, cc.Check(container(nil, map[string]string{"NODE_NAME": "n"}, ccMounts...), ccVols), "does not set env OPERATOR_NAMESPACE")

	// Root: the image needs it; a non-root user breaks it.
	uid := int64(65532)
	nonRoot := good
	nonRoot.SecurityContext = &corev1.SecurityContext{RunAsUser: &uid}
	wants(t, mig.Check(nonRoot, vols), "runs as user 65532")

	// Env a chart script in the container reads counts as read.
	driver, _ := Lookup("nvcr.io/nvidia/driver:595.91.07-ubuntu24.04")
	d := container([]string{"nvidia-driver", "init"}, map[string]string{"GDS_ENABLED": "true"})
	wants(t, driver.Check(d, nil), "sets env GDS_ENABLED")
	if slices.ContainsFunc(driver.Check(d, nil, `echo "GDS_ENABLED=${GDS_ENABLED}" > f`), func(v string) bool { return strings.Contains(v, "sets env GDS_ENABLED") }) {
		t.Error("GDS_ENABLED, read by a chart script in the container, still flagged")
	}
	// A host path needed only with a feature on.
	if slices.ContainsFunc(driver.Check(d, nil), func(v string) bool { return strings.Contains(v, "/run/mellanox") }) {
		t.Error("MOFED paths required without GPUDirect RDMA")
	}
	d.Env = append(d.Env, corev1.EnvVar{Name: "GPU_DIRECT_RDMA_ENABLED", Value: "true"})
	wants(t, driver.Check(d, nil), "mounts nothing at /run/mellanox/drivers")
}

func TestGetsToken(t *testing.T) {
	no := false
	mount := func(p string) corev1.Container {
		return corev1.Container{VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: p}}}
	}
	for _, tc := range []struct {
		pod  corev1.PodSpec
		c    corev1.Container
		want bool
	}{
		{corev1.PodSpec{}, corev1.Container{}, true}, // automounted by default
		{corev1.PodSpec{AutomountServiceAccountToken: &no}, corev1.Container{}, false},
		{corev1.PodSpec{AutomountServiceAccountToken: &no}, mount(TokenDir), true},
		{corev1.PodSpec{AutomountServiceAccountToken: &no}, mount("/var/run/secrets/"), true},
		{corev1.PodSpec{AutomountServiceAccountToken: &no}, mount("/"), false},
		{corev1.PodSpec{AutomountServiceAccountToken: &no}, mount("/var/run/secrets/kubernetes.io/serviceaccount-other"), false},
	} {
		if got := GetsToken(tc.pod, tc.c); got != tc.want {
			t.Errorf("GetsToken(automount %v, mounts %v) = %v, want %v", tc.pod.AutomountServiceAccountToken != nil, tc.c.VolumeMounts, got, tc.want)
		}
	}
}
