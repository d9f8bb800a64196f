package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// The hook objects' fixed names (one release per namespace, like the operands).
const (
	gateName       = "kube-gpu-stack-validation-gate"
	testName       = "kube-gpu-stack-validation-test"
	preUpgradeName = "kube-gpu-stack-pre-upgrade"
	cleanupName    = "kube-gpu-stack-cleanup"
	reportName     = "kube-gpu-stack-validation-report"
)

// helmTimeout is Helm's and Flux's default --timeout: a hook's pod must be stopped before it.
const helmTimeout = 300

// hookObject is a rendered object with Helm hook annotations.
type hookObject struct {
	object
	events, deletePolicy, outputLog string
	weight                          int
}

func (h hookObject) key() string { return strings.ToLower(h.kind()) + "/" + h.name() }

// hookObjects returns the rendered objects that are Helm hooks.
func hookObjects(t *testing.T, stream string) []hookObject {
	t.Helper()
	var out []hookObject
	for _, o := range objects(t, stream) {
		meta, _ := o.Raw["metadata"].(map[string]any)
		ann, _ := meta["annotations"].(map[string]any)
		events, ok := ann["helm.sh/hook"].(string)
		if !ok {
			continue
		}
		h := hookObject{object: o, events: events}
		h.deletePolicy, _ = ann["helm.sh/hook-delete-policy"].(string)
		h.outputLog, _ = ann["helm.sh/hook-output-log-policy"].(string)
		w, _ := ann["helm.sh/hook-weight"].(string)
		var err error
		if h.weight, err = strconv.Atoi(w); w != "" && err != nil {
			t.Fatalf("%s: hook weight %q is not a number", h.key(), w)
		}
		out = append(out, h)
	}
	return out
}

// decode converts a generic object into a typed one.
func decode[T any](t *testing.T, o object) *T {
	t.Helper()
	b, err := json.Marshal(o.Raw)
	if err != nil {
		t.Fatal(err)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s %s: %v", o.kind(), o.name(), err)
	}
	return &v
}

// hookPod is a hook's pod spec with the Job around it (nil for a bare Pod) and its one container.
type hookPod struct {
	job  *batchv1.Job
	spec corev1.PodSpec
	c    corev1.Container
}

func podOf(t *testing.T, h hookObject) hookPod {
	t.Helper()
	var p hookPod
	switch h.kind() {
	case "Job":
		p.job = decode[batchv1.Job](t, h.object)
		p.spec = p.job.Spec.Template.Spec
	case "Pod":
		p.spec = decode[corev1.Pod](t, h.object).Spec
	default:
		t.Fatalf("%s is not a Job or Pod", h.key())
	}
	if len(p.spec.Containers) != 1 || len(p.spec.InitContainers) != 0 {
		t.Fatalf("%s: want one container, got %d (+%d init)", h.key(), len(p.spec.Containers), len(p.spec.InitContainers))
	}
	p.c = p.spec.Containers[0]
	return p
}

// deadline is the pod's activeDeadlineSeconds, wherever the kind keeps it.
func (p hookPod) deadline() *int64 {
	if p.job != nil {
		return p.job.Spec.ActiveDeadlineSeconds
	}
	return p.spec.ActiveDeadlineSeconds
}

// flag is the value after name in the container's args.
func (p hookPod) flag(name string) string {
	if i := slices.Index(p.c.Args, name); i >= 0 && i+1 < len(p.c.Args) {
		return p.c.Args[i+1]
	}
	return ""
}

// flags are all values given to a repeated flag.
func (p hookPod) flags(name string) []string {
	var out []string
	for i, a := range p.c.Args {
		if a == name && i+1 < len(p.c.Args) {
			out = append(out, p.c.Args[i+1])
		}
	}
	return out
}

