package chart

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanagercli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestValidatorChecksMayRecordOnTheirNode: a validator check that knows its node (NODE_NAME) records its outcome
// there, so its pod's ServiceAccount must be allowed to get and patch Nodes; a check without NODE_NAME records
// nothing and needs no rule. The API refuses a patch a rule does not allow only on a running node, where it is a
// logged, lost explanation: this catches it at render.
func TestValidatorChecksMayRecordOnTheirNode(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, everythingOn...))
		may := nodeVerbsByServiceAccount(objs)
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				sa, _ := ps["serviceAccountName"].(string)
				for _, c := range containersOf(ps) {
					if !recordsOnNode(c) {
						continue
					}
					checked++
					for _, verb := range []string{"get", "patch"} {
						if !may[sa][verb] {
							t.Errorf("%s: %s container %s records its check on the Node (NODE_NAME set) but ServiceAccount %q may not %s nodes",
								p.name, where, c["name"], sa, verb)
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no validator check that records on its Node was found: is the command matched?")
	}
}

// recordsOnNode: the container runs a validator check (not the status-file helpers) with NODE_NAME set.
func recordsOnNode(c map[string]any) bool {
	cmd, _ := c["command"].([]any)
	// the health agent writes the node's status and taints, not a check's outcome: TestHealthAgentRendersThePolicy
	// holds its rules
	if len(cmd) < 2 || cmd[0] != "validator" || slices.Contains([]any{"wait", "cleanup", "ready", "metrics", "health"}, cmd[1]) {
		return false
	}
	env, _ := c["env"].([]any)
	return slices.ContainsFunc(env, func(e any) bool { m, _ := e.(map[string]any); return m["name"] == "NODE_NAME" })
}

// nodeVerbsByServiceAccount: the verbs on core nodes each ServiceAccount gets through the rendered ClusterRoles.
func nodeVerbsByServiceAccount(objs []object) map[string]map[string]bool {
	verbs := map[string][]string{}
	for _, o := range objs {
		if o.kind() != "ClusterRole" {
			continue
		}
		rules, _ := o.Raw["rules"].([]any)
		for _, r := range rules {
			rule, _ := r.(map[string]any)
			if has(rule["apiGroups"], "") && has(rule["resources"], "nodes") {
				for _, v := range rule["verbs"].([]any) {
					verbs[o.name()] = append(verbs[o.name()], fmt.Sprint(v))
				}
			}
		}
	}
	out := map[string]map[string]bool{}
	for _, o := range objs {
		if o.kind() != "ClusterRoleBinding" {
			continue
		}
		ref, _ := o.Raw["roleRef"].(map[string]any)
		subjects, _ := o.Raw["subjects"].([]any)
		for _, s := range subjects {
			sub, _ := s.(map[string]any)
			if sub["kind"] != "ServiceAccount" {
				continue
			}
			name := fmt.Sprint(sub["name"])
			if out[name] == nil {
				out[name] = map[string]bool{}
			}
			for _, v := range verbs[fmt.Sprint(ref["name"])] {
				out[name][v] = true
			}
		}
	}
	return out
}

func has(list any, want string) bool {
	l, _ := list.([]any)
	return slices.ContainsFunc(l, func(x any) bool { return strings.EqualFold(fmt.Sprint(x), want) || fmt.Sprint(x) == "*" })
}

// rule is one granted (API group, resource[/subresource], verb), and where: "" for a ClusterRole, else the Role's
// namespace.
type rule struct{ namespace, group, resource, verb string }

// rulesOf returns what the rendered chart grants ServiceAccount sa of the release namespace, through ClusterRole
// and Role bindings.
func rulesOf(objs []object, sa string) map[rule]bool {
	roles := map[string][]any{} // kind/name -> rules
	for _, o := range objs {
		if k := o.kind(); k == "ClusterRole" || k == "Role" {
			roles[k+"/"+o.name()], _ = o.Raw["rules"].([]any)
		}
	}
	out := map[rule]bool{}
	for _, o := range objs {
		k := o.kind()
		if k != "ClusterRoleBinding" && k != "RoleBinding" {
			continue
		}
		subjects, _ := o.Raw["subjects"].([]any)
		if !slices.ContainsFunc(subjects, func(s any) bool {
			m, _ := s.(map[string]any)
			return m["kind"] == "ServiceAccount" && m["name"] == sa && m["namespace"] == chartrender.Namespace
		}) {
			continue
		}
		ref, _ := o.Raw["roleRef"].(map[string]any)
		ns := ""
		if k == "RoleBinding" {
			ns = chartrender.Namespace
		}
		for _, r := range roles[fmt.Sprint(ref["kind"])+"/"+fmt.Sprint(ref["name"])] {
			m, _ := r.(map[string]any)
			for _, g := range m["apiGroups"].([]any) {
				for _, res := range m["resources"].([]any) {
					for _, v := range m["verbs"].([]any) {
						out[rule{ns, fmt.Sprint(g), fmt.Sprint(res), fmt.Sprint(v)}] = true
					}
				}
			}
		}
	}
	return out
}

// grants: a request (namespace "" for cluster-scoped or all namespaces) is granted by the rules.
func grants(rules map[rule]bool, r rule) bool {
	for g := range rules {
		if (g.namespace == "" || g.namespace == r.namespace) && g.group == r.group && g.resource == r.resource && g.verb == r.verb {
			return true
		}
	}
	return false
}

// driverManagerAccounts are the ServiceAccounts of the pods that run driver-manager (its init container and,
// for the driver and the vGPU manager, its gate sidecar).
var driverManagerAccounts = []string{"nvidia-driver", "nvidia-vgpu-manager", "nvidia-vfio-manager"}

// TestDriverManagerRBACIsWhatItCalls runs the driver manager through a driver change on a node with a GPU pod to
// evict (a DaemonSet's pod and a pod with a resource claim beside it), then the gate that uncordons it, against a
// fake API whose every request is checked against what the rendered chart grants the driver's ServiceAccount: the
// chart grants everything the code calls. And it grants nothing the code never calls: no nodes update (it patches),
// no pods delete (it evicts), no pods get; Leases only in the release namespace.
func TestDriverManagerRBACIsWhatItCalls(t *testing.T) {
	t.Parallel()
	// mixed: the driver, the vGPU manager and the VFIO manager all render
	objs := objects(t, render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml")}))
	for _, sa := range driverManagerAccounts {
		if len(rulesOf(objs, sa)) == 0 {
			t.Fatalf("no rules rendered for ServiceAccount %s", sa)
		}
	}
	granted := rulesOf(objs, "nvidia-driver")
	if len(granted) == 0 {
		t.Fatal("no rules rendered for ServiceAccount nvidia-driver")
	}
	const node, ns = "gpu-1", chartrender.Namespace
	gpuPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "train", UID: "r", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
	claimPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dra", Namespace: "ml"},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("other-driver-claim")}}}}
	dsPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-x", Namespace: "kube-system",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "u", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "kube-system"}}
	// planned, so that the run takes a slot of its pool (package slots); a full pool's wait, which also lists and
	// watches the slots Lease, is a path this run does not take
	mark := canary.Mark{Pool: "default", Plan: "2026-09-01T11:59:00Z", Canary: map[string]string{}, MaxUnavailable: 1}.Format()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels:      map[string]string{"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true", nodestate.UpgradeStateLabel: "upgrade-required"},
		Annotations: map[string]string{canary.MarkAnnotation: mark}}},
		gpuPod, claimPod, dsPod, ds)
	client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}, {Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}},
		{GroupVersion: "policy/v1", APIResources: []metav1.APIResource{{Name: "poddisruptionbudgets", Kind: "PodDisruptionBudget"}}},
	}
	var mu sync.Mutex
	used := map[rule]bool{}
	var denied []string
	recording := false // only the driver manager's and the gate's requests, not the test's own
	client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := rule{a.GetNamespace(), a.GetResource().Group, a.GetResource().Resource, a.GetVerb()}
		if s := a.GetSubresource(); s != "" {
			r.resource += "/" + s
		}
		mu.Lock()
		defer mu.Unlock()
		if !recording || r.resource == "resource" { // discovery: every authenticated user may
			return false, nil, nil
		}
		used[r] = true
		if !grants(granted, r) {
			denied = append(denied, fmt.Sprintf("%s %s %s (namespace %q)", r.verb, r.group, r.resource, r.namespace))
		}
		if r.resource == "pods/eviction" { // the pod goes, as the API server's eviction deletes it
			ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
			return true, nil, client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ev.Namespace, ev.Name)
		}
		return false, nil, nil
	})
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		r := rule{a.GetNamespace(), a.GetResource().Group, a.GetResource().Resource, "watch"}
		mu.Lock()
		defer mu.Unlock()
		if !recording {
			return false, nil, nil
		}
		used[r] = true
		if !grants(granted, r) {
			denied = append(denied, fmt.Sprintf("watch %s %s (namespace %q)", r.group, r.resource, r.namespace))
		}
		return false, nil, nil
	})

	host := kmodtest.New(t)
	host.LoadDriver()
	host.DriverState(strings.Repeat("1", 64))
	at := time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)
	o := &drivermanager.Options{Client: client, NodeName: node, Namespace: ns, Host: host.Host(), Digest: strings.Repeat("2", 64),
		Eviction: drivermanager.Eviction{Enabled: true, Timeout: 10 * time.Second}, OperandTimeout: 5 * time.Second,
		Now: func() time.Time { return at }, Lease: drivermanager.Lease{Identity: "nvidia-driver-daemonset-x"}}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	record := func(on bool) { mu.Lock(); recording = on; mu.Unlock() }
	var out bytes.Buffer
	record(true)
	if err := o.Run(t.Context(), &out); err != nil {
		t.Fatalf("driver manager: %v\n%s", err, out.String())
	}
	record(false)
	if _, err := client.CoreV1().Pods("ml").Get(t.Context(), "train", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the GPU pod was not evicted: %v", err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-operator-validator-x", Namespace: ns, Labels: map[string]string{drivermanager.ComponentLabel: drivermanager.DefaultValidatorComponent}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.NewTime(at.Add(5 * time.Second))}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gate := drivermanager.UncordonOptions{Client: client, NodeName: node, Namespace: ns, Timeout: 5 * time.Second, Now: func() time.Time { return at.Add(10 * time.Second) }}
	gate.Complete()
	record(true)
	if err := gate.Run(t.Context(), &out); err != nil {
		t.Fatalf("gate: %v\n%s", err, out.String())
	}
	record(false)

	// the gate as the old pod's agent: its DaemonSet now installs another driver, so it empties the node and evicts
	// its own pod (drivermanager/replace.go)
	driverSpec := func(digest string) corev1.PodSpec {
		return corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: "driver-manager", Command: []string{"driver-manager", "uninstall-driver"},
				Env: []corev1.EnvVar{{Name: "ENABLE_GPU_POD_EVICTION", Value: "true"}, {Name: "EVICTION_TIMEOUT_SECONDS", Value: "10s"}}}},
			Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Env: []corev1.EnvVar{{Name: upgradeplan.DigestEnv, Value: digest}}}}}
	}
	driverDS := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-daemonset-x", Namespace: ns, UID: "driver-ds"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nvidia-driver-daemonset-x"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "nvidia-driver-daemonset-x"}},
				Spec: driverSpec(strings.Repeat("3", 64))}}}
	driverPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-driver-daemonset-x-1", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: driverDS.Name, UID: driverDS.UID, Controller: ptr.To(true)}}},
		Spec: driverSpec(strings.Repeat("2", 64))}
	gpuPod2 := gpuPod.DeepCopy()
	gpuPod2.Name, gpuPod2.ResourceVersion = "train-2", ""
	// the paused validator's pod goes, as its DaemonSet would take it away
	if err := client.CoreV1().Pods(ns).Delete(t.Context(), "nvidia-operator-validator-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{driverDS, driverPod, gpuPod2} {
		if err := client.Tracker().Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	agent := drivermanager.UncordonOptions{Client: client, NodeName: node, Namespace: ns, PodName: driverPod.Name, Replace: true,
		Timeout: 5 * time.Second, Now: func() time.Time { return at.Add(20 * time.Second) }, ManagerOptions: drivermanagercli.OptionsFromEnv}
	agent.Complete()
	actx, stopAgent := context.WithCancel(t.Context())
	agentDone := make(chan error, 1)
	record(true)
	go func() { agentDone <- agent.Run(actx, &out) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// the tracker, not the client: the test's own reads are not the agent's
		if _, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), ns, driverPod.Name); apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			stopAgent()
			t.Fatalf("the agent never evicted its driver pod:\n%s", out.String())
		}
	}
	stopAgent()
	if err := <-agentDone; err != nil {
		t.Fatalf("agent: %v\n%s", err, out.String())
	}
	record(false)
	mu.Lock()
	defer mu.Unlock()
	if len(denied) > 0 {
		t.Errorf("the driver manager calls what ServiceAccount nvidia-driver is not granted:\n%s", strings.Join(denied, "\n"))
	}
	for _, want := range []rule{{"", "", "nodes", "patch"}, {"ml", "", "pods/eviction", "create"}, {ns, "coordination.k8s.io", "leases", "update"},
		{"kube-system", "apps", "daemonsets", "get"}, {"ml", "resource.k8s.io", "resourceclaims", "list"},
		{ns, "apps", "daemonsets", "get"}, {ns, "apps", "controllerrevisions", "watch"}, {ns, "", "pods/eviction", "create"}} {
		if !used[want] {
			t.Errorf("the run never called %s %s %s in %q: is the scenario still exercising it?", want.verb, want.group, want.resource, want.namespace)
		}
	}

	// nothing more, for every account that runs the driver manager
	called := map[rule]bool{} // what the run called, wherever
	for u := range used {
		called[rule{"", u.group, u.resource, u.verb}] = true
	}
	for _, sa := range driverManagerAccounts {
		for r := range rulesOf(objs, sa) {
			switch {
			case r.resource == "nodes" && r.verb == "update", r.resource == "pods" && r.verb != "list" && r.verb != "watch":
				t.Errorf("%s is granted %s %s: the driver manager never calls it", sa, r.verb, r.resource)
			case r.resource == "leases":
				if r.namespace == "" || !slices.Contains([]string{"get", "list", "watch", "create", "update"}, r.verb) {
					t.Errorf("%s is granted leases %s %s: want get, list, watch, create and update in the release namespace only", sa, r.verb, orCluster(r.namespace))
				}
			case r.group == "apps" && r.resource == "daemonsets" && r.verb == "list" && r.namespace == ns:
				// a driver pod being deleted lists the driver DaemonSets for the one that takes its node over
				// (stopguard.go): tests/node's driver pod deleted by hand runs it with the chart's account
			case r.group == "policy" && r.resource == "poddisruptionbudgets",
				r.resource == "nodes" && (r.verb == "list" || r.verb == "watch"):
				// budgets are watched only once one refuses an eviction (gpudrain), the node only while it is
				// labelled to skip driver upgrades (the manager waits for the label to go): paths this run does not take
			case !called[rule{"", r.group, r.resource, r.verb}]:
				t.Errorf("%s is granted %s %s/%s %s, which the driver manager never called", sa, r.verb, r.group, r.resource, orCluster(r.namespace))
			}
		}
	}
}

