package takeover

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/admincli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/gpumigrate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	// namespace is the operator's, which the chart then installs into (the README's commands).
	namespace = "gpu-operator"
	release   = "gpu"
	// operatorVersion is the driver the operator loaded (its ClusterPolicy's driver.version); operatorDigest is
	// what its driver container recorded in /run/nvidia/nvidia-driver.state (an FNV-32a number, gpu-operator
	// v26.7.0 internal/utils.GetObjectHashIgnoreEmptyKeys).
	operatorVersion = "580.95.05"
	operatorDigest  = "3274061929"
	// newVersion is the driver the upgrade after the takeover installs.
	newVersion = "600.10.01"
)

func target() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: 3 * time.Minute}
}

// operatorLabels are what the GPU Operator and its labeller leave on a GPU node: every operand switch true (its
// labeller writes them all, enabled in the ClusterPolicy or not: gpu-operator v26.7.0 controllers/state_manager.go,
// gpuStateLabels; mig-manager on MIG-capable nodes), its upgrade controller's state, the MIG manager's default
// layout. Its uninstall removes none of them: the operator removes them only from nodes that lose their GPU.
var operatorLabels = map[string]string{
	"nvidia.com/gpu.deploy.driver":                "true",
	"nvidia.com/gpu.deploy.container-toolkit":     "true",
	"nvidia.com/gpu.deploy.device-plugin":         "true",
	"nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
	"nvidia.com/gpu.deploy.dcgm":                  "true",
	"nvidia.com/gpu.deploy.dcgm-exporter":         "true",
	"nvidia.com/gpu.deploy.node-status-exporter":  "true",
	"nvidia.com/gpu.deploy.operator-validator":    "true",
	"nvidia.com/gpu.deploy.mig-manager":           "true",
	"nvidia.com/mig.config":                       "all-disabled",
	nodestate.UpgradeStateLabel:                   string(nodestate.UpgradeDone),
}

// operatorSpec is the ClusterPolicy the operator's chart rendered (its required fields and what the test reads):
// the DCGM exporter is off, so its gpu.deploy switch, which the labeller still wrote, must not bring it back.
const operatorSpec = `
operator: {defaultRuntime: containerd}
daemonsets: {updateStrategy: RollingUpdate}
driver:
  enabled: true
  repository: nvcr.io/nvidia
  image: driver
  version: "` + operatorVersion + `"
  kernelModuleType: auto
  upgradePolicy:
    autoUpgrade: true
    maxParallelUpgrades: 1
    maxUnavailable: 25%
    podDeletion: {force: false, timeoutSeconds: 300, deleteEmptyDir: false}
    drain: {enable: false, force: false, timeoutSeconds: 300, deleteEmptyDir: false}
toolkit: {enabled: true}
devicePlugin: {enabled: true}
dcgm: {enabled: true}
dcgmExporter: {enabled: false}
gfd: {enabled: true}
nodeStatusExporter: {enabled: false}
`

