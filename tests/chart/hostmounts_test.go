package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestHostMountsAreReadOnlyUnlessTheContainerWrites: a host path a container only reads is mounted read-only, so a
// compromised container cannot plant files on the host through it. Every writable host mount of every profile
// (every operand on) must be in writableHostMounts, which says why its container writes there; a new writable mount
// fails until it is read-only or listed. It logs, per profile, how many writable host mounts remain.
func TestHostMountsAreReadOnlyUnlessTheContainerWrites(t *testing.T) {
	t.Parallel()
	used := map[hostMount]bool{}
	var counts []string
	for _, p := range profiles(t) {
		writable := 0
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				hostPaths := map[string]string{}
				volumes, _ := ps["volumes"].([]any)
				for _, v := range volumes {
					vm, _ := v.(map[string]any)
					if hp, ok := vm["hostPath"].(map[string]any); ok {
						hostPaths[fmt.Sprint(vm["name"])] = fmt.Sprint(hp["path"])
					}
				}
				for _, c := range containersOf(ps) {
					mounts, _ := c["volumeMounts"].([]any)
					for _, m := range mounts {
						mm, _ := m.(map[string]any)
						host, ok := hostPaths[fmt.Sprint(mm["name"])]
						if ro, _ := mm["readOnly"].(bool); !ok || ro {
							continue
						}
						writable++
						key := hostMount{fmt.Sprint(c["name"]), fmt.Sprint(mm["mountPath"])}
						if _, listed := writableHostMounts[key]; !listed {
							t.Errorf("%s: %s container %s mounts host %s at %s writable, and writableHostMounts does not say why: mount it readOnly, or list it",
								p.name, where, key.container, host, key.path)
						}
						used[key] = true
					}
				}
			}
		}
		counts = append(counts, fmt.Sprintf("%s %d", p.name, writable))
	}
	for key := range writableHostMounts {
		if !used[key] {
			t.Errorf("writableHostMounts lists %s at %s, which no profile renders writable: take it out", key.container, key.path)
		}
	}
	slices.Sort(counts)
	t.Logf("writable host mounts per profile (every operand on): %s", strings.Join(counts, ", "))
}

// hostMount is a container (by name, as the chart names it in every pod it runs in) and the path it mounts a host
// folder at.
type hostMount struct{ container, path string }