func orCluster(ns string) string {
	if ns == "" {
		return "cluster-wide"
	}
	return "in " + ns
}

// TestValidatorRBACIsWhatItCalls: the validator creates, lists, watches and deletes its workload pods in the
// release namespace and nothing else there; its workload pods' account is granted nothing.
func TestValidatorRBACIsWhatItCalls(t *testing.T) {
	t.Parallel()
	objs := objects(t, render(t, newestKube, nil))
	var ns []string
	for r := range rulesOf(objs, "nvidia-operator-validator") {
		if r.namespace != "" {
			ns = append(ns, r.verb+" "+r.group+"/"+r.resource)
		}
	}
	slices.Sort(ns)
	if want := []string{"create /pods", "delete /pods", "list /pods", "watch /pods"}; !slices.Equal(ns, want) {
		t.Errorf("validator's namespaced rights %v, want %v", ns, want)
	}
	if got := rulesOf(objs, "nvidia-validator-workload"); len(got) != 0 {
		t.Errorf("the validator's workload account is granted %v, want nothing", got)
	}
	found := false
	for _, o := range objs {
		if o.kind() == "ServiceAccount" && o.name() == "nvidia-validator-workload" {
			found = true
		}
	}
	if !found {
		t.Error("no ServiceAccount nvidia-validator-workload rendered")
	}
}

