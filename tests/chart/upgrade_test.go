package chart

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// TestDriverUpgradeGateSidecar: every driver and vGPU manager pod has the driver-upgrade-gate sidecar: it runs the
// image of the pod's driver-manager init container (pinned, never the chart's appVersion, so a chart-only release
// changes no driver pod template), lifts the upgrade's cordon once the node's validator (the sandbox validator on
// vGPU manager nodes) is Ready with the new driver, and is Ready only once its ready file exists, on an emptyDir its
// startup probe reads; it runs unprivileged with a read-only root, and its ServiceAccount may do what it does
// (nodes get/patch, pods list/watch).
func TestDriverUpgradeGateSidecar(t *testing.T) {
	t.Parallel()
	const dir = "/run/kube-gpu-stack"
	seen := map[string]int{}
	for _, p := range profiles(t) {
		stream := render(t, newestKube, p.files, everythingOn...)
		for _, component := range []string{"driver", "vgpu-manager"} {
			for name, ds := range operandDaemonSets(t, stream, component) {
				seen[component]++
				spec := ds.Spec.Template.Spec
				where := p.name + ": " + name
				var gate, manager *corev1.Container
				for i, c := range spec.Containers {
					if c.Name == "driver-upgrade-gate" {
						gate = &spec.Containers[i]
					}
				}
				for i, c := range spec.InitContainers {
					if c.Name == "driver-manager" {
						manager = &spec.InitContainers[i]
					}
				}
				if gate == nil || manager == nil {
					t.Errorf("%s: driver-upgrade-gate sidecar %v, driver-manager init container %v", where, gate != nil, manager != nil)
					continue
				}
				if gate.Image != manager.Image || gate.ImagePullPolicy != manager.ImagePullPolicy {
					t.Errorf("%s: the sidecar runs %s (%s), the driver manager %s (%s)", where, gate.Image, gate.ImagePullPolicy, manager.Image, manager.ImagePullPolicy)
				}
				if strings.HasSuffix(gate.Image, ":"+chartrender.ChartVersion) {
					t.Errorf("%s: the sidecar's image %s follows the chart version", where, gate.Image)
				}
				want := []string{"driver-manager", "uncordon-when-valid", "--hold", "--ready-file", dir + "/driver-validated"}
				if component == "vgpu-manager" {
					want = append(want, "--validator-component", "sandbox-validator")
				} else {
					// driver.upgradePolicy.validationTimeoutSeconds; the driver DaemonSets are OnDelete, and the gate
					// of the old pod empties its node before it evicts that pod (everythingOn keeps autoUpgrade on); the
					// validation clock starts once the driver container started, within its startup probe's budget
					// (driver.startupProbe: 60 + 10 x 120 s)
					want = append(want, "--timeout", "600s", "--replace-outdated", "--stop-file", dir+"/driver-may-stop", "--driver-startup-timeout", "1260s")
					if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
						t.Errorf("%s: update strategy %s, want OnDelete", where, ds.Spec.UpdateStrategy.Type)
					}
					assertDriverStopWaitsForTheGate(t, where, spec, dir+"/driver-may-stop")
				}
				if got := append(slices.Clone(gate.Command), gate.Args...); !slices.Equal(got, want) {
					t.Errorf("%s: the sidecar runs %v, want %v", where, got, want)
				}
				fields := map[string]string{}
				for _, e := range gate.Env {
					if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
						fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
					}
				}
				if fields["NODE_NAME"] != "spec.nodeName" || fields["OPERATOR_NAMESPACE"] != "metadata.namespace" ||
					(component == "driver") != (fields["POD_NAME"] == "metadata.name") {
					t.Errorf("%s: the sidecar's field env %v", where, fields)
				}
				// its ready file's directory, and the pod's API token (the pod automounts none: gpu-stack-lib.apiAccessMount)
				if len(gate.VolumeMounts) != 2 || gate.VolumeMounts[0].MountPath != dir ||
					gate.VolumeMounts[1].Name != "kube-api-access" || gate.VolumeMounts[1].MountPath != contracts.TokenDir {
					t.Errorf("%s: the sidecar mounts %v, want one volume at %s and the API token at %s", where, gate.VolumeMounts, dir, contracts.TokenDir)
				} else {
					vol := gate.VolumeMounts[0].Name
					if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vol && v.EmptyDir != nil }) {
						t.Errorf("%s: the sidecar's volume %s is not an emptyDir of the pod", where, vol)
					}
				}
				// a startup probe every second: the rolling update moves on within a second of the validation, and a
				// node in service runs no probe; it outlasts the gate's own timeout (600 s here) by far
				probe := gate.StartupProbe
				wantProbe := []string{"validator", "wait", "--dir", dir, "--interval", "100ms", "--timeout", "500ms", "driver-validated"}
				if probe == nil || probe.Exec == nil || !slices.Equal(probe.Exec.Command, wantProbe) || probe.PeriodSeconds != 1 ||
					probe.TimeoutSeconds != 3 || probe.FailureThreshold != 3600 {
					t.Errorf("%s: the sidecar's startup probe %+v, want exec %v every 1s, timeout 3s, 3600 failures", where, probe, wantProbe)
				}
				if gate.ReadinessProbe != nil || gate.LivenessProbe != nil {
					t.Errorf("%s: the sidecar has a readiness or liveness probe, which would exec on every node for good", where)
				}
				if gate.Resources.Requests.Memory().IsZero() || gate.Resources.Limits.Memory().IsZero() || gate.Resources.Requests.Cpu().IsZero() {
					t.Errorf("%s: the sidecar's resources %v", where, gate.Resources)
				}
				sc := gate.SecurityContext
				if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
					!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.ReadOnlyRootFilesystem == nil ||
					!*sc.ReadOnlyRootFilesystem || (sc.Privileged != nil && *sc.Privileged) {
					t.Errorf("%s: the sidecar's securityContext %+v", where, sc)
				}
				rules := rulesFor(t, stream, spec.ServiceAccountName)
				for _, need := range []struct{ resource, verb string }{{"nodes", "get"}, {"nodes", "patch"}, {"pods", "list"}, {"pods", "watch"}} {
					if !allows(rules, "", need.resource, need.verb) {
						t.Errorf("%s: ServiceAccount %s may not %s %s", where, spec.ServiceAccountName, need.verb, need.resource)
					}
				}
			}
		}
	}
	if seen["driver"] == 0 || seen["vgpu-manager"] == 0 {
		t.Fatalf("checked %v DaemonSets; want both driver and vgpu-manager ones", seen)
	}
}