// operator sets the cluster up as a running GPU Operator left it, and returns its ClusterPolicy.
func operator(t *testing.T, hosts map[string]*kmodtest.Fixture) {
	t.Helper()
	ctx := t.Context()
	for _, f := range []string{"nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml"} {
		raw, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), "hooks", "admin", "gpumigrate", "testdata", "gpu-operator-"+gpumigrate.OperatorTag, f))
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CreateCRD(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	dyn := dynamic.NewForConfigOrDie(kube.Config)
	var spec map[string]any
	if err := yaml.Unmarshal([]byte(operatorSpec), &spec); err != nil {
		t.Fatal(err)
	}
	cp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
		"metadata": map[string]any{"name": gpumigrate.ClusterPolicyName}, "spec": spec,
	}}
	cp, err := dyn.Resource(gpumigrate.ClusterPolicyGVR).Create(ctx, cp, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp.Object["status"] = map[string]any{"state": "ready", "namespace": namespace}
	if cp, err = dyn.Resource(gpumigrate.ClusterPolicyGVR).UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := kube.Client
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	one := int32(1)
	op := map[string]string{"app": "gpu-operator"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "gpu-operator", Namespace: namespace, Labels: op},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: op}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: op},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": "cpu-only"},
				Containers: []corev1.Container{{Name: "gpu-operator", Image: "nvcr.io/nvidia/gpu-operator:" + gpumigrate.OperatorTag}}}}}}
	if _, err := client.AppsV1().Deployments(namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// the operands' DaemonSets, owned by the ClusterPolicy (controllerutil.SetControllerReference), the driver's
	// OnDelete (its upgrade controller rolls it)
	owner := metav1.OwnerReference{APIVersion: "nvidia.com/v1", Kind: "ClusterPolicy", Name: cp.GetName(), UID: cp.GetUID(),
		Controller: ptr(true), BlockOwnerDeletion: ptr(true)}
	for _, ds := range []struct{ name, image, deploy string }{
		{"nvidia-driver-daemonset", "nvcr.io/nvidia/driver:" + operatorVersion + "-ubuntu22.04", "driver"},
		{"nvidia-container-toolkit-daemonset", "nvcr.io/nvidia/k8s/container-toolkit:v1.18.0", "container-toolkit"},
		{"nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", "device-plugin"},
		{"gpu-feature-discovery", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", "gpu-feature-discovery"},
		{"nvidia-operator-validator", "nvcr.io/nvidia/gpu-operator:" + gpumigrate.OperatorTag, "operator-validator"},
	} {
		sel := map[string]string{"app": ds.name}
		strategy := appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
		if ds.deploy == "driver" {
			strategy.Type = appsv1.OnDeleteDaemonSetStrategyType
		}
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: ds.name, Namespace: namespace, Labels: sel, OwnerReferences: []metav1.OwnerReference{owner}},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, UpdateStrategy: strategy, Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"nvidia.com/gpu.deploy." + ds.deploy: "true"},
					Containers: []corev1.Container{{Name: ds.name, Image: ds.image}}}}}}
		if _, err := client.AppsV1().DaemonSets(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		labels := map[string]any{}
		for k, v := range operatorLabels {
			labels[k] = v
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels,
			"annotations": map[string]any{"nvidia.com/gpu-driver-upgrade-enabled": "true"}}})
		if _, err := client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		// its driver, loaded and left as its container leaves it when stopped with GPU pods running (modules in use:
		// _shutdown returns before it unmounts its root or removes its pid file)
		f := kmodtest.New(t)
		f.LoadDriver()
		f.DriverVersion(operatorVersion, true)
		f.DriverState(operatorDigest)
		f.PidFile()
		f.MountDriverRoot()
		hosts[n] = f
		stand.SetDriverHost(n, kubelet.DriverHost{Fixture: f})
	}
	rollouttest.WaitFor(t, time.Minute, "the operator's driver pods running", func() (bool, string) {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=nvidia-driver-daemonset"})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == len(rollouttest.GPUNodeNames(nodes)), fmt.Sprintf("%d driver pods", len(pods.Items))
	})
}

// startWorkloads runs a GPU and a CPU workload on every GPU node, the GPU ones behind a PodDisruptionBudget that
// lets one go at a time, and returns the GPU pods' UIDs by node.
func startWorkloads(t *testing.T, workloadNS string) map[string]types.UID {
	t.Helper()
	ctx := t.Context()
	if err := workloads.Deploy(ctx, kube.Client, workloadNS, rollouttest.GPUNodeNames(nodes)); err != nil {
		t.Fatal(err)
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: workloadNS},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": workloads.GPUApp}}}}
	if _, err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, time.Minute, "GPU workloads running", func() (bool, string) {
		running, err := workloads.RunningGPU(ctx, kube.Client, workloadNS)
		return err == nil && len(running) == len(rollouttest.GPUNodeNames(nodes)), fmt.Sprintf("running on %v (%v)", running, err)
	})
	t.Cleanup(func() {
		_ = kube.Client.CoreV1().Namespaces().Delete(context.Background(), workloadNS, metav1.DeleteOptions{})
	})
	return gpuPodUIDs(t, workloadNS)
}

func gpuPodUIDs(t *testing.T, workloadNS string) map[string]types.UID {
	t.Helper()
	pods, err := kube.Client.CoreV1().Pods(workloadNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=" + workloads.GPUApp})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]types.UID{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p.UID
		}
	}
	return out
}

// watcher records, from watches started before the takeover, every GPU pod that went away (an eviction or a
// deletion) and the most nodes cordoned at once.
type watcher struct {
	mu          sync.Mutex
	gone        []string
	cordoned    map[string]bool
	maxCordoned int
	everCordon  []string
	stop        context.CancelFunc
	done        sync.WaitGroup
}