// boolFlag is the value of a --name=BOOL argument ("" when absent).
func boolFlag(p hookPod, name string) string {
	for _, a := range p.c.Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func (p hookPod) env(name string) (string, bool) {
	for _, e := range p.c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// restrictedViolations checks a pod spec against the Pod Security "restricted" profile (baseline included):
// no host namespaces, ports or hostPath volumes, only the restricted volume types, non-root with a non-zero UID,
// RuntimeDefault/Localhost seccomp, no privilege escalation, all capabilities dropped (NET_BIND_SERVICE may be
// added), no privileged containers, no unsafe sysctls, SELinux and proc mount at their defaults.
func restrictedViolations(spec corev1.PodSpec) []string {
	var v []string
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		v = append(v, "host namespaces")
	}
	for _, vol := range spec.Volumes {
		s := vol.VolumeSource
		if s.ConfigMap == nil && s.EmptyDir == nil && s.Projected == nil && s.Secret == nil && s.DownwardAPI == nil &&
			s.CSI == nil && s.PersistentVolumeClaim == nil && s.Ephemeral == nil {
			v = append(v, "volume "+vol.Name+" has a type restricted pods may not use")
		}
	}
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if len(psc.Sysctls) > 0 {
		v = append(v, "sysctls")
	}
	if psc.SELinuxOptions != nil && (psc.SELinuxOptions.User != "" || psc.SELinuxOptions.Role != "") {
		v = append(v, "pod SELinux user/role")
	}
	if psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		v = append(v, "pod runAsUser 0")
	}
	seccompOK := func(p *corev1.SeccompProfile) bool {
		return p != nil && (p.Type == corev1.SeccompProfileTypeRuntimeDefault || p.Type == corev1.SeccompProfileTypeLocalhost)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				v = append(v, c.Name+": hostPort")
			}
		}
		if sc.Privileged != nil && *sc.Privileged {
			v = append(v, c.Name+": privileged")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			v = append(v, c.Name+": allowPrivilegeEscalation is not false")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			v = append(v, c.Name+": capabilities do not drop ALL")
		} else if slices.ContainsFunc(sc.Capabilities.Add, func(c corev1.Capability) bool { return c != "NET_BIND_SERVICE" }) {
			v = append(v, c.Name+": adds capabilities")
		}
		nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
		if !nonRoot {
			v = append(v, c.Name+": runAsNonRoot is not true")
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			v = append(v, c.Name+": runAsUser 0")
		}
		if !seccompOK(sc.SeccompProfile) && !(sc.SeccompProfile == nil && seccompOK(psc.SeccompProfile)) {
			v = append(v, c.Name+": seccomp profile is not RuntimeDefault or Localhost")
		}
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			v = append(v, c.Name+": procMount")
		}
		if sc.SELinuxOptions != nil && (sc.SELinuxOptions.User != "" || sc.SELinuxOptions.Role != "") {
			v = append(v, c.Name+": SELinux user/role")
		}
	}
	return v
}