// TestValidatorDRARightsAreWhatTheDRACheckCalls: with a pool on DRA the validator also lists ResourceSlices
// cluster-wide and creates and deletes ResourceClaims in the release namespace (the dra check), and nothing more.
func TestValidatorDRARightsAreWhatTheDRACheckCalls(t *testing.T) {
	t.Parallel()
	objs := objects(t, render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "dra-mixed.yaml")}))
	var dra []string
	for r := range rulesOf(objs, "nvidia-operator-validator") {
		if r.group == "resource.k8s.io" {
			where := "cluster"
			if r.namespace != "" {
				where = "namespace"
			}
			dra = append(dra, where+" "+r.verb+" "+r.resource)
		}
	}
	slices.Sort(dra)
	if want := []string{"cluster list resourceslices", "namespace create resourceclaims", "namespace delete resourceclaims"}; !slices.Equal(dra, want) {
		t.Errorf("validator's resource.k8s.io rights %v, want %v", dra, want)
	}
}

// nodeLocalAccounts: the ServiceAccounts of the rendered DaemonSets' pods (one per node: node-local) whose rendered
// RBAC may patch or update Nodes or their status, or write NodeFeatures (whose node nfd-master labels), each with
// the DaemonSet that makes it node-local. Derived from the
// render, not from a list of commands: a third-party operand that writes its node counts as much as the stack's own.
func nodeLocalAccounts(objs []object) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		if o.kind() != "DaemonSet" {
			continue
		}
		for where, ps := range podSpecs(o) {
			sa, _ := ps["serviceAccountName"].(string)
			if sa == "" {
				continue
			}
			for r := range rulesOf(objs, sa) {
				if r.group == "" && (r.resource == "nodes" || r.resource == "nodes/status") && (r.verb == "patch" || r.verb == "update" || r.verb == "*") {
					out[sa] = fmt.Sprintf("%s (it may %s %s)", where, r.verb, r.resource)
				}
				// nfd-master labels the node a NodeFeature names: writing one is writing that node's labels
				if r.group == "nfd.k8s-sigs.io" && r.resource == "nodefeatures" && r.verb != "get" && r.verb != "list" && r.verb != "watch" {
					out[sa] = fmt.Sprintf("%s (it may %s %s)", where, r.verb, r.resource)
				}
			}
		}
	}
	return out
}

