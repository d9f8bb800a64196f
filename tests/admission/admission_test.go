// Package admission proves, on a real local API server, what the chart grants the node-local service accounts:
// their RBAC as rendered, and the ValidatingAdmissionPolicy that keeps each to its own node (the node claim of a
// token bound to its pod) and keeps the validator's pods on its no-rights workload account. The GPU health agent's
// account writes its condition and taint here with the requests the agent sends (tests/gpuhealth runs the agent).
//
//	go test ./tests/admission/
package admission

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

var kube *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.Main(m, "admission", cluster.Options{Log: cluster.LogSink()}, func(c *cluster.Cluster) { kube = c }))
}

const (
	ns            = chartrender.Namespace
	driverSA      = "nvidia-driver"
	validatorSA   = "nvidia-operator-validator"
	workloadSA    = "nvidia-validator-workload"
	healthSA      = "nvidia-gpu-health"
	nodeA, nodeB  = "gpu-a", "gpu-b"
	nodeNameClaim = "authentication.kubernetes.io/node-name"
	// maintenanceLabel is the release's opt-out label for remediation controllers (global.health.maintenance.label)
	maintenanceLabel = "remediation.example.com/skip"
)

// installed: the rendered chart's objects this package checks, applied once: the node-local accounts and their
// roles, and the admission policy with its binding.
var installed = false

func install(t *testing.T) {
	t.Helper()
	if installed {
		return
	}
	ctx := t.Context()
	// the GPU health agent and its taint on, so its account is rendered and held to its node too, and with it the
	// driver's maintenance mark (condition and an opt-out label of another namespace); the DRA driver on,
	// so the policy holds its ComputeDomain controller
	// and kata sandboxes on, so it holds the kata plugin's GFD pods
	stream, err := chartrender.RenderRepo(ctx, nil, []string{"global.health.nodeCondition.enabled=true", "global.health.taint.enabled=true",
		"global.health.maintenance.label=" + maintenanceLabel + "=true", "draDriver.enabled=true",
		"global.sandboxWorkloads.enabled=true", "global.sandboxWorkloads.mode=kata"})
	if err != nil {
		t.Fatal(err)
	}
	c := kube.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	ours := map[string]bool{driverSA: true, validatorSA: true, workloadSA: true, healthSA: true, workerSA: true, gfdSA: true, cdDaemonSA: true, cdControllerSA: true, kataSA: true,
		planSA: true, gateSA: true}
	nodeWriters = map[string]string{}
	// the operands that write their node in other profiles: the CC and vGPU device managers, the DRA kubelet plugin
	streams := []string{stream}
	for _, profile := range []string{"confidential.yaml", "dra.yaml"} {
		other, err := chartrender.RenderRepo(ctx, []string{filepath.Join(chartrender.RepoRoot(), "values", profile)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, other)
	}
	for _, s := range streams {
		for sa, verb := range nodeWritingAccounts(t, s) {
			ours[sa], nodeWriters[sa] = true, verb
		}
	}
	policies := 0
	for i, s := range streams {
		policies += apply(t, s, ours, i == 0)
	}
	if policies != 2 {
		t.Fatalf("%d ValidatingAdmissionPolicies rendered, want 2 (the node-local accounts', the hooks')", policies)
	}
	for _, n := range []string{nodeA, nodeB} {
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	installed = true
}

// nodeWriters are the DaemonSet accounts of the renders whose RBAC may write Nodes, each with the verb it has on
// nodes (patch, else update; "" when it may write only nodes/status).
var nodeWriters map[string]string

// nodeWritingAccounts finds, in a render, the ServiceAccounts of DaemonSets whose ClusterRoles may patch or update
// nodes or nodes/status (as tests/chart TestNodeLocalAccountsAreHeldToTheirNode does), each with its verb on nodes.
func nodeWritingAccounts(t *testing.T, stream string) map[string]string {
	t.Helper()
	var dss []*appsv1.DaemonSet
	roles := map[string]*rbacv1.ClusterRole{}
	var bindings []*rbacv1.ClusterRoleBinding
	for _, doc := range strings.Split(stream, "\n---") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			continue
		}
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			dss = append(dss, o)
			if o.Spec.Template.Spec.ServiceAccountName == kataSA && len(o.Spec.Template.Spec.Containers) > 0 {
				kataImage = o.Spec.Template.Spec.Containers[0].Image
			}
		case *rbacv1.ClusterRole:
			roles[o.Name] = o
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, o)
		}
	}
	out := map[string]string{}
	for _, ds := range dss {
		sa := ds.Spec.Template.Spec.ServiceAccountName
		writes, verb := false, ""
		for _, b := range bindings {
			r := roles[b.RoleRef.Name]
			if r == nil || !boundTo(b.Subjects, map[string]bool{sa: true}) {
				continue
			}
			for _, rule := range r.Rules {
				if !slices.Contains(rule.APIGroups, "") {
					continue
				}
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						if (res == "nodes" || res == "nodes/status") && (v == "patch" || v == "update") {
							writes = true
						}
						if res == "nodes" && (v == "patch" || v == "update" && verb == "") {
							verb = v
						}
					}
				}
			}
		}
		if writes {
			out[sa] = verb
		}
	}
	return out
}