// TestHookJobsAreSafeAndBounded: in every profile, each hook that runs a pod (the pre-upgrade, gate and cleanup
// Jobs, the helm test Pod) runs the project's binary once (backoffLimit 0, restartPolicy Never; a Job's pod killed by a disruption is
// replaced), is stopped before Helm's
// default 5m timeout (activeDeadlineSeconds = the binary's --timeout + 30), runs under the restricted Pod
// Security profile with a token for its own ServiceAccount, and carries the hook annotations each needs.
func TestHookJobsAreSafeAndBounded(t *testing.T) {
	t.Parallel()
	type want struct{ kind, events, deletePolicy, outputLog, subcommand string }
	wants := map[string]want{
		// a rollback is a driver change like any other: planned and gated
		gateName:    {"Job", "post-install,post-upgrade,post-rollback", "before-hook-creation", "hook-succeeded,hook-failed", "check"},
		testName:    {"Pod", "test", "before-hook-creation", "hook-failed", "check"},
		cleanupName: {"Job", "pre-delete", "before-hook-creation,hook-succeeded", "hook-failed", "cleanup"},
		// the plan is worth seeing in `helm upgrade` output, and its log after a refusal
		preUpgradeName: {"Job", "pre-upgrade,pre-rollback", "before-hook-creation", "hook-succeeded,hook-failed", "pre-upgrade"},
	}
	for _, p := range profiles(t) {
		t.Run(p.name, func(t *testing.T) {
			seen := map[string]bool{}
			for _, h := range hookObjects(t, render(t, newestKube, p.files)) {
				if h.kind() != "Job" && h.kind() != "Pod" {
					continue
				}
				w, ok := wants[h.name()]
				if !ok {
					t.Errorf("unexpected hook %s", h.key())
					continue
				}
				seen[h.name()] = true
				if h.kind() != w.kind || h.events != w.events || h.deletePolicy != w.deletePolicy || h.outputLog != w.outputLog {
					t.Errorf("%s: hook %s, delete policy %q, output log policy %q; want a %s with %s, %q, %q",
						h.key(), h.events, h.deletePolicy, h.outputLog, w.kind, w.events, w.deletePolicy, w.outputLog)
				}
				if h.weight != 10 {
					t.Errorf("%s: weight %d, want 10 (above its RBAC's 5)", h.key(), h.weight)
				}
				pod := podOf(t, h)
				if pod.job != nil && (pod.job.Spec.BackoffLimit == nil || *pod.job.Spec.BackoffLimit != 0) {
					t.Errorf("%s: backoffLimit %v, want 0", h.key(), pod.job.Spec.BackoffLimit)
				}
				// a pod killed by a disruption (its node drained or deleted) is replaced; any other failure is final
				if pod.job != nil {
					pfp := pod.job.Spec.PodFailurePolicy
					if pfp == nil || len(pfp.Rules) != 1 || pfp.Rules[0].Action != batchv1.PodFailurePolicyActionIgnore ||
						pfp.Rules[0].OnExitCodes != nil || len(pfp.Rules[0].OnPodConditions) != 1 ||
						pfp.Rules[0].OnPodConditions[0].Type != corev1.DisruptionTarget {
						t.Errorf("%s: podFailurePolicy %+v, want one rule ignoring DisruptionTarget", h.key(), pfp)
					}
				}
				if pod.job != nil && pod.job.Spec.TTLSecondsAfterFinished != nil {
					t.Errorf("%s: ttlSecondsAfterFinished set; Argo CD would see the Job vanish", h.key())
				}
				if pod.spec.RestartPolicy != corev1.RestartPolicyNever {
					t.Errorf("%s: restartPolicy %q, want Never", h.key(), pod.spec.RestartPolicy)
				}
				// an install render: the gate waits for the first driver builds, below the README's `helm install
				// --timeout 30m` (TestFirstInstallOutlastsTheDriverBuild; after an upgrade it is below the default 5m)
				limit := int64(helmTimeout)
				if h.name() == gateName {
					limit = 30 * 60
				}
				d := pod.deadline()
				if d == nil || *d >= limit {
					t.Errorf("%s: activeDeadlineSeconds %v, want below Helm's timeout for it (%ds)", h.key(), d, limit)
				}
				if timeout := pod.flag("--timeout"); w.subcommand == "check" && (d == nil || timeout != fmt.Sprintf("%ds", *d-30)) {
					t.Errorf("%s: --timeout %q with activeDeadlineSeconds %v; want the deadline 30s after the binary's", h.key(), timeout, d)
				}
				if v := restrictedViolations(pod.spec); len(v) > 0 {
					t.Errorf("%s is not PSS restricted: %s", h.key(), strings.Join(v, "; "))
				}
				if pod.spec.ServiceAccountName != h.name() || pod.spec.AutomountServiceAccountToken == nil || !*pod.spec.AutomountServiceAccountToken {
					t.Errorf("%s: serviceAccountName %q, automount %v; want its own ServiceAccount with a token", h.key(),
						pod.spec.ServiceAccountName, pod.spec.AutomountServiceAccountToken)
				}
				if !strings.HasPrefix(pod.c.Image, "ghcr.io/kube-gpu-stack/kube-gpu-stack:") && p.name != "private-registry" {
					t.Errorf("%s runs %s, not the project's image", h.key(), pod.c.Image)
				}
				if got := append(slices.Clone(pod.c.Command), pod.c.Args...); len(got) < 2 || got[0] != "kube-gpu-stack" || got[1] != w.subcommand {
					t.Errorf("%s runs %v, want kube-gpu-stack %s", h.key(), got, w.subcommand)
				}
				if pod.flag("--namespace") != chartrender.Namespace || pod.flag("--release") != chartrender.ReleaseName {
					t.Errorf("%s: --namespace %q --release %q", h.key(), pod.flag("--namespace"), pod.flag("--release"))
				}
				if pod.c.Resources.Requests.Memory().IsZero() || pod.c.Resources.Limits.Memory().IsZero() {
					t.Errorf("%s: no memory request and limit", h.key())
				}
				if report := pod.flag("--report-configmap"); (h.name() == gateName) != (report == reportName) {
					t.Errorf("%s: --report-configmap %q (only the gate writes %s)", h.key(), report, reportName)
				}
				if _, ok := pod.env("DRIVER_POOLS"); ok != (w.subcommand == "check" || w.subcommand == "pre-upgrade") {
					t.Errorf("%s: DRIVER_POOLS set=%v", h.key(), ok)
				}
				if evict, force := boolFlag(pod, "--evict"), boolFlag(pod, "--force"); (evict != "" && force != "") != (w.subcommand == "pre-upgrade") {
					t.Errorf("%s: --evict %q --force %q (only the pre-upgrade plan takes them)", h.key(), evict, force)
				}
			}
			for name := range wants {
				if !seen[name] {
					t.Errorf("no hook %s rendered", name)
				}
			}
		})
	}
}

