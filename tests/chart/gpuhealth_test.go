package chart

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// devicePluginIgnores is k8s-device-plugin v0.20.0's reading of its health env (internal/rm/health.go,
// getDisabledHealthCheckXids, IsAllDisabled, IsDisabled): whether an Xid leaves the GPU healthy. DISABLE adds to the
// six Xids it always ignores, ENABLE takes Xids back out; "all"/"xids" in DISABLE turns the check off entirely
// (checkHealth returns before registering), whatever ENABLE says, unless ENABLE is "all" too.
func devicePluginIgnores(disable, enable string, xid uint64) bool {
	parse := func(s string) (map[uint64]bool, bool) {
		out := map[uint64]bool{}
		for f := range strings.SplitSeq(strings.ToLower(s), ",") {
			f = strings.TrimSpace(f)
			if f == "all" || f == "xids" {
				return nil, true
			}
			if n, err := strconv.ParseUint(f, 10, 64); err == nil {
				out[n] = true
			}
		}
		return out, false
	}
	disabled, allOff := parse(disable)
	enabled, allOn := parse(enable)
	if allOn {
		return false
	}
	if allOff {
		return true
	}
	if enabled[xid] {
		return false
	}
	return disabled[xid] || slices.Contains([]uint64{13, 31, 43, 45, 68, 109}, xid)
}

func devicePluginHealthEnv(t *testing.T, set ...string) (disable, enable string, hasEnable bool) {
	t.Helper()
	ds := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}, set...), "nvidia-device-plugin-daemonset")
	c := containerNamed(t, ds, "nvidia-device-plugin")
	d, _ := envVar(c, "DP_DISABLE_HEALTHCHECKS")
	e, ok := envVar(c, "DP_ENABLE_HEALTHCHECKS")
	return d.Value, e.Value, ok
}

// TestHealthPolicyReachesTheDevicePlugin: read as the plugin reads it, the rendered env takes a GPU out on every
// fatal Xid and on none of the application tier, for the default policy and for a changed one; and
// devicePlugin.healthChecks=false turns the check off.
func TestHealthPolicyReachesTheDevicePlugin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		set                []string
		fatal, application []uint64
	}{
		{"default", nil, []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120}, []uint64{13, 31, 43, 45, 68}},
		// 109 is one of the plugin's built-in ignores: the fatal tier takes it back; 92 is added to the ignores.
		{"changed", []string{"global.health.xids.fatal={79,109}", "global.health.xids.application={13,92}"}, []uint64{79, 109}, []uint64{13, 92}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disable, enable, _ := devicePluginHealthEnv(t, tc.set...)
			for _, xid := range tc.fatal {
				if devicePluginIgnores(disable, enable, xid) {
					t.Errorf("fatal Xid %d leaves the GPU healthy in the plugin (DP_DISABLE_HEALTHCHECKS=%q DP_ENABLE_HEALTHCHECKS=%q)", xid, disable, enable)
				}
			}
			for _, xid := range tc.application {
				if !devicePluginIgnores(disable, enable, xid) {
					t.Errorf("application Xid %d takes the GPU out in the plugin (DP_DISABLE_HEALTHCHECKS=%q DP_ENABLE_HEALTHCHECKS=%q)", xid, disable, enable)
				}
			}
		})
	}
	disable, _, hasEnable := devicePluginHealthEnv(t, "global.health.devicePlugin.healthChecks=false")
	if disable != "all" || hasEnable {
		t.Fatalf("healthChecks=false: DP_DISABLE_HEALTHCHECKS=%q, DP_ENABLE_HEALTHCHECKS rendered %v", disable, hasEnable)
	}
	for _, xid := range []uint64{48, 79} {
		if !devicePluginIgnores(disable, "", xid) {
			t.Fatalf("healthChecks=false still takes GPUs out on Xid %d", xid)
		}
	}
}

func gpuHealthRules(t *testing.T, stream string) []rbacv1.PolicyRule {
	t.Helper()
	var rules []rbacv1.PolicyRule
	for _, o := range objects(t, stream) {
		if o.kind() == "ClusterRole" && strings.HasPrefix(o.name(), "nvidia-gpu-health-") {
			rules = append(rules, decodeNamed[rbacv1.ClusterRole](t, stream, "ClusterRole", o.name()).Rules...)
		}
	}
	return rules
}