func watchTakeover(t *testing.T, workloadNS string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &watcher{cordoned: map[string]bool{}, stop: cancel}
	pods, err := kube.Client.CoreV1().Pods(workloadNS).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + workloads.GPUApp})
	if err != nil {
		t.Fatal(err)
	}
	nodeWatch, err := kube.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.done.Add(2)
	go func() {
		defer w.done.Done()
		for ev := range pods.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				w.mu.Lock()
				w.gone = append(w.gone, p.Name+" on "+p.Spec.NodeName)
				w.mu.Unlock()
			}
		}
	}()
	go func() {
		defer w.done.Done()
		for ev := range nodeWatch.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			w.mu.Lock()
			w.cordoned[n.Name] = n.Spec.Unschedulable
			if n.Spec.Unschedulable {
				w.everCordon = append(w.everCordon, n.Name)
			}
			c := 0
			for _, v := range w.cordoned {
				if v {
					c++
				}
			}
			w.maxCordoned = max(w.maxCordoned, c)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watcher) end() {
	w.stop()
	w.done.Wait()
}

// migrate runs `kube-gpu-stack migrate --from-cluster` as the README does and returns the values file.
func migrate(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	values, report := filepath.Join(dir, "values.yaml"), filepath.Join(dir, "migrate-report.txt")
	var out bytes.Buffer
	cmd := admincli.NewCommand(&out)
	cmd.SetArgs([]string{"migrate", "--from-cluster", "--kubeconfig", kube.Kubeconfig, "-o", values, "--report", report})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	b, _ := os.ReadFile(values)
	r, _ := os.ReadFile(report)
	t.Logf("migrate's values:\n%s\nreport:\n%s", b, r)
	return values
}