// TestHookRBAC: the gate's, the pre-upgrade plan's and the cleanup's ServiceAccount, roles and bindings are hooks
// of their Job's events with a lower weight (created first), with the Job's delete policy (the gate's and the
// plan's never hook-succeeded, so a failed Job keeps its RBAC and log); the test's are ordinary release objects.
// Every hook pod's ServiceAccount exists. The check may only read (nodes cluster-wide; pods, DaemonSets, revisions
// and events in the namespace), plus write its one report ConfigMap (the gate). The plan gets least privilege: read
// and patch nodes (upgrade-required), list pods, PodDisruptionBudgets and resource claims cluster-wide (GPU pods,
// DRA ones included, a budget never lets go), list the driver pods in the namespace; nothing else.
func TestHookRBAC(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")})
	hooks := map[string]hookObject{}
	for _, h := range hookObjects(t, stream) {
		hooks[h.key()] = h
	}
	plain := map[string]object{}
	for _, o := range objects(t, stream) {
		plain[strings.ToLower(o.kind())+"/"+o.name()] = o
	}
	clusterName := func(n string) string { return n + "-" + chartrender.Namespace }
	rbacKeys := func(n string) []string {
		return []string{"serviceaccount/" + n, "role/" + n, "rolebinding/" + n, "clusterrole/" + clusterName(n), "clusterrolebinding/" + clusterName(n)}
	}
	for _, tc := range []struct{ name, events, deletePolicy string }{
		{gateName, "post-install,post-upgrade,post-rollback", "before-hook-creation"},
		{preUpgradeName, "pre-upgrade,pre-rollback", "before-hook-creation"},
		{cleanupName, "pre-delete", "before-hook-creation,hook-succeeded"},
	} {
		for _, k := range rbacKeys(tc.name) {
			h, ok := hooks[k]
			if !ok {
				t.Errorf("%s is not rendered as a hook", k)
				continue
			}
			if h.events != tc.events || h.deletePolicy != tc.deletePolicy || h.weight != 5 || h.outputLog != "" {
				t.Errorf("%s: hook %s weight %d delete policy %q output log %q; want %s weight 5 %q", k, h.events, h.weight,
					h.deletePolicy, h.outputLog, tc.events, tc.deletePolicy)
			}
		}
	}
	for _, k := range rbacKeys(testName) {
		if _, ok := plain[k]; !ok {
			t.Errorf("%s not rendered", k)
		}
		if _, ok := hooks[k]; ok {
			t.Errorf("%s is a hook; `helm test --logs` fails on test hooks that are not pods", k)
		}
	}

	read := []string{"get", "list", "watch"}
	rulesOf := func(key string) []rbacv1.PolicyRule {
		o, ok := plain[key]
		if !ok {
			t.Fatalf("%s not rendered", key)
		}
		if o.kind() == "Role" {
			return decode[rbacv1.Role](t, o).Rules
		}
		return decode[rbacv1.ClusterRole](t, o).Rules
	}
	checkRead := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets", "controllerrevisions"}, Verbs: read},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: read},
	}
	nodesRead := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: read}}
	report := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{reportName}, Verbs: []string{"get", "update", "patch"}},
	}
	for key, want := range map[string][]rbacv1.PolicyRule{
		// and the one write beyond its report: deleting a driver DaemonSet upgrades that failed left (--delete-left-over)
		"role/" + gateName: append(append(slices.Clone(checkRead), report...),
			rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"delete"}}),
		"clusterrole/" + clusterName(gateName): nodesRead,
		"role/" + testName:                     checkRead,
		"clusterrole/" + clusterName(testName): nodesRead,
		// the driver DaemonSets: a copy kept as they are, for nodes whose new driver does not validate (revertset)
		"role/" + preUpgradeName: {{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "create", "delete"}},
			// a refusal goes on its own Job as an Event: that Job alone may be read
			{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, ResourceNames: []string{preUpgradeName}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}},
		"clusterrole/" + clusterName(preUpgradeName): {
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
			{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"list"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"list"}},
		},
	} {
		if got := rulesOf(key); !equalJSON(got, want) {
			t.Errorf("%s rules:\n got  %s\n want %s", key, mustJSON(got), mustJSON(want))
		}
	}
	for _, key := range []string{"rolebinding/" + gateName, "rolebinding/" + testName, "rolebinding/" + preUpgradeName, "rolebinding/" + cleanupName} {
		rb := decode[rbacv1.RoleBinding](t, plain[key])
		name := strings.TrimPrefix(key, "rolebinding/")
		if rb.RoleRef.Name != name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != name || rb.Subjects[0].Namespace != chartrender.Namespace {
			t.Errorf("%s binds %v to %v", key, rb.RoleRef, rb.Subjects)
		}
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func equalJSON(a, b any) bool { return mustJSON(a) == mustJSON(b) }

// TestCleanupDeletesExactlyWhatHooksLeave: the pre-delete cleanup's --delete list is exactly the hook objects Helm
// leaves behind (every hook without hook-succeeded in its delete policy: the gate's Job and RBAC, the test Pod, the
// NodeFeatureRule), plus the gate's report ConfigMap; its roles allow deleting exactly those names, stopping the
// release's DaemonSets first, removing the driver managers' Leases, and patching nodes. With nfd.mode=none there is no NodeFeatureRule to name (nor its API).
func TestCleanupDeletesExactlyWhatHooksLeave(t *testing.T) {
	t.Parallel()
	profile := filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")
	for _, tc := range []struct {
		name string
		set  []string
	}{
		{"nfd-bundled", nil},
		{"nfd-none", []string{"nfd.mode=none", "nfd.enabled=false", "gfd.useNodeFeatureAPI=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := render(t, newestKube, []string{profile}, tc.set...)
			hooks := hookObjects(t, stream)
			var left []string
			var cleanup *hookObject
			for i, h := range hooks {
				if h.kind() == "Job" && h.name() == cleanupName {
					cleanup = &hooks[i]
				}
				if !strings.Contains(h.deletePolicy, "hook-succeeded") {
					left = append(left, h.key())
				}
			}
			if cleanup == nil {
				t.Fatal("no cleanup Job rendered")
			}
			left = append(left, "configmap/"+reportName)
			slices.Sort(left)
			if tc.name == "nfd-bundled" != slices.Contains(left, "nodefeaturerule/nvidia-gpu-present") {
				t.Fatalf("the NodeFeatureRule hook is rendered=%v with %s", !slices.Contains(left, "nodefeaturerule/nvidia-gpu-present"), tc.name)
			}
			// the hooks' leftovers, and the release's cluster-scoped objects of any revision (an earlier revision's
			// stay behind after a refused upgrade: TestCleanupNamesEveryClusterObject checks they are all named)
			del := podOf(t, *cleanup).flags("--delete")
			var hookDel []string
			for _, d := range del {
				kind, _, _ := strings.Cut(d, "/")
				if !releaseClusterKinds[kind] || slices.Contains(left, d) {
					hookDel = append(hookDel, d)
				}
			}
			if got := slices.Sorted(slices.Values(hookDel)); !slices.Equal(got, left) {
				t.Errorf("cleanup --delete of hook objects:\n got  %v\n want %v", got, left)
			}
			want := slices.Sorted(slices.Values(del))
			if !slices.Contains(podOf(t, *cleanup).c.Args, "--sweep") {
				t.Error("the cleanup does not sweep the namespace of an earlier revision's objects (--sweep)")
			}

			// what its roles allow deleting, as kind/name (resources named by the cleanup's --delete kinds)
			kindOf := map[string]string{"jobs": "job", "pods": "pod", "serviceaccounts": "serviceaccount", "configmaps": "configmap",
				"roles": "role", "rolebindings": "rolebinding", "clusterroles": "clusterrole",
				"clusterrolebindings": "clusterrolebinding", "nodefeaturerules": "nodefeaturerule", "deviceclasses": "deviceclass",
				"runtimeclasses": "runtimeclass", "validatingadmissionpolicies": "validatingadmissionpolicy",
				"validatingadmissionpolicybindings": "validatingadmissionpolicybinding"}
			clusterScoped := map[string]bool{"nodefeaturerule": true}
			for k := range releaseClusterKinds {
				clusterScoped[k] = true
			}
			// the sweep of the release namespace: list+delete of exactly these kinds, in the namespace only
			sweepRules := map[string]bool{}
			var deletable []string
			nodePatch, stopRules, leaseRule := false, 0, false
			for _, h := range hooks {
				var rules []rbacv1.PolicyRule
				switch {
				case h.kind() == "Role" && h.name() == cleanupName:
					rules = decode[rbacv1.Role](t, h.object).Rules
				case h.kind() == "ClusterRole" && h.name() == cleanupName+"-"+chartrender.Namespace:
					rules = decode[rbacv1.ClusterRole](t, h.object).Rules
				default:
					continue
				}
				for _, r := range rules {
					// stopping the operands first: list+deletecollection of DaemonSets, list+watch of pods, in the namespace
					if h.kind() == "Role" && (slices.Equal(r.Resources, []string{"daemonsets"}) && slices.Equal(r.Verbs, []string{"list", "deletecollection"}) ||
						slices.Equal(r.Resources, []string{"pods"}) && slices.Equal(r.Verbs, []string{"list", "watch"})) && len(r.ResourceNames) == 0 {
						stopRules++
						continue
					}
					// then removing the driver managers' Leases (found by their label): list+delete, in the namespace
					if h.kind() == "Role" && slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) &&
						slices.Equal(r.Resources, []string{"leases"}) && slices.Equal(r.Verbs, []string{"list", "delete"}) && len(r.ResourceNames) == 0 {
						leaseRule = true
						continue
					}
					if h.kind() == "Role" && slices.Equal(r.Verbs, []string{"list", "delete"}) && len(r.ResourceNames) == 0 {
						for _, res := range r.Resources {
							sweepRules[strings.Join(r.APIGroups, ",")+"/"+res] = true
						}
						continue
					}
					if slices.Equal(r.Resources, []string{"nodes"}) && h.kind() == "ClusterRole" {
						nodePatch = slices.Equal(r.Verbs, []string{"get", "list", "watch", "patch"}) && len(r.ResourceNames) == 0
						continue
					}
					if !slices.Equal(r.Verbs, []string{"delete"}) || len(r.ResourceNames) == 0 || len(r.Resources) != 1 {
						t.Errorf("%s %s: rule %s grants more than deleting named objects", h.kind(), h.name(), mustJSON(r))
						continue
					}
					kind := kindOf[r.Resources[0]]
					if clusterScoped[kind] != (h.kind() == "ClusterRole") {
						t.Errorf("%s %s: rule for %s in the wrong kind of role", h.kind(), h.name(), r.Resources[0])
					}
					for _, n := range r.ResourceNames {
						deletable = append(deletable, kind+"/"+n)
					}
				}
			}
			if !nodePatch {
				t.Error("the cleanup's ClusterRole does not allow exactly get/list/watch/patch on nodes")
			}
			if !leaseRule {
				t.Error("the cleanup's Role does not allow listing and deleting Leases in the release namespace (the driver managers')")
			}
			if stopRules != 2 {
				t.Errorf("the cleanup's Role has %d of the 2 rules that stop the operands first", stopRules)
			}
			if got := slices.Sorted(slices.Values(deletable)); !slices.Equal(got, want) {
				t.Errorf("the cleanup may delete:\n got  %v\n want %v", got, want)
			}
			wantSweep := []string{"/configmaps", "/serviceaccounts", "/services", "apps/deployments", "monitoring.coreos.com/prometheusrules",
				"monitoring.coreos.com/servicemonitors", "rbac.authorization.k8s.io/rolebindings", "rbac.authorization.k8s.io/roles"}
			if got := slices.Sorted(maps.Keys(sweepRules)); !slices.Equal(got, wantSweep) {
				t.Errorf("the cleanup's Role may list and delete %v in the namespace, want %v", got, wantSweep)
			}
		})
	}
}