// TestUpgradeGateProbeOutlastsALongValidationTimeout: a validation timeout (with the driver's startup budget before
// it, 1,260 s by default) over the probe's hour of failures raises the failure threshold past both (by 5 minutes), so
// the kubelet never restarts a gate that still waits in time.
func TestUpgradeGateProbeOutlastsALongValidationTimeout(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("container-only")}, "driver.upgradePolicy.validationTimeoutSeconds=7200")
	checked := 0
	for name, ds := range operandDaemonSets(t, stream, "driver") {
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name != "driver-upgrade-gate" {
				continue
			}
			checked++
			if c.StartupProbe == nil || c.StartupProbe.FailureThreshold != 8760 || c.StartupProbe.PeriodSeconds != 1 {
				t.Errorf("%s: startup probe %+v, want 8760 failures of 1 s for a 1260 s build and a 7200 s validation timeout", name, c.StartupProbe)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no driver-upgrade-gate sidecar rendered")
	}
}

// assertDriverStopWaitsForTheGate: a driver pod deleted outside a driver change stops its driver only once its gate
// wrote stopFile (the node emptied first): the driver container mounts the gate's directory and its preStop waits
// for the file, within a grace period of driver.upgradePolicy.stopTimeoutSeconds (1800 by default).
func assertDriverStopWaitsForTheGate(t *testing.T, where string, spec corev1.PodSpec, stopFile string) {
	t.Helper()
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "nvidia-driver-ctr" })
	if i < 0 {
		t.Errorf("%s: no nvidia-driver-ctr", where)
		return
	}
	driver := spec.Containers[i]
	if !slices.ContainsFunc(driver.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "driver-upgrade-gate" && m.MountPath == filepath.Dir(stopFile) && m.ReadOnly
	}) {
		t.Errorf("%s: the driver container does not mount the gate's directory %s read-only: %v", where, filepath.Dir(stopFile), driver.VolumeMounts)
	}
	pre := driver.Lifecycle
	if pre == nil || pre.PreStop == nil || pre.PreStop.Exec == nil || len(pre.PreStop.Exec.Command) != 3 ||
		!strings.HasPrefix(pre.PreStop.Exec.Command[2], "until [ -e "+stopFile+" ]; do sleep 1; done; ") {
		t.Errorf("%s: the driver container's preStop %+v does not wait for %s", where, pre, stopFile)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g != 1800 {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want driver.upgradePolicy.stopTimeoutSeconds (1800)", where, g)
	}
}