func admissionAccounts(t *testing.T, stream string) (string, []string) {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() == "ValidatingAdmissionPolicy" && strings.HasPrefix(o.name(), "kube-gpu-stack-node-scope-") {
			p := decodeNamed[admissionregistrationv1.ValidatingAdmissionPolicy](t, stream, o.kind(), o.name())
			var resources []string
			for _, r := range p.Spec.MatchConstraints.ResourceRules {
				resources = append(resources, r.Resources...)
			}
			return p.Spec.MatchConditions[0].Expression, resources
		}
	}
	t.Fatal("no ValidatingAdmissionPolicy rendered")
	return "", nil
}

// TestHealthAgentRendersThePolicy: off by default; on, the agent gets the policy as its env, reads NVML from the
// driver roots read-only, may patch only nodes/status (and update nodes only when it taints), is held to its own
// node by the admission policy, and tolerates its own taint. The taint is off unless asked for.
func TestHealthAgentRendersThePolicy(t *testing.T) {
	t.Parallel()
	off := render(t, newestKube, []string{profileFile("container-only")})
	for _, o := range objects(t, off) {
		if strings.HasPrefix(o.name(), "nvidia-gpu-health") {
			t.Fatalf("%s %s rendered with global.health.nodeCondition off", o.kind(), o.name())
		}
	}

	on := render(t, newestKube, []string{profileFile("container-only")}, "global.health.nodeCondition.enabled=true",
		"global.health.xids.fatal={79,120}", "global.health.watches={eccDoubleBit}")
	ds := daemonSet(t, on, "nvidia-gpu-health")
	c := containerNamed(t, ds, "nvidia-gpu-health")
	if !slices.Equal(c.Command, []string{"validator", "health"}) {
		t.Fatalf("command %q", c.Command)
	}
	for name, want := range map[string]string{
		"HEALTH_FATAL_XIDS": "79,120", "HEALTH_APPLICATION_XIDS": "13,31,43,45,68", "HEALTH_WATCHES": "eccDoubleBit",
		"HEALTH_CONDITION_TYPE": "nvidia.com/GPUHealthy", "HOST_ROOT": "/host", "DRIVER_INSTALL_DIR": "/run/nvidia/driver",
	} {
		if e, _ := envVar(c, name); e.Value != want {
			t.Errorf("%s=%q, want %q", name, e.Value, want)
		}
	}
	if e, ok := envVar(c, "NODE_NAME"); !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME %+v", e)
	}
	if e, ok := envVar(c, "HEALTH_TAINT"); ok {
		t.Errorf("HEALTH_TAINT=%q with the taint off", e.Value)
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("mount %s (%s) is writable", m.Name, m.MountPath)
		}
	}
	if len(c.VolumeMounts) != 2 {
		t.Errorf("mounts %+v, want the host root and the driver root", c.VolumeMounts)
	}
	if ds.Spec.Template.Spec.ServiceAccountName != "nvidia-gpu-health" {
		t.Errorf("service account %q", ds.Spec.Template.Spec.ServiceAccountName)
	}
	want := []rbacv1.PolicyRule{
		// its own Node watched (field selector on its name) for planned changes
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	}
	if got := gpuHealthRules(t, on); !slices.EqualFunc(got, want, rulesEqual) {
		t.Errorf("rules %+v, want %+v", got, want)
	}
	accounts, resources := admissionAccounts(t, on)
	if !strings.Contains(accounts, "nvidia-gpu-health") || !slices.Contains(resources, "nodes/status") {
		t.Errorf("the admission policy does not hold the agent to its node: %s %v", accounts, resources)
	}

	tainted := render(t, newestKube, []string{profileFile("container-only")}, "global.health.nodeCondition.enabled=true",
		"global.health.taint.enabled=true", "global.health.taint.effect=NoExecute")
	ds = daemonSet(t, tainted, "nvidia-gpu-health")
	c = containerNamed(t, ds, "nvidia-gpu-health")
	if e, _ := envVar(c, "HEALTH_TAINT"); e.Value != "nvidia.com/gpu-unhealthy:NoExecute" {
		t.Errorf("HEALTH_TAINT=%q", e.Value)
	}
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu-unhealthy" && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
	}) {
		t.Errorf("the agent does not tolerate its own taint: %+v", ds.Spec.Template.Spec.Tolerations)
	}
	want[0].Verbs = []string{"get", "list", "watch", "update"}
	if got := gpuHealthRules(t, tainted); !slices.EqualFunc(got, want, rulesEqual) {
		t.Errorf("rules with the taint %+v, want %+v", got, want)
	}
}