// removeOperator removes the operator as `helm uninstall gpu-operator` does (the chart keeps its CRDs,
// operator.cleanupCRD=false): the ClusterPolicy goes, and with it, through the garbage collector, the DaemonSets it
// owns and their pods; then the operator's Deployment. It waits until none of the operator's pods is left.
func removeOperator(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(kube.Config)
	if err := dyn.Resource(gpumigrate.ClusterPolicyGVR).Delete(ctx, gpumigrate.ClusterPolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Client.AppsV1().Deployments(namespace).Delete(ctx, "gpu-operator", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rollouttest.WaitFor(t, 2*time.Minute, "the operator's DaemonSets and pods gone", func() (bool, string) {
		ds, err := kube.Client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(ds.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d DaemonSets, %d pods left", len(ds.Items), len(pods.Items))
	})
}

// TestTakeoverFromTheGPUOperator: the operator's driver is adopted on every node through the fast path, no GPU pod is
// evicted and no node cordoned, the switches the operator wrote do not turn on what the values turn off, and the gate
// passes; the driver upgrade that follows is the normal bounded rollout.
func TestTakeoverFromTheGPUOperator(t *testing.T) {
	ctx := t.Context()
	hosts := map[string]*kmodtest.Fixture{}
	operator(t, hosts)
	const workloadNS = "ml"
	uids := startWorkloads(t, workloadNS)

	// the README's steps: migrate, remove the operator, install with migrate's values
	values := migrate(t)
	w := watchTakeover(t, workloadNS)
	removeOperator(t)
	start := time.Now()
	if _, err := target().Install(ctx, []string{values}); err != nil {
		logRuns(t, start)
		t.Fatalf("install (the gate is its post-install hook): %v", err)
	}
	t.Cleanup(func() { _ = target().Uninstall() }) // for the next test, when this one stops early
	// the gate finished every node
	rollouttest.WaitFor(t, time.Minute, "every GPU node upgrade-done", func() (bool, string) {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if s := rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel]; s != string(nodestate.UpgradeDone) {
				return false, n + " is " + s
			}
		}
		return true, ""
	})
	w.end()
	t.Logf("takeover of %d nodes in %s", len(hosts), time.Since(start).Round(100*time.Millisecond))

	t.Run("no GPU pod evicted, no node cordoned", func(t *testing.T) {
		if len(w.gone) > 0 {
			t.Errorf("GPU pods went away during the takeover: %v", w.gone)
		}
		if len(w.everCordon) > 0 {
			t.Errorf("nodes cordoned during the takeover: %v", w.everCordon)
		}
		for n, uid := range gpuPodUIDs(t, workloadNS) {
			if uids[n] != uid {
				t.Errorf("the GPU pod on %s was replaced", n)
			}
		}
	})

	t.Run("the driver pods adopted the operator's driver", func(t *testing.T) {
		digest := rollouttest.DriverDigest(t, kube.Client, namespace, "nvidia-driver-daemonset-ubuntu2204")
		for n, f := range hosts {
			adopted := false
			for _, r := range stand.Runs() {
				if r.Component == kubelet.DriverManagerRun && r.Node == n && r.ExitCode == 0 && strings.Contains(r.Output, "adopted the loaded driver "+operatorVersion) {
					adopted = true
				}
			}
			if !adopted {
				t.Errorf("%s: no driver manager run adopted the driver", n)
			}
			for _, c := range f.Kernel.CallList() {
				if strings.HasPrefix(c, "delete_module") {
					t.Errorf("%s: %s", n, c)
				}
			}
			if d, _, _ := f.Host().RecordedDigest(); d != digest {
				t.Errorf("%s: host records %q, want the driver DaemonSet's %s", n, d, digest)
			}
			if got := rollouttest.Node(t, kube.Client, n).Annotations[nodestate.DriverDigestAnnotation]; got != digest {
				t.Errorf("%s: node records %q", n, got)
			}
		}
	})

	t.Run("the operator's labels are not misread", func(t *testing.T) {
		// dcgmExporter is off in the values migrate wrote; the operator's gpu.deploy.dcgm-exporter=true stays inert
		pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=dcgm-exporter"})
		if err != nil || len(pods.Items) > 0 {
			t.Errorf("dcgm-exporter pods %d (%v), want none", len(pods.Items), err)
		}
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			nd := rollouttest.Node(t, kube.Client, n)
			if nd.Labels["nvidia.com/gpu.deploy.dcgm-exporter"] != "true" {
				t.Errorf("%s: the operator's dcgm-exporter switch was changed to %q", n, nd.Labels["nvidia.com/gpu.deploy.dcgm-exporter"])
			}
			seeded := map[string]string{}
			if s := nd.Annotations[nodestate.SeededLabelsAnnotation]; s != "" {
				if err := json.Unmarshal([]byte(s), &seeded); err != nil {
					t.Errorf("%s: %v", n, err)
				}
			}
			for k := range operatorLabels {
				if _, ok := seeded[k]; ok {
					t.Errorf("%s: %s, written by the operator, is recorded as seeded by us (an uninstall would remove it)", n, k)
				}
			}
		}
	})
	if t.Failed() {
		logRuns(t, start)
		return
	}

	// the driver upgrade after the takeover: the normal bounded rollout (maxUnavailable from migrate: 1)
	t.Run("a driver upgrade after the takeover is the bounded rollout", func(t *testing.T) {
		w := watchTakeover(t, workloadNS)
		start := time.Now()
		tg := target()
		if _, err := tg.Upgrade(ctx, []string{values}, "driver.image.tag="+newVersion); err != nil {
			logRuns(t, start)
			t.Fatal(err)
		}
		rollouttest.WaitFor(t, 3*time.Minute, "every GPU node upgrade-done with the new driver", func() (bool, string) {
			for _, n := range rollouttest.GPUNodeNames(nodes) {
				nd := rollouttest.Node(t, kube.Client, n)
				if nd.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeDone) || nd.Annotations[nodestate.DriverDigestAnnotation] != rollouttest.DriverDigest(t, kube.Client, namespace, "nvidia-driver-daemonset-ubuntu2204") {
					return false, n + " not done"
				}
			}
			return true, ""
		})
		w.end()
		if w.maxCordoned > 1 {
			t.Errorf("%d nodes cordoned at once, want at most maxUnavailable=1", w.maxCordoned)
		}
		if w.maxCordoned == 0 {
			t.Error("no node was ever cordoned: the rollout was not observed")
		}
		after := gpuPodUIDs(t, workloadNS)
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if uids[n] == after[n] {
				t.Errorf("the GPU pod on %s was not moved off for the driver change", n)
			}
			evicted := false
			for _, r := range stand.Runs() {
				// the old pod's upgrade gate, which ran since before the upgrade and empties its node before it stops,
				// or the new pod's driver manager (GPU pods that arrived meanwhile)
				during := (r.Component == kubelet.UncordonRun && r.Ended.After(start)) || (r.Component == kubelet.DriverManagerRun && r.Started.After(start))
				if during && r.Node == n && strings.Contains(r.Output, "GPU pods evicted") {
					evicted = true
				}
			}
			if !evicted {
				t.Errorf("%s: neither its old pod's upgrade gate nor a driver manager run evicted its GPU pods (Eviction API)", n)
			}
		}
	})

	if err := target().Uninstall(); err != nil {
		t.Fatal(err)
	}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if got := rollouttest.Node(t, kube.Client, n).Labels["nvidia.com/mig.config"]; got != "all-disabled" {
			t.Errorf("%s: uninstall changed the operator's nvidia.com/mig.config to %q", n, got)
		}
	}
}