// TestNodeLocalAccountsAreHeldToTheirNode: the rendered admission policy matches every ServiceAccount of a
// DaemonSet whose RBAC may write Nodes (each means its own node only: root on one node must not reach others), and
// keeps the validator's pods on the account its workload env names. It is rendered only where the API is served
// and admissionPolicy.enabled is true. Not parallel: it narrows chartrender.APIVersions for a render, so it runs
// before the package's parallel tests start.
func TestNodeLocalAccountsAreHeldToTheirNode(t *testing.T) {
	policyOf := func(objs []object) (policy map[string]any, bound bool) {
		for _, o := range objs {
			switch o.kind() {
			case "ValidatingAdmissionPolicy":
				if strings.HasPrefix(o.name(), "kube-gpu-stack-node-scope-") { // the hooks' policy is the other
					policy = o.Raw
				}
			case "ValidatingAdmissionPolicyBinding":
				if strings.HasPrefix(o.name(), "kube-gpu-stack-node-scope-") {
					spec, _ := o.Raw["spec"].(map[string]any)
					bound = fmt.Sprint(spec["validationActions"]) == "[Deny]"
				}
			}
		}
		return policy, bound
	}
	checked := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, everythingOn...))
		policy, bound := policyOf(objs)
		if policy == nil || !bound {
			t.Errorf("%s: no ValidatingAdmissionPolicy with a Deny binding rendered", p.name)
			continue
		}
		text := fmt.Sprint(policy["spec"])
		for sa, why := range nodeLocalAccounts(objs) {
			checked++
			if !strings.Contains(text, "'system:serviceaccount:"+chartrender.Namespace+":"+sa+"'") {
				t.Errorf("%s: %s runs as %s, which the admission policy does not hold to its node", p.name, why, sa)
			}
		}
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					env, _ := c["env"].([]any)
					for _, e := range env {
						m, _ := e.(map[string]any)
						if m["name"] == "VALIDATOR_WORKLOAD_SERVICE_ACCOUNT" && !strings.Contains(text, "object.spec.serviceAccountName == '"+fmt.Sprint(m["value"])+"'") {
							t.Errorf("%s: %s container %s runs workload pods as %v, which the admission policy does not allow", p.name, where, c["name"], m["value"])
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no node-local ServiceAccount found: are the commands matched?")
	}
	// off by the values key, and where the API server does not serve the API
	if policy, _ := policyOf(objects(t, render(t, newestKube, nil, "admissionPolicy.enabled=false"))); policy != nil {
		t.Error("admissionPolicy.enabled=false still renders the policy")
	}
	// (a render assumes chartrender.APIVersions; this test is not parallel, so none renders meanwhile)
	served := chartrender.APIVersions
	chartrender.APIVersions = slices.DeleteFunc(slices.Clone(served), func(v string) bool { return strings.HasPrefix(v, "admissionregistration.k8s.io/") })
	stream, err := renderErr(t, newestKube, nil)
	chartrender.APIVersions = served
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stream, "kind: ValidatingAdmissionPolicy") {
		t.Error("the policy renders although the API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy")
	}
}