// writableHostMounts are the host mounts a container writes to, and what it writes, each read from the operand's
// source at its pinned tag or seen on the real-node tier (a mount only upstream's own chart vouched for was checked
// against the source and made read-only where the operand writes nothing).
var writableHostMounts = map[hostMount]string{
	{"cc-manager-validation", "/run/nvidia/validations"}:                           validatorWrites,
	{"cuda-validation", "/run/nvidia/validations"}:                                 validatorWrites,
	{"dra-validation", "/run/nvidia/validations"}:                                  validatorWrites,
	{"driver-validation", "/run/nvidia/validations"}:                               validatorWrites,
	{"plugin-validation", "/run/nvidia/validations"}:                               validatorWrites,
	{"toolkit-validation", "/run/nvidia/validations"}:                              validatorWrites,
	{"vfio-pci-validation", "/run/nvidia/validations"}:                             validatorWrites,
	{"vgpu-devices-validation", "/run/nvidia/validations"}:                         validatorWrites,
	{"vgpu-manager-validation", "/run/nvidia/validations"}:                         validatorWrites,
	{"nvidia-operator-validator", "/run/nvidia/validations"}:                       validatorWrites,
	{"nvidia-sandbox-validator", "/run/nvidia/validations"}:                        validatorWrites,
	{"driver-validation", "/host-dev-char"}:                                        "the driver check creates the host's /dev/char links to the NVIDIA devices (the other checks mount it read-only)",
	{"driver-manager", "/run/nvidia"}:                                              "unmounts the old driver root under it and writes the node's driver state",
	{"driver-manager", "/sys"}:                                                     "unbinds and rebinds GPUs and unloads modules through sysfs",
	{"nvidia-driver-ctr", "/run/nvidia"}:                                           driverWrites,
	{"nvidia-driver-ctr", "/run/nvidia-fabricmanager"}:                             driverWrites,
	{"nvidia-driver-ctr", "/run/nvidia-topologyd"}:                                 driverWrites,
	{"nvidia-driver-ctr", "/var/log"}:                                              driverWrites,
	{"nvidia-driver-ctr", "/dev/log"}:                                              "the driver's daemons log to the host's syslog socket",
	{"nvidia-driver-ctr", "/lib/firmware"}:                                         driverWrites,
	{"nvidia-driver-ctr", "/run/mellanox/drivers"}:                                 driverWrites,
	{"nvidia-driver-ctr", "/run/mellanox/drivers/usr/src"}:                         driverWrites,
	{"nvidia-driver-ctr", "/sys/devices/system"}:                                   driverWrites,
	{"nvidia-driver-ctr", "/sys/module/firmware_class/parameters/path"}:            "points the kernel's firmware loader at the driver's GSP firmware",
	{"nvidia-fs-ctr", "/run/nvidia"}:                                               driverWrites,
	{"nvidia-fs-ctr", "/var/log"}:                                                  driverWrites,
	{"nvidia-gdrcopy-ctr", "/run/nvidia"}:                                          driverWrites,
	{"nvidia-gdrcopy-ctr", "/var/log"}:                                             driverWrites,
	{"openshift-driver-toolkit-ctr", "/var/log"}:                                   driverWrites,
	{"openshift-driver-toolkit-ctr", "/run/mellanox/drivers/usr/src"}:              driverWrites,
	{"nvidia-vgpu-manager-ctr", "/run/nvidia"}:                                     driverWrites,
	{"nvidia-vgpu-manager-ctr", "/var/log"}:                                        driverWrites,
	{"nvidia-vgpu-manager-ctr", "/dev/log"}:                                        "the vGPU manager's daemons log to the host's syslog socket",
	{"nvidia-vgpu-manager-ctr", "/lib/firmware"}:                                   driverWrites,
	{"nvidia-vgpu-manager-ctr", "/sys/module/firmware_class/parameters/path"}:      "points the kernel's firmware loader at the driver's firmware",
	{"nvidia-vgpu-manager-ctr", "/sys/fs/cgroup"}:                                  "the vGPU manager's daemons join and configure cgroups",
	{"nvidia-vgpu-manager-ctr", "/dev/vfio"}:                                       "creates the vfio devices of the mediated devices",
	{"nvidia-container-toolkit-ctr", "/runtime/config-dir/"}:                       "the installer writes the runtime's main config (the import of its drop-in)",
	{"nvidia-container-toolkit-ctr", "/runtime/config-dir.d/"}:                     "the installer writes its runtime drop-in",
	{"nvidia-container-toolkit-ctr", "/runtime/sock-dir/"}:                         "the installer connects to the runtime's socket to signal it",
	{"nvidia-container-toolkit-ctr", "/usr/share/containers/oci/hooks.d"}:          "the installer writes CRI-O's OCI hook",
	{"nvidia-container-toolkit-ctr", "/var/run/nri"}:                               "the NRI plugin connects to the runtime's NRI socket",
	{"nvidia-container-toolkit-ctr", "/usr/local/nvidia"}:                          "the installer copies the runtime and nvidia-cdi-hook onto the host",
	{"nvidia-container-toolkit-ctr", "/run/nvidia/toolkit"}:                        "the installer's pid file and state",
	{"nvidia-container-toolkit-ctr", "/driver-root"}:                               "the installer creates the driver's control device nodes under the driver root's /dev",
	{"nvidia-container-toolkit-ctr", "/var/run/cdi"}:                               cdiWrites,
	{"runtime-config-keeper", "/runtime/config-dir/"}:                              "gives the runtime's main config its bytes from before the toolkit back when the toolkit stops",
	{"runtime-config-keeper", "/run/nvidia/toolkit"}:                               "its record of the runtime config from before the toolkit",
	{"runtime-config-keeper", "/var/run/cdi"}:                                      "removes the toolkit's CDI spec for management containers when the toolkit stops",
	{"nvidia-device-plugin", "/var/lib/kubelet/device-plugins"}:                    pluginSocket,
	{"nvidia-device-plugin", "/var/run/cdi"}:                                       cdiWrites,
	{"nvidia-device-plugin", "/mps"}:                                               "with MPS, the plugin and the control daemon share the pipe and log folders",
	{"nvidia-device-plugin", "/dev/shm"}:                                           "with MPS, the clients' shared memory",
	{"mps-control-daemon", "/mps"}:                                                 "the control daemon's pipe and log folders",
	{"mps-control-daemon", "/dev/shm"}:                                             "the MPS clients' shared memory",
	{"mps-control-daemon-mounts", "/mps"}:                                          "mounts the shared memory tmpfs under it",
	{"nvidia-kata-sandbox-device-plugin-ctr", "/var/lib/kubelet/device-plugins"}:   pluginSocket,
	{"nvidia-kata-sandbox-device-plugin-ctr", "/var/run/cdi"}:                      cdiWrites,
	{"nvidia-sandbox-device-plugin-ctr", "/var/lib/kubelet/device-plugins"}:        pluginSocket,
	{"nvidia-sandbox-device-plugin-ctr", "/var/run/cdi"}:                           cdiWrites,
	{"gpus", "/var/lib/kubelet/plugins"}:                                           draSocket,
	{"gpus", "/var/lib/kubelet/plugins_registry"}:                                  draSocket,
	{"gpus", "/var/run/cdi"}:                                                       cdiWrites,
	{"compute-domains", "/var/lib/kubelet/plugins"}:                                draSocket,
	{"compute-domains", "/var/lib/kubelet/plugins_registry"}:                       draSocket,
	{"compute-domains", "/var/run/cdi"}:                                            cdiWrites,
	{"gpu-feature-discovery", "/etc/kubernetes/node-feature-discovery/features.d"}: "with the NodeFeature API off, GFD writes its labels as a feature file there",
	{"nvidia-mig-manager", "/sys"}:                                                 "repartitions GPUs and rebinds them through sysfs",
	{"nvidia-mig-manager", "/host"}:                                                "runs the host's systemctl through chroot to stop and start GPU clients around a MIG change",
	{"nvidia-mig-manager", "/var/run/cdi"}:                                         cdiWrites,
	{"nvidia-cc-manager", "/sys"}:                                                  "switches the GPUs' confidential-computing mode through sysfs",
	{"nvidia-cc-manager", "/run/nvidia/validations"}:                               "writes and removes .cc-manager-ctr-ready",
	{"nvidia-vfio-manager", "/sys"}:                                                "binds GPUs to vfio-pci through sysfs",
	{"nvidia-vgpu-device-manager", "/sys"}:                                         "creates and removes the mediated devices through sysfs",
}

const (
	validatorWrites = "writes its check's status file, which other operands wait on"
	driverWrites    = "the driver container's build, install, daemons and logs (upstream's driver writes there)"
	cdiWrites       = "writes its CDI spec for the runtime"
	pluginSocket    = "serves its socket to the kubelet there"
	draSocket       = "serves its kubelet plugin and registration sockets there"
)