// TestTakeoverWithAnotherDriverVersion: values that ask for another driver version than the operator's take the
// driver change path on every node: nothing adopted, the operator's driver unloaded and replaced, every GPU pod
// evicted through the Eviction API (the PodDisruptionBudget honoured), and the gate passes. A first install paces
// nothing (the DaemonSet starts every driver pod at once; driver.upgradePolicy.maxUnavailable paces rollouts of an
// installed chart), which is why the README takes over with the operator's version and upgrades after.
func TestTakeoverWithAnotherDriverVersion(t *testing.T) {
	ctx := t.Context()
	hosts := map[string]*kmodtest.Fixture{}
	operator(t, hosts)
	const workloadNS = "ml-other-version"
	uids := startWorkloads(t, workloadNS)
	values := migrate(t)
	w := watchTakeover(t, workloadNS)
	removeOperator(t)
	start := time.Now()
	if _, err := target().Install(ctx, []string{values}, "driver.image.tag="+newVersion); err != nil {
		logRuns(t, start)
		t.Fatalf("install: %v", err)
	}
	t.Cleanup(func() { _ = target().Uninstall() })
	rollouttest.WaitFor(t, 2*time.Minute, "every GPU node upgrade-done with the new driver", func() (bool, string) {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			nd := rollouttest.Node(t, kube.Client, n)
			if nd.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeDone) || nd.Spec.Unschedulable {
				return false, n + " is " + nd.Labels[nodestate.UpgradeStateLabel]
			}
		}
		return true, ""
	})
	w.end()
	t.Logf("takeover with driver %s of %d nodes in %s; %d nodes cordoned at once at most", newVersion, len(hosts),
		time.Since(start).Round(100*time.Millisecond), w.maxCordoned)
	digest := rollouttest.DriverDigest(t, kube.Client, namespace, "nvidia-driver-daemonset-ubuntu2204")
	after := gpuPodUIDs(t, workloadNS)
	for n, f := range hosts {
		unloaded, evicted := false, false
		for _, c := range f.Kernel.CallList() {
			unloaded = unloaded || c == "delete_module nvidia"
		}
		for _, r := range stand.Runs() {
			if r.Component != kubelet.DriverManagerRun || r.Node != n || !r.Started.After(start) {
				continue
			}
			if strings.Contains(r.Output, "adopted") {
				t.Errorf("%s: the driver manager adopted a driver of another version:\n%s", n, r.Output)
			}
			evicted = evicted || strings.Contains(r.Output, "GPU pods evicted")
		}
		if !unloaded || !evicted {
			t.Errorf("%s: operator's driver unloaded %v, GPU pods evicted through the Eviction API %v; want both", n, unloaded, evicted)
		}
		if d, _, _ := f.Host().RecordedDigest(); d != digest {
			t.Errorf("%s: host records %q, want the new driver's %s", n, d, digest)
		}
		if uids[n] == after[n] {
			t.Errorf("%s: the GPU pod was not moved off for the driver change", n)
		}
	}
	if t.Failed() {
		logRuns(t, start)
	}
	if err := target().Uninstall(); err != nil {
		t.Fatal(err)
	}
}

func logRuns(t *testing.T, since time.Time) {
	for _, r := range stand.Runs() {
		if r.Started.After(since) {
			t.Logf("%s %s on %s (exit %d):\n%s", r.Component, r.Pod, r.Node, r.ExitCode, r.Output)
		}
	}
}

func ptr[T any](v T) *T { return &v }