// releaseClusterKinds are the cluster-scoped kinds of the release's own objects that the cleanup names
// (kube-gpu-stack.clusterObjects), by --delete kind.
var releaseClusterKinds = map[string]bool{"clusterrole": true, "clusterrolebinding": true, "deviceclass": true, "runtimeclass": true,
	"validatingadmissionpolicy": true, "validatingadmissionpolicybinding": true}

// TestCleanupNamesEveryClusterObject: `helm uninstall` deletes the last revision's manifest, and after a refused
// upgrade that is the refused one, so the cleanup names every cluster-scoped object any values render, whatever its
// own values: for every profile, each cluster-scoped release object (not a hook, not kept) is in the --delete list
// of the cleanup rendered with the smallest profile.
func TestCleanupNamesEveryClusterObject(t *testing.T) {
	t.Parallel()
	minimal := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")})
	var del []string
	for _, h := range hookObjects(t, minimal) {
		if h.kind() == "Job" && h.name() == cleanupName {
			del = podOf(t, h).flags("--delete")
		}
	}
	if len(del) == 0 {
		t.Fatal("no cleanup Job rendered")
	}
	checked := 0
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, "draDriver.enabled=true")) {
			kind := strings.ToLower(o.kind())
			m, _ := o.Raw["metadata"].(map[string]any)
			ann, _ := m["annotations"].(map[string]any)
			if !releaseClusterKinds[kind] || ann["helm.sh/hook"] != nil || ann["helm.sh/resource-policy"] == "keep" {
				continue
			}
			checked++
			if !slices.Contains(del, kind+"/"+o.name()) {
				t.Errorf("%s: %s %s is not named by the cleanup (kube-gpu-stack.clusterObjects): a refused upgrade that drops it would leave it behind on uninstall",
					p.name, o.kind(), o.name())
			}
		}
	}
	if checked == 0 {
		t.Fatal("no cluster-scoped object checked")
	}
}