// apply creates the render's ServiceAccounts of ours with their roles and bindings (one rendered again by a later
// stream is kept), and with policy the admission policy and its binding; it returns the policies it created.
func apply(t *testing.T, stream string, ours map[string]bool, policy bool) int {
	t.Helper()
	ctx, c := t.Context(), kube.Client
	policies := 0
	for _, doc := range strings.Split(stream, "\n---") {
		if strings.TrimSpace(doc) == "" || !strings.Contains(doc, "kind:") {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			continue // kinds client-go does not know (CRDs' objects)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			if ours[o.Name] {
				_, err = c.CoreV1().ServiceAccounts(ns).Create(ctx, o, metav1.CreateOptions{})
			}
		case *rbacv1.ClusterRoleBinding:
			if boundTo(o.Subjects, ours) {
				if _, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{}); err == nil {
					_, err = c.RbacV1().ClusterRoles().Create(ctx, clusterRole(t, stream, o.RoleRef.Name), metav1.CreateOptions{})
				}
			}
		case *rbacv1.RoleBinding:
			if boundTo(o.Subjects, ours) {
				if _, err = c.RbacV1().RoleBindings(ns).Create(ctx, o, metav1.CreateOptions{}); err == nil {
					_, err = c.RbacV1().Roles(ns).Create(ctx, role(t, stream, o.RoleRef.Name), metav1.CreateOptions{})
				}
			}
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			if policy {
				policies++
				_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
			}
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			if policy {
				_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
			}
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("apply %T: %v", obj, err)
		}
	}
	return policies
}

func boundTo(subjects []rbacv1.Subject, names map[string]bool) bool {
	for _, s := range subjects {
		if s.Kind == "ServiceAccount" && s.Namespace == ns && names[s.Name] {
			return true
		}
	}
	return false
}

func decodeAll[T runtime.Object](t *testing.T, stream string, keep func(T) bool) T {
	t.Helper()
	for _, doc := range strings.Split(stream, "\n---") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			continue
		}
		if o, ok := obj.(T); ok && keep(o) {
			return o
		}
	}
	var zero T
	t.Fatalf("no %T found in the render", zero)
	return zero
}

func clusterRole(t *testing.T, stream, name string) *rbacv1.ClusterRole {
	return decodeAll(t, stream, func(r *rbacv1.ClusterRole) bool { return r.Name == name })
}

func role(t *testing.T, stream, name string) *rbacv1.Role {
	return decodeAll(t, stream, func(r *rbacv1.Role) bool { return r.Name == name })
}