// TestValidatorRBAC: the validators may do what their checks do on the cluster: the operator validator lists pods
// in every namespace (the plugin check sums the GPU requests of its node's pods) and patches its Node; the sandbox
// validator records its checks' outcomes on its Node.
func TestValidatorRBAC(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml")})
	for _, tc := range []struct {
		sa   string
		need [][2]string
	}{
		{"nvidia-operator-validator", [][2]string{{"nodes", "get"}, {"nodes", "patch"}, {"pods", "list"}}},
		{"nvidia-sandbox-validator", [][2]string{{"nodes", "get"}, {"nodes", "list"}, {"nodes", "watch"}, {"nodes", "patch"}}},
	} {
		rules := rulesFor(t, stream, tc.sa)
		if len(rules) == 0 {
			t.Errorf("%s: no ClusterRole bound", tc.sa)
		}
		for _, n := range tc.need {
			if !allows(rules, "", n[0], n[1]) {
				t.Errorf("%s may not %s %s cluster-wide", tc.sa, n[1], n[0])
			}
		}
	}
}

// TestDriverMayEvictOnlyWithEvictionOn: the driver's account may evict pods (and read what a drain reads: budgets,
// DaemonSets) only while GPU pod eviction or auto-drain is on; with both off it keeps what the manager calls anyway
// (its node, pods on it, DRA claims before it pauses the DRA kubelet plugin) and cannot evict any pod in the cluster.
func TestDriverMayEvictOnlyWithEvictionOn(t *testing.T) {
	t.Parallel()
	evicts := func(set ...string) (evict, drainReads, claims, pods bool) {
		rules := rulesOf(objects(t, render(t, newestKube, nil, set...)), "nvidia-driver")
		return rules[rule{"", "", "pods/eviction", "create"}],
			rules[rule{"", "policy", "poddisruptionbudgets", "watch"}] || rules[rule{"", "apps", "daemonsets", "get"}],
			rules[rule{"", "resource.k8s.io", "resourceclaims", "list"}],
			rules[rule{"", "", "pods", "list"}]
	}
	for _, tc := range []struct {
		name string
		set  []string
		want bool
	}{
		{"defaults (eviction on)", nil, true},
		{"drain alone", []string{"driver.manager.gpuPodDeletion.enabled=false", "driver.manager.drain.enabled=true"}, true},
		{"both off", []string{"driver.manager.gpuPodDeletion.enabled=false", "driver.manager.drain.enabled=false"}, false},
	} {
		evict, drainReads, claims, pods := evicts(tc.set...)
		if evict != tc.want || drainReads != tc.want {
			t.Errorf("%s: pods/eviction create %v, budgets or DaemonSets read %v; want %v", tc.name, evict, drainReads, tc.want)
		}
		if !claims || !pods {
			t.Errorf("%s: resourceclaims list %v, pods list %v; want both (the manager calls them anyway)", tc.name, claims, pods)
		}
	}
}

