package chart

import (
	"fmt"
	"strings"
	"testing"
)

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
	consumers := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, []string{p.file}, append(everythingOn, "devicePlugin.mps.controlDaemon=true")...))
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