// podOn creates a pod of account sa bound to node (no kubelet runs it: a token only needs it to exist).
func podOn(t *testing.T, sa, node string) *corev1.Pod {
	t.Helper()
	p, err := kube.Client.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: sa + "-", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// clientAs is a client with a token of account sa, bound to pod (as the kubelet projects it) or, with pod nil,
// bound to nothing.
func clientAs(t *testing.T, sa string, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(restConfigAs(t, sa, pod))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// restConfigAs is clientAs's configuration: a token of account sa, bound to pod, or to nothing with pod nil.
func restConfigAs(t *testing.T, sa string, pod *corev1.Pod) *rest.Config {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := kube.Client.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(kube.Config)
	cfg.BearerToken = tok.Status.Token
	return cfg
}

func patchLabel(ctx context.Context, c kubernetes.Interface, node string) error {
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"kube-gpu-stack.io/admission-test":"x"}}}`), metav1.PatchOptions{})
	return err
}

// refusedByPolicy waits until the policy refuses try (the API server loads a new policy within seconds) and
// returns that refusal.
func refusedByPolicy(t *testing.T, try func(context.Context) error) error {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = try(ctx)
		return apierrors.IsForbidden(last) && strings.Contains(last.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil {
		t.Fatalf("not refused by the admission policy within 30s: last answer %v", last)
	}
	return last
}

// TestTokenOfAPodCarriesItsNode: the local API server issues tokens bound to a pod with the pod's node
// (ServiceAccountTokenPodNodeInfo, GA in Kubernetes 1.32), and the node reaches admission as the user's extra
// authentication.kubernetes.io/node-name: what the policy checks.
func TestTokenOfAPodCarriesItsNode(t *testing.T) {
	install(t)
	c := clientAs(t, driverSA, podOn(t, driverSA, nodeA))
	r, err := c.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := r.Status.UserInfo
	if u.Username != "system:serviceaccount:"+ns+":"+driverSA {
		t.Fatalf("user %q", u.Username)
	}
	if got := u.Extra[nodeNameClaim]; len(got) != 1 || got[0] != nodeA {
		t.Fatalf("extra %s = %v, want [%s]: this API server does not put the pod's node in bound tokens (ServiceAccountTokenPodNodeInfo)", nodeNameClaim, got, nodeA)
	}
}

// TestDriverManagerPatchesOnlyItsOwnNode: a token of the driver's account bound to a pod on node A may patch A
// and no other node; a token bound to no pod may patch none.
func TestDriverManagerPatchesOnlyItsOwnNode(t *testing.T) {
	install(t)
	onA := clientAs(t, driverSA, podOn(t, driverSA, nodeA))
	err := refusedByPolicy(t, func(ctx context.Context) error { return patchLabel(ctx, onA, nodeB) })
	if !strings.Contains(err.Error(), "may change only the node its pod runs on ("+nodeA+"), not node "+nodeB) {
		t.Fatalf("refusal does not say why: %v", err)
	}
	if err := patchLabel(t.Context(), onA, nodeA); err != nil {
		t.Fatalf("patching its own node: %v", err)
	}
	unbound := clientAs(t, driverSA, nil)
	err = refusedByPolicy(t, func(ctx context.Context) error { return patchLabel(ctx, unbound, nodeA) })
	if !strings.Contains(err.Error(), "its token names no node") {
		t.Fatalf("refusal of an unbound token: %v", err)
	}
	// the admin is not matched
	if err := patchLabel(t.Context(), kube.Client, nodeB); err != nil {
		t.Fatalf("admin patch: %v", err)
	}
}

// TestEveryNodeWritingAccountChangesOnlyItsOwnNode: every DaemonSet account whose rendered RBAC may write Nodes
// (found in the renders, among them the MIG, vGPU device and CC managers and the DRA kubelet plugin, third-party
// code running privileged on every GPU node) changes its own node with a token bound to its pod there, and is
// refused another node, and any node with a token bound to no pod: root on one node reaches no other through it.
func TestEveryNodeWritingAccountChangesOnlyItsOwnNode(t *testing.T) {
	install(t)
	for _, want := range []string{driverSA, validatorSA, "nvidia-mig-manager", "nvidia-vgpu-device-manager", "nvidia-cc-manager", "nvidia-dra-driver-kubelet-plugin"} {
		if _, ok := nodeWriters[want]; !ok {
			t.Errorf("%s is not among the node-writing accounts found in the renders %v", want, nodeWriters)
		}
	}
	refused, allowed := 0, 0
	for _, sa := range slices.Sorted(maps.Keys(nodeWriters)) {
		write := map[string]func(context.Context, kubernetes.Interface, string) error{"patch": patchLabel, "update": updateLabel}[nodeWriters[sa]]
		if write == nil {
			continue // nodes/status only: TestHealthAgentWritesOnlyItsOwnNode
		}
		t.Run(sa, func(t *testing.T) {
			onA := clientAs(t, sa, podOn(t, sa, nodeA))
			err := refusedByPolicy(t, func(ctx context.Context) error { return write(ctx, onA, nodeB) })
			if !strings.Contains(err.Error(), "may change only the node its pod runs on ("+nodeA+"), not node "+nodeB) {
				t.Fatalf("refusal does not say why: %v", err)
			}
			refused++
			if err := write(t.Context(), onA, nodeA); err != nil {
				t.Fatalf("%s its own node: %v", nodeWriters[sa], err)
			}
			allowed++
			unbound := clientAs(t, sa, nil)
			refusedByPolicy(t, func(ctx context.Context) error { return write(ctx, unbound, nodeA) })
			refused++
		})
	}
	t.Logf("%d node-writing accounts: %d writes refused, %d allowed", len(nodeWriters), refused, allowed)
}

// TestMIGManagerWritesOnlyItsNodesConfigMap: the MIG manager's Role may write ConfigMaps in the release namespace,
// where it stores the config it generated for its node (<node>-mig-config); with a token bound to its pod on node A
// it writes A's, and is refused B's and any other (the chart's MIG profiles included).
func TestMIGManagerWritesOnlyItsNodesConfigMap(t *testing.T) {
	install(t)
	ctx := t.Context()
	const sa = "nvidia-mig-manager"
	c := clientAs(t, sa, podOn(t, sa, nodeA))
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string]string{"config.yaml": "version: v1\n"}}
	}
	if _, err := kube.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm("default-mig-parted-config"), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	err := refusedByPolicy(t, func(ctx context.Context) error {
		_, err := c.CoreV1().ConfigMaps(ns).Create(ctx, cm(nodeB+"-mig-config"), metav1.CreateOptions{})
		return err
	})
	if !strings.Contains(err.Error(), "may write only the ConfigMap of its own node, "+nodeA+"-mig-config") {
		t.Fatalf("refusal does not say why: %v", err)
	}
	own, err := c.CoreV1().ConfigMaps(ns).Create(ctx, cm(nodeA+"-mig-config"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("its own node's ConfigMap: %v", err)
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating its own node's ConfigMap: %v", err)
	}
	profiles, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "default-mig-parted-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	profiles.Data["config.yaml"] = "version: v1\nmig-configs: {}\n"
	refusedByPolicy(t, func(ctx context.Context) error {
		_, err := c.CoreV1().ConfigMaps(ns).Update(ctx, profiles, metav1.UpdateOptions{})
		return err
	})
}

// TestValidatorStartsNoPodReadingSecretsAndDeletesOnlyItsWorkloadPods: the validator's Role may create and delete
// pods in the release namespace, which holds the stack's Secrets and its privileged pods: its workload pods may read
// no Secret (volume, projected source or env), and it may delete only its workload account's pods (a driver pod's
// deletion restarts that node's driver).
func TestValidatorStartsNoPodReadingSecretsAndDeletesOnlyItsWorkloadPods(t *testing.T) {
	install(t)
	ctx := t.Context()
	v := clientAs(t, validatorSA, podOn(t, validatorSA, nodeB))
	workload := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "nvidia-cuda-validator-", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: nodeB, ServiceAccountName: workloadSA, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "cuda-validation", Image: "example.invalid/cuda"}}},
		}
		mutate(p)
		return p
	}
	for what, mutate := range map[string]func(*corev1.Pod){
		"secret volume": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "any"}}}}
		},
		"projected secret": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "any"}}}}}}}}
		},
		"env from a secret key": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "any"}, Key: "k"}}}}
		},
		"envFrom a secret (init container)": func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "example.invalid/i", EnvFrom: []corev1.EnvFromSource{{
				SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "any"}}}}}}
		},
	} {
		err := refusedByPolicy(t, func(ctx context.Context) error {
			_, err := v.CoreV1().Pods(ns).Create(ctx, workload(mutate), metav1.CreateOptions{})
			return err
		})
		if !strings.Contains(err.Error(), "may create only pods that read no Secret") {
			t.Errorf("%s: %v", what, err)
		}
	}
	own, err := v.CoreV1().Pods(ns).Create(ctx, workload(func(*corev1.Pod) {}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a workload pod reading no Secret: %v", err)
	}
	driverPod := podOn(t, driverSA, nodeB)
	err = refusedByPolicy(t, func(ctx context.Context) error {
		return v.CoreV1().Pods(ns).Delete(ctx, driverPod.Name, metav1.DeleteOptions{})
	})
	if !strings.Contains(err.Error(), "may delete only pods of service account "+workloadSA) {
		t.Fatalf("refusal of a driver pod's deletion: %v", err)
	}
	if err := v.CoreV1().Pods(ns).Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own workload pod: %v", err)
	}
}

// cdDaemonSA runs the ComputeDomain daemons, the pods the DRA driver's controller starts on GPU nodes.
const cdDaemonSA = "compute-domain-daemon-service-account"

// TestComputeDomainDaemonChangesOnlyItsOwnPodsLabels: the ComputeDomain daemon's role may patch any pod in the
// cluster; v0.4.1 patches only its own pod's clique label. With a token bound to its pod it may change that pod's
// labels, and is refused another pod, its own pod's image (a swapped image would run with its rights) and its
// own pod's annotations.
func TestComputeDomainDaemonChangesOnlyItsOwnPodsLabels(t *testing.T) {
	install(t)
	ctx := t.Context()
	own := podOn(t, cdDaemonSA, nodeA)
	other := podOn(t, driverSA, nodeA)
	c := clientAs(t, cdDaemonSA, own)
	patch := func(name, body string, pt types.PatchType) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.CoreV1().Pods(ns).Patch(ctx, name, pt, []byte(body), metav1.PatchOptions{})
			return err
		}
	}
	if err := patch(own.Name, `{"metadata":{"labels":{"resource.nvidia.com/computeDomain.cliqueID":"abc.1"}}}`, types.MergePatchType)(ctx); err != nil {
		t.Fatalf("its own pod's clique label: %v", err)
	}
	refused := 0
	for what, try := range map[string]func(context.Context) error{
		"another pod's labels":     patch(other.Name, `{"metadata":{"labels":{"x":"y"}}}`, types.MergePatchType),
		"its own pod's image":      patch(own.Name, `{"spec":{"containers":[{"name":"c","image":"example.invalid/evil"}]}}`, types.StrategicMergePatchType),
		"its own pod's annotation": patch(own.Name, `{"metadata":{"annotations":{"x":"y"}}}`, types.MergePatchType),
	} {
		err := refusedByPolicy(t, try)
		if !strings.Contains(err.Error(), "may change only the labels of its own pod") {
			t.Errorf("%s: %v", what, err)
		}
		refused++
	}
	t.Logf("%d pod changes refused", refused)
}

// cdControllerSA runs the DRA driver's ComputeDomain controller.
const cdControllerSA = "nvidia-dra-driver-controller"

// TestComputeDomainControllerCreatesOnlyDaemonDaemonSets: the controller's Role may create any DaemonSet in the
// privileged release namespace; v0.4.1 creates only the ComputeDomain daemons'. It may create one with their account
// and the driver's image, and is refused one with another image or running as the driver's account.
func TestComputeDomainControllerCreatesOnlyDaemonDaemonSets(t *testing.T) {
	install(t)
	ctx := t.Context()
	stream, err := chartrender.RenderRepo(ctx, nil, []string{"draDriver.enabled=true"})
	if err != nil {
		t.Fatal(err)
	}
	var image string
	ctrl := decodeAll(t, stream, func(d *appsv1.Deployment) bool { return d.Name == cdControllerSA })
	for _, e := range ctrl.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "IMAGE_NAME" {
			image = e.Value
		}
	}
	if image == "" {
		t.Fatal("the controller's IMAGE_NAME is not rendered")
	}
	c := clientAs(t, cdControllerSA, nil)
	ds := func(name, sa, img string) *appsv1.DaemonSet {
		labels := map[string]string{"resource.nvidia.com/computeDomain": name}
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
					ServiceAccountName: sa, Containers: []corev1.Container{{Name: "compute-domain-daemon", Image: img}}}}}}
	}
	for what, d := range map[string]*appsv1.DaemonSet{
		"another image":        ds("cd-evil-image", cdDaemonSA, "example.invalid/evil"),
		"the driver's account": ds("cd-evil-account", driverSA, image),
	} {
		err := refusedByPolicy(t, func(ctx context.Context) error {
			_, err := c.AppsV1().DaemonSets(ns).Create(ctx, d, metav1.CreateOptions{})
			return err
		})
		if !strings.Contains(err.Error(), "may create only ComputeDomain daemon DaemonSets") {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := c.AppsV1().DaemonSets(ns).Create(ctx, ds("cd-daemon", cdDaemonSA, image), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a ComputeDomain daemon DaemonSet: %v", err)
	}
	// a daemon of an earlier image (created before an upgrade): the controller may still update it (its finalizer)
	// as long as the pod template stays as it was, and not change it to another image
	old, err := kube.Client.AppsV1().DaemonSets(ns).Create(ctx, ds("cd-daemon-earlier", cdDaemonSA, image+"-earlier"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old.Finalizers = []string{"resource.nvidia.com/computeDomain"}
	if old, err = c.AppsV1().DaemonSets(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("an update leaving an earlier daemon's template as it was: %v", err)
	}
	old.Spec.Template.Spec.Containers[0].Image = "example.invalid/evil"
	refusedByPolicy(t, func(ctx context.Context) error {
		_, err := c.AppsV1().DaemonSets(ns).Update(ctx, old, metav1.UpdateOptions{})
		return err
	})
	old.Finalizers = nil
	old.Spec.Template.Spec.Containers[0].Image = image + "-earlier"
	if _, err := kube.Client.AppsV1().DaemonSets(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSeedLabelPassesThePolicyOnItsOwnNodeOnly: the MIG and CC managers' init containers seed labels with
// nodestate.SeedLabels (a resourceVersion-guarded patch of the labels and the seeded record): with the managers' real
// tokens, bound to their pods on node A, it is refused on B and seeds A.
func TestSeedLabelPassesThePolicyOnItsOwnNodeOnly(t *testing.T) {
	install(t)
	for sa, label := range map[string]string{"nvidia-mig-manager": "nvidia.com/mig.config", "nvidia-cc-manager": "nvidia.com/gpu.deploy.vfio-manager"} {
		c := clientAs(t, sa, podOn(t, sa, nodeA))
		// the API server has loaded the policy (it takes seconds) once the account's plain patch of B is refused
		refusedByPolicy(t, func(ctx context.Context) error { return patchLabel(ctx, c, nodeB) })
		var out bytes.Buffer
		if err := nodestate.SeedLabels(t.Context(), c, nodeB, [][2]string{{label, "seeded"}}, nodestate.Workload{}, &out); !apierrors.IsForbidden(err) {
			t.Errorf("%s seeding node %s: %v (%s), want refused", sa, nodeB, err, out.String())
		}
		if err := nodestate.SeedLabels(t.Context(), c, nodeA, [][2]string{{label, "seeded"}}, nodestate.Workload{}, &out); err != nil {
			t.Fatalf("%s seeding its own node: %v", sa, err)
		}
		if n := nodeOf(t, nodeA); n.Labels[label] != "seeded" || n.Annotations[nodestate.SeededLabelsAnnotation] == "" {
			t.Errorf("%s: %s=%q and the seeded record %q on its own node after the seed", sa, label, n.Labels[label], n.Annotations[nodestate.SeededLabelsAnnotation])
		}
	}
}

func nodeOf(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := kube.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// updateLabel sets a label on node with an update, for accounts that may update but not patch Nodes.
func updateLabel(ctx context.Context, c kubernetes.Interface, node string) error {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	metav1.SetMetaDataLabel(&n.ObjectMeta, "kube-gpu-stack.io/admission-test", "u")
	_, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// TestValidatorPatchesOnlyItsOwnNodeAndCreatesOnlyWorkloadPods: the validator records on its own node only, and
// may create pods only with the no-rights workload account (never one running as the driver's account), bound to
// its own node.
func TestValidatorPatchesOnlyItsOwnNodeAndCreatesOnlyWorkloadPods(t *testing.T) {
	install(t)
	v := clientAs(t, validatorSA, podOn(t, validatorSA, nodeB))
	refusedByPolicy(t, func(ctx context.Context) error { return patchLabel(ctx, v, nodeA) })
	if err := patchLabel(t.Context(), v, nodeB); err != nil {
		t.Fatalf("patching its own node: %v", err)
	}
	pod := func(sa string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "nvidia-cuda-validator-", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: nodeB, ServiceAccountName: sa, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "cuda-validation", Image: "example.invalid/cuda"}}},
		}
	}
	for _, sa := range []string{driverSA, "default"} {
		err := refusedByPolicy(t, func(ctx context.Context) error {
			_, err := v.CoreV1().Pods(ns).Create(ctx, pod(sa), metav1.CreateOptions{})
			return err
		})
		if !strings.Contains(err.Error(), "may create only pods of service account "+workloadSA) {
			t.Fatalf("refusal of a pod of %s: %v", sa, err)
		}
	}
	elsewhere := pod(workloadSA)
	elsewhere.Spec.NodeName = nodeA
	err := refusedByPolicy(t, func(ctx context.Context) error {
		_, err := v.CoreV1().Pods(ns).Create(ctx, elsewhere, metav1.CreateOptions{})
		return err
	})
	if !strings.Contains(err.Error(), "may create pods only bound or pinned (node affinity on metadata.name) to its own node ("+nodeB+"), not to "+nodeA) {
		t.Fatalf("refusal of a workload pod on another node: %v", err)
	}
	// the dra check's pod is not bound (the scheduler must allocate its claim): every required node affinity term
	// must pin it to the validator's node
	pinned := func(nodes ...string) *corev1.Pod {
		p := pod(workloadSA)
		p.Spec.NodeName = ""
		var terms []corev1.NodeSelectorTerm
		for _, n := range nodes {
			terms = append(terms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}})
		}
		if len(terms) > 0 {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
		}
		return p
	}
	for name, p := range map[string]*corev1.Pod{"unplaced": pinned(), "pinned elsewhere": pinned(nodeA), "one term elsewhere": pinned(nodeB, nodeA)} {
		t.Logf("%s: %v", name, refusedByPolicy(t, func(ctx context.Context) error {
			_, err := v.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		}))
	}
	ownPinned, err := v.CoreV1().Pods(ns).Create(t.Context(), pinned(nodeB), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a workload pod pinned to its own node: %v", err)
	}
	if err := v.CoreV1().Pods(ns).Delete(t.Context(), ownPinned.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its pinned workload pod: %v", err)
	}
	created, err := v.CoreV1().Pods(ns).Create(t.Context(), pod(workloadSA), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a workload pod: %v", err)
	}
	if err := v.CoreV1().Pods(ns).Delete(t.Context(), created.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its workload pod: %v", err)
	}
}

// TestDriverAccountHasOnlyWhatItCalls: the rendered RBAC, as the API server applies it: the driver manager may
// patch but not update nodes, evict but not delete pods, and hold Leases in the release namespace only.
func TestDriverAccountHasOnlyWhatItCalls(t *testing.T) {
	install(t)
	ctx := t.Context()
	c := clientAs(t, driverSA, podOn(t, driverSA, nodeA))
	node, err := c.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("nodes update: %v, want Forbidden", err)
	}
	victim := podOn(t, validatorSA, nodeA)
	if err := c.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("pods delete: %v, want Forbidden", err)
	}
	if _, err := c.CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("pods get: %v, want Forbidden (it lists and watches)", err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-gpu-stack-driver-" + nodeA}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("p")}}
	got, err := c.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("lease create in %s: %v", ns, err)
	}
	if _, err := c.CoordinationV1().Leases(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("lease update: %v", err)
	}
	if err := c.CoordinationV1().Leases(ns).Delete(ctx, got.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("lease delete: %v, want Forbidden", err)
	}
	if _, err := c.CoordinationV1().Leases("kube-system").Create(ctx, lease, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("lease create in kube-system: %v, want Forbidden", err)
	}
}

// TestDriverAccountMarksOnlyMaintenance: the driver's account, with a token bound to a pod on node A, sends the
// driver manager's maintenance marks (drivermanager.Maintenance: the GPU health condition Unknown through
// nodes/status, the release's opt-out label): allowed on A; refused on B, and refused any other verdict of the
// condition (False, True), any other condition, and a label of another namespace than the opt-out label's key.
func TestDriverAccountMarksOnlyMaintenance(t *testing.T) {
	install(t)
	ctx := t.Context()
	c := clientAs(t, driverSA, podOn(t, driverSA, nodeA))
	condition := func(node, typ, status, reason string) func(context.Context) error {
		return func(ctx context.Context) error {
			patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"message":"m"}]}}`, typ, status, reason)
			_, err := c.CoreV1().Nodes().PatchStatus(ctx, node, []byte(patch))
			return err
		}
	}
	label := func(key string) func(context.Context) error {
		return func(ctx context.Context) error {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, key)
			_, err := c.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			return err
		}
	}
	for _, refused := range []struct {
		try  func(context.Context) error
		says string
	}{
		{condition(nodeA, "nvidia.com/GPUHealthy", "False", "FatalXid"), "may only set the condition nvidia.com/GPUHealthy Unknown"},
		{condition(nodeA, "nvidia.com/GPUHealthy", "True", "GPUsHealthy"), "may only set the condition nvidia.com/GPUHealthy Unknown"},
		{condition(nodeA, "nvidia.com/GPUHealthy", "Unknown", "NVMLFailed"), "may only set the condition nvidia.com/GPUHealthy Unknown"},
		{condition(nodeA, "Ready", "Unknown", "Maintenance"), "may change no node status"},
		{condition(nodeB, "nvidia.com/GPUHealthy", "Unknown", "Maintenance"), "may change only the node its pod runs on (" + nodeA + "), not node " + nodeB},
		{label("remediation.example.com/other"), "may change only the nvidia.com/"},
	} {
		if err := refusedByPolicy(t, refused.try); !strings.Contains(err.Error(), refused.says) {
			t.Errorf("refusal does not say %q: %v", refused.says, err)
		}
	}
	for _, reason := range []string{"Maintenance", "DriverUpgradeFailed"} {
		if err := condition(nodeA, "nvidia.com/GPUHealthy", "Unknown", reason)(ctx); err != nil {
			t.Errorf("its own node's condition Unknown %s: %v", reason, err)
		}
	}
	if err := label(maintenanceLabel)(ctx); err != nil {
		t.Errorf("its own node's opt-out label: %v", err)
	}
	// leave node A as the other tests expect it
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, maintenanceLabel)
	if _, err := kube.Client.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestHealthAgentWritesOnlyItsOwnNode: the GPU health agent's account, with a token bound to a pod on node A,