func rulesEqual(a, b rbacv1.PolicyRule) bool {
	return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs)
}

// TestHealthXidTiersOverlapFailsFromSet: an Xid given fatal by --set (an integer) and application in values.yaml (a
// float) is still caught.
func TestHealthXidTiersOverlapFailsFromSet(t *testing.T) {
	t.Parallel()
	_, err := renderErr(t, newestKube, []string{profileFile("container-only")}, "global.health.xids.fatal={79,13}")
	if err == nil || !strings.Contains(err.Error(), "Xid 13 is in both the fatal and the application tier") {
		t.Fatalf("render: %v", err)
	}
}

// TestDriverMarksMaintenanceForTheHealthCondition: with the GPU health agent on, the driver manager (its init
// container, and the upgrade gate, which fails a node whose validation times out) gets the condition to mark, and
// the driver's account may patch nodes/status; with global.health.maintenance.condition off, or no agent, neither.
// The opt-out label reaches the manager when set.
func TestDriverMarksMaintenanceForTheHealthCondition(t *testing.T) {
	const ds = "nvidia-driver-daemonset-ubuntu2204"
	statusRule := func(stream string) bool {
		return slices.ContainsFunc(decodeNamed[rbacv1.ClusterRole](t, stream, "ClusterRole", driverClusterRole(t, stream)).Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, "nodes/status") && slices.Contains(r.Verbs, "patch")
		})
	}
	for _, c := range []struct {
		name      string
		set       []string
		condition string
		label     string
	}{
		{"agent on", []string{"global.health.nodeCondition.enabled=true"}, "nvidia.com/GPUHealthy", ""},
		{"agent on, opt-out label", []string{"global.health.nodeCondition.enabled=true", "global.health.maintenance.label=remediation.example.com/skip=true"},
			"nvidia.com/GPUHealthy", "remediation.example.com/skip=true"},
		{"condition mark off", []string{"global.health.nodeCondition.enabled=true", "global.health.maintenance.condition=false"}, "", ""},
		{"no agent", nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			stream := render(t, newestKube, []string{profileFile("container-only")}, c.set...)
			d := daemonSet(t, stream, ds)
			for _, name := range []string{"driver-manager", "driver-upgrade-gate"} {
				e, _ := envVar(containerNamed(t, d, name), "HEALTH_CONDITION_TYPE")
				if e.Value != c.condition {
					t.Errorf("%s: HEALTH_CONDITION_TYPE=%q, want %q", name, e.Value, c.condition)
				}
			}
			if e, _ := envVar(containerNamed(t, d, "driver-manager"), "MAINTENANCE_LABEL"); e.Value != c.label {
				t.Errorf("MAINTENANCE_LABEL=%q, want %q", e.Value, c.label)
			}
			if got := statusRule(stream); got != (c.condition != "") {
				t.Errorf("the driver's account may patch nodes/status: %v, want %v", got, c.condition != "")
			}
		})
	}
}

// driverClusterRole is the name of the driver's ClusterRole in stream.
func driverClusterRole(t *testing.T, stream string) string {
	t.Helper()
	for _, o := range objects(t, stream) {
		if o.kind() == "ClusterRole" && strings.HasPrefix(o.name(), "nvidia-driver-") {
			return o.name()
		}
	}
	t.Fatal("no nvidia-driver ClusterRole rendered")
	return ""
}