// TestHookValues: the hooks values reach the hook objects: switches remove exactly their hook (the cleanup still
// names what an earlier revision's hooks left), timeouts move the binary's --timeout and the deadline, and
// scheduling merges with the globals as it does for operands. The pre-upgrade plan's --evict/--force follow
// driver.manager.gpuPodDeletion.
func TestHookValues(t *testing.T) {
	t.Parallel()
	profile := []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
	kinds := func(stream string) []string {
		var out []string
		for _, h := range hookObjects(t, stream) {
			if h.kind() != "NodeFeatureRule" {
				out = append(out, h.key())
			}
		}
		for _, o := range objects(t, stream) {
			if strings.HasPrefix(o.name(), testName) {
				out = append(out, "release:"+strings.ToLower(o.kind())+"/"+o.name())
			}
		}
		return slices.Sorted(slices.Values(out))
	}
	all := kinds(render(t, newestKube, profile))
	has := func(list []string, name string) bool {
		return slices.ContainsFunc(list, func(k string) bool { return strings.Contains(k, "/"+name) })
	}
	for _, tc := range []struct {
		set      string
		gone     string
		stayKeys []string
	}{
		{"hooks.validation.enabled=false", gateName, []string{cleanupName, testName, preUpgradeName}},
		{"hooks.test.enabled=false", testName, []string{gateName, cleanupName, preUpgradeName}},
		{"hooks.preUpgrade.enabled=false", preUpgradeName, []string{gateName, cleanupName, testName}},
		{"hooks.cleanup.enabled=false", cleanupName, []string{gateName, testName, preUpgradeName}},
	} {
		got := kinds(render(t, newestKube, profile, tc.set))
		if has(got, tc.gone) {
			t.Errorf("%s: still renders %s objects: %v", tc.set, tc.gone, got)
		}
		for _, k := range tc.stayKeys {
			if !has(got, k) {
				t.Errorf("%s: no %s objects left: %v", tc.set, k, got)
			}
		}
		if len(got) >= len(all) {
			t.Errorf("%s removed nothing", tc.set)
		}
		if tc.gone == gateName || tc.gone == preUpgradeName {
			for _, h := range hookObjects(t, render(t, newestKube, profile, tc.set)) {
				if h.kind() == "Job" && h.name() == cleanupName && !slices.Contains(podOf(t, h).flags("--delete"), "job/"+tc.gone) {
					t.Errorf("%s: the cleanup no longer deletes a %s Job an earlier revision left", tc.set, tc.gone)
				}
			}
		}
	}

	overlay := writeTemp(t, "hooks.yaml", `global:
  nodeSelector: {kubernetes.io/os: linux, pool: gpu}
  tolerations: [{key: global.example/taint, operator: Exists}]
hooks:
  validation: {timeoutSeconds: 600, installTimeoutSeconds: 900}
  test: {timeoutSeconds: 45}
  preUpgrade: {timeoutSeconds: 90}
  cleanup: {timeoutSeconds: 200}
  nodeSelector: {pool: system}
  tolerations: [{key: hooks.example/taint, operator: Exists}]
  priorityClassName: hook-priority
  resources: {requests: {cpu: 5m, memory: 32Mi}, limits: {memory: 128Mi}}
`)
	// an install render: the gate takes installTimeoutSeconds (TestFirstInstallOutlastsTheDriverBuild renders the upgrade)
	deadlines := map[string]int64{gateName: 930, testName: 75, preUpgradeName: 120, cleanupName: 230}
	timeouts := map[string]string{gateName: "900s", testName: "45s"}
	seen := 0
	for _, h := range hookObjects(t, render(t, newestKube, append(profile, overlay))) {
		if h.kind() != "Job" && h.kind() != "Pod" {
			continue
		}
		seen++
		pod := podOf(t, h)
		if d := pod.deadline(); d == nil || *d != deadlines[h.name()] {
			t.Errorf("%s: activeDeadlineSeconds %v, want %d", h.key(), d, deadlines[h.name()])
		}
		if pod.flag("--timeout") != timeouts[h.name()] {
			t.Errorf("%s: --timeout %q, want %q", h.key(), pod.flag("--timeout"), timeouts[h.name()])
		}
		if want := map[string]string{"kubernetes.io/os": "linux", "pool": "system"}; !maps.Equal(pod.spec.NodeSelector, want) {
			t.Errorf("%s: nodeSelector %v, want %v (hooks' keys over the global ones)", h.key(), pod.spec.NodeSelector, want)
		}
		var tols []string
		for _, tol := range pod.spec.Tolerations {
			tols = append(tols, tol.Key)
		}
		want := []string{"global.example/taint", "hooks.example/taint"}
		if h.kind() == "Pod" {
			// then the API server's default NoExecute tolerations, as its admission would add them to a bare Pod
			want = append(want, "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
		}
		if !slices.Equal(tols, want) {
			t.Errorf("%s: tolerations %v, want the global ones then the hooks' ones (%v)", h.key(), tols, want)
		}
		if pod.spec.PriorityClassName != "hook-priority" {
			t.Errorf("%s: priorityClassName %q", h.key(), pod.spec.PriorityClassName)
		}
		if got := pod.c.Resources.Limits.Memory().String(); got != "128Mi" {
			t.Errorf("%s: memory limit %s, want 128Mi", h.key(), got)
		}
	}
	if seen != 4 {
		t.Errorf("found %d hook pods, want 4", seen)
	}

	// the plan's --evict follows the driver manager's GPU pod eviction switch; --force is the plan's own (the
	// eviction's force is about pods without a controller, not PDBs)
	for _, tc := range []struct {
		set          []string
		evict, force string
	}{
		{nil, "true", "false"},
		{[]string{"driver.manager.gpuPodDeletion.enabled=false"}, "false", "false"},
		{[]string{"driver.manager.gpuPodDeletion.force=true"}, "true", "false"},
		{[]string{"hooks.preUpgrade.force=true"}, "true", "true"},
		// without the driver chart no node is planned; the flags keep the binary's defaults
		{[]string{"driver.enabled=false"}, "true", "false"},
	} {
		found := false
		for _, h := range hookObjects(t, render(t, newestKube, profile, tc.set...)) {
			if h.kind() != "Job" || h.name() != preUpgradeName {
				continue
			}
			found = true
			pod := podOf(t, h)
			if e, f := boolFlag(pod, "--evict"), boolFlag(pod, "--force"); e != tc.evict || f != tc.force {
				t.Errorf("%v: --evict=%s --force=%s, want --evict=%s --force=%s", tc.set, e, f, tc.evict, tc.force)
			}
		}
		if !found {
			t.Errorf("%v: no pre-upgrade Job", tc.set)
		}
	}

	// operands keep global.priorityClassName; hooks do not take it
	for _, h := range hookObjects(t, render(t, newestKube, profile)) {
		if h.kind() == "Job" || h.kind() == "Pod" {
			if pc := podOf(t, h).spec.PriorityClassName; pc != "" {
				t.Errorf("%s: priorityClassName %q by default, want none", h.key(), pc)
			}
		}
	}
}

// TestValidatorCUDAWorkloadImage: the CUDA check and the plugin check (its optional workload runs the same sample)
// are told which workload image to run, from validator.cuda.workloadImage, through global.imageRegistry like every
// other image.
func TestValidatorCUDAWorkloadImage(t *testing.T) {
	t.Parallel()
	image := func(stream, container string) string {
		t.Helper()
		for _, o := range objects(t, stream) {
			if o.kind() != "DaemonSet" || o.name() != "nvidia-operator-validator" {
				continue
			}
			ds := decode[struct {
				Spec struct {
					Template corev1.PodTemplateSpec `json:"template"`
				} `json:"spec"`
			}](t, o)
			for _, c := range ds.Spec.Template.Spec.InitContainers {
				if c.Name == container {
					for _, e := range c.Env {
						if e.Name == "CUDA_WORKLOAD_IMAGE" {
							return e.Value
						}
					}
				}
			}
		}
		t.Fatalf("no %s container with CUDA_WORKLOAD_IMAGE", container)
		return ""
	}
	profile := []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"},
		{[]string{"global.imageRegistry=mirror.example:5000"}, "mirror.example:5000/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0-ubuntu22.04"},
		{[]string{"validator.cuda.workloadImage.repository=team/cuda", "validator.cuda.workloadImage.tag=v1",
			"validator.cuda.workloadImage.digest=sha256:0123"}, "nvcr.io/team/cuda:v1@sha256:0123"},
	} {
		stream := render(t, newestKube, profile, tc.set...)
		for _, c := range []string{"cuda-validation", "plugin-validation"} {
			if got := image(stream, c); got != tc.want {
				t.Errorf("%v: %s's CUDA_WORKLOAD_IMAGE %s, want %s", tc.set, c, got, tc.want)
			}
		}
	}
}