// sends the agent's requests (gpuhealth.Reporter: a strategic merge patch of one condition through nodes/status,
// an update of the Node for its taint; the list and watch of its Node): allowed on A, the writes refused by the
// policy on B; it may not patch or delete a Node.
func TestHealthAgentWritesOnlyItsOwnNode(t *testing.T) {
	install(t)
	c := clientAs(t, healthSA, podOn(t, healthSA, nodeA))
	condition := func(ctx context.Context, node string) error {
		_, err := c.CoreV1().Nodes().PatchStatus(ctx, node, []byte(`{"status":{"conditions":[{"type":"nvidia.com/GPUHealthy","status":"False","reason":"FatalXid","message":"GPU 0: Xid 79"}]}}`))
		return err
	}
	taint := func(ctx context.Context, node string) error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Value: "FatalXid", Effect: corev1.TaintEffectNoSchedule})
		_, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}
	err := refusedByPolicy(t, func(ctx context.Context) error { return condition(ctx, nodeB) })
	if !strings.Contains(err.Error(), "may change only the node its pod runs on ("+nodeA+"), not node "+nodeB) {
		t.Fatalf("refusal does not say why: %v", err)
	}
	refusedByPolicy(t, func(ctx context.Context) error { return taint(ctx, nodeB) })
	if err := condition(t.Context(), nodeA); err != nil {
		t.Fatalf("its own node's condition: %v", err)
	}
	// it follows its Node for planned changes (gpuhealth's node watch: a list, then a watch, on its name)
	own := metav1.ListOptions{FieldSelector: "metadata.name=" + nodeA}
	if _, err := c.CoreV1().Nodes().List(t.Context(), own); err != nil {
		t.Errorf("listing its own node: %v", err)
	}
	if w, err := c.CoreV1().Nodes().Watch(t.Context(), own); err != nil {
		t.Errorf("watching its own node: %v", err)
	} else {
		w.Stop()
	}
	if err := taint(t.Context(), nodeA); err != nil {
		t.Fatalf("its own node's taint: %v", err)
	}
	if err := patchLabel(t.Context(), c, nodeA); !apierrors.IsForbidden(err) {
		t.Errorf("nodes patch: %v, want Forbidden", err)
	}
	if err := c.CoreV1().Nodes().Delete(t.Context(), nodeA, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("nodes delete: %v, want Forbidden", err)
	}
	// take the taint off again, so the node is as the other tests expect
	n, err := kube.Client.CoreV1().Nodes().Get(t.Context(), nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []corev1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key != "nvidia.com/gpu-unhealthy" {
			kept = append(kept, tt)
		}
	}
	n.Spec.Taints = kept
	if _, err := kube.Client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeLocalAccountsChangeOnlyWhatTheStackOwns: on its own node, a node-local account may change the labels and