// TestNodeWideWritersPreferNodesWithoutGPUs: every pod that is not a node operand (a Deployment's, a hook Job's, the
// helm test Pod) whose account may write Nodes writes any Node, so root on the node it runs on reaches every node:
// by default it prefers (or requires) nodes without nvidia.com/gpu.present=true, where no privileged third-party GPU
// code runs. Found from each profile's render, with every optional operand on.
func TestNodeWideWritersPreferNodesWithoutGPUs(t *testing.T) {
	t.Parallel()
	awayFromGPUs := func(ps map[string]any) bool {
		aff, _ := ps["affinity"].(map[string]any)
		na, _ := aff["nodeAffinity"].(map[string]any)
		var terms []any
		if req, ok := na["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any); ok {
			terms, _ = req["nodeSelectorTerms"].([]any)
		}
		pref, _ := na["preferredDuringSchedulingIgnoredDuringExecution"].([]any)
		for _, p := range pref {
			m, _ := p.(map[string]any)
			terms = append(terms, m["preference"])
		}
		for _, term := range terms {
			m, _ := term.(map[string]any)
			exprs, _ := m["matchExpressions"].([]any)
			for _, e := range exprs {
				r, _ := e.(map[string]any)
				if r["key"] == "nvidia.com/gpu.present" && (r["operator"] == "DoesNotExist" || r["operator"] == "NotIn" && fmt.Sprint(r["values"]) == "[true]") {
					return true
				}
			}
		}
		return false
	}
	checked := map[string]bool{}
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, everythingOn...))
		for _, o := range objs {
			if o.kind() == "DaemonSet" {
				continue
			}
			for where, ps := range podSpecs(o) {
				sa, _ := ps["serviceAccountName"].(string)
				writes := false
				for r := range rulesOf(objs, sa) {
					writes = writes || r.group == "" && (r.resource == "nodes" || r.resource == "nodes/status") && (r.verb == "patch" || r.verb == "update" || r.verb == "*")
				}
				if !writes {
					continue
				}
				checked[where] = true
				if !awayFromGPUs(ps) {
					t.Errorf("%s: %s runs as %s, which may write every Node, and does not keep off GPU nodes", p.name, where, sa)
				}
			}
		}
	}
	for _, want := range []string{"Deployment/" + "gpu-node-feature-discovery-master", "Job/" + preUpgradeName, "Job/" + cleanupName} {
		if !checked[want] {
			t.Errorf("%s was not among the node-wide writers found (%v)", want, slices.Sorted(maps.Keys(checked)))
		}
	}
}