// annotations of the stack's and the operands' namespaces (nvidia.com/, resource.nvidia.com/ for labels,
// kube-gpu-stack.io/) and cordon it; it is refused a protected label (node-role, kubernetes.io/hostname) or another
// namespace's, added, changed or removed, an annotation of another namespace, and any taint. The GPU health agent
// may change its own taint and its own condition only: no other taint, no capacity or allocatable (fake GPUs), no
// other condition (Ready). What NodeRestriction forbids the kubelet itself.
func TestNodeLocalAccountsChangeOnlyWhatTheStackOwns(t *testing.T) {
	install(t)
	ctx := t.Context()
	// the admin's labels and taint-free node, as a kubelet registers it
	if _, err := kube.Client.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"kubernetes.io/hostname":"`+nodeA+`","team":"ml"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	driver := clientAs(t, driverSA, podOn(t, driverSA, nodeA))
	patch := func(c kubernetes.Interface, body string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.CoreV1().Nodes().Patch(ctx, nodeA, types.MergePatchType, []byte(body), metav1.PatchOptions{})
			return err
		}
	}
	refused := 0
	for what, body := range map[string]string{
		"a node-role label":           `{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`,
		"kubernetes.io/hostname":      `{"metadata":{"labels":{"kubernetes.io/hostname":"elsewhere"}}}`,
		"another namespace's removed": `{"metadata":{"labels":{"team":null}}}`,
		"another annotation":          `{"metadata":{"annotations":{"example.com/x":"y"}}}`,
		"a taint":                     `{"spec":{"taints":[{"key":"evil","effect":"NoSchedule"}]}}`,
	} {
		err := refusedByPolicy(t, patch(driver, body))
		if !strings.Contains(err.Error(), "may change only the") && !strings.Contains(err.Error(), "may not change the taints") {
			t.Errorf("%s: %v", what, err)
		}
		refused++
	}
	for what, body := range map[string]string{
		"its upgrade state and a pause": `{"metadata":{"labels":{"nvidia.com/gpu-driver-upgrade-state":"upgrade-done","nvidia.com/gpu.deploy.device-plugin":"paused-for-driver-upgrade"}}}`,
		"its annotations":               `{"metadata":{"annotations":{"kube-gpu-stack.io/admission-test":"x"}}}`,
		"a cordon and its undoing":      `{"spec":{"unschedulable":true}}`,
	} {
		if err := patch(driver, body)(ctx); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := patch(driver, `{"spec":{"unschedulable":false}}`)(ctx); err != nil {
		t.Error(err)
	}

	health := clientAs(t, healthSA, podOn(t, healthSA, nodeA))
	status := func(body string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := health.CoreV1().Nodes().PatchStatus(ctx, nodeA, []byte(body))
			return err
		}
	}
	for what, body := range map[string]string{
		"fake GPUs":         `{"status":{"capacity":{"nvidia.com/gpu":"64"},"allocatable":{"nvidia.com/gpu":"64"}}}`,
		"another condition": `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil"}]}}`,
	} {
		err := refusedByPolicy(t, status(body))
		if !strings.Contains(err.Error(), "may change no node status but") {
			t.Errorf("%s: %v", what, err)
		}
		refused++
	}
	otherTaint := func(ctx context.Context) error {
		n, err := health.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "evil", Effect: corev1.TaintEffectNoExecute})
		_, err = health.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}
	refusedByPolicy(t, otherTaint)
	refused++
	t.Logf("%d changes refused on the accounts' own node", refused)
}
