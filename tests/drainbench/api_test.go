package drainbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanager"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpudrain"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func gpuPods(prefix string, n int, labels map[string]string) []podSpec {
	var out []podSpec
	for i := range n {
		out = append(out, podSpec{name: fmt.Sprintf("%s-%d", prefix, i), gpu: true, labels: labels})
	}
	return out
}

func TestGPUEvictionTakesOnlyGPUPods(t *testing.T) {
	const node = "evict-gpu-only"
	addGPUNode(t, node, nil)
	owner := namespace(t, "evict-gpu-only")
	specs := append(gpuPods("train", 4, nil), podSpec{name: "web-0"}, podSpec{name: "web-1"}, podSpec{name: "bare-cpu", bare: true})
	createPods(t, owner, node, specs...)
	// A GPU DaemonSet pod (an operand-like client): DaemonSet pods are never evicted.
	dsPodName := gpuDaemonSet(t, owner.Namespace, "gpu-agent", node)

	c := &counter{}
	o := gpudrain.Options{Client: countingClient(t, c, 50, 100), Node: node, GPUOnly: true, Timeout: time.Minute}
	o.Complete()
	var out bytes.Buffer
	res, err := o.Run(t.Context(), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	slices.Sort(res.Pods)
	want := []string{"evict-gpu-only/train-0", "evict-gpu-only/train-1", "evict-gpu-only/train-2", "evict-gpu-only/train-3"}
	if !slices.Equal(res.Pods, want) {
		t.Fatalf("evicted %v, want %v", res.Pods, want)
	}
	left := slices.Sorted(maps.Keys(nodePodNames(t, owner.Namespace, node)))
	if wantLeft := slices.Sorted(slices.Values([]string{"bare-cpu", dsPodName, "web-0", "web-1"})); !slices.Equal(left, wantLeft) {
		t.Fatalf("pods left %v, want %v", left, wantLeft)
	}
	// About one request per evicted pod: list, the DaemonSet check, discovery, one watch, the evictions.
	if n := c.Total(); n > len(want)+5 {
		t.Fatalf("%d API requests for %d evictions:\n%s", n, len(want), strings.Join(c.reqs, "\n"))
	}
}

// gpuDaemonSet runs a GPU-requesting DaemonSet on node and returns its pod's name once Ready.
func gpuDaemonSet(t *testing.T, ns, name, node string) string {
	t.Helper()
	labels := map[string]string{"app": name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": node},
					Containers: []corev1.Container{{Name: "agent", Image: "registry.example/agent:1", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}},
				},
			},
		},
	}
	if _, err := kube.Client.AppsV1().DaemonSets(ns).Create(t.Context(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var podName string
	waitPods(t, ns, node, "app="+name, func(ps []*corev1.Pod) bool {
		for _, p := range ps {
			if podReady(p) {
				podName = p.Name
				return true
			}
		}
		return false
	})
	return podName
}

// A budget that allows no disruption: the pass waits on a watch of the budgets (no requests), then gives up at
// its timeout naming every pod and the budget.
func TestPDBRefusalIsWatchedNotPolled(t *testing.T) {
	const node = "pdb-blocked"
	addGPUNode(t, node, nil)
	owner := namespace(t, "pdb-blocked")
	createPods(t, owner, node, gpuPods("guarded", 3, map[string]string{"app": "guarded"})...)
	pdb(t, owner.Namespace, "guarded", 3)

	c := &counter{}
	o := gpudrain.Options{Client: countingClient(t, c, 50, 100), Node: node, GPUOnly: true, Timeout: 8 * time.Second}
	o.Complete()
	start := time.Now()
	_, err := o.Run(t.Context(), &bytes.Buffer{})
	elapsed := time.Since(start)
	var stuck *gpudrain.StuckError
	if !errors.As(err, &stuck) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a StuckError at the deadline", err)
	}
	if len(stuck.Pods) != 3 {
		t.Fatalf("stuck pods %+v, want 3", stuck.Pods)
	}
	for _, p := range stuck.Pods {
		if !slices.Equal(p.Budgets, []string{"pdb-blocked/guarded-budget"}) || !strings.Contains(p.Reason, "disruptionsAllowed 0") {
			t.Fatalf("stuck pod %+v does not name the budget", p)
		}
	}
	if elapsed > 15*time.Second {
		t.Fatalf("gave up after %s with an 8s timeout", elapsed)
	}
	if waiting := c.Between(start.Add(2*time.Second), start.Add(8*time.Second)); waiting > 1 {
		t.Fatalf("%d requests while blocked (want none):\n%s", waiting, strings.Join(c.reqs, "\n"))
	}
	if left := nodePodNames(t, owner.Namespace, node); len(left) != 3 {
		t.Fatalf("pods left %v, want all 3", left)
	}
}

// When the budget starts allowing disruptions, the watch sees it and the refused evictions are sent again.
func TestEvictionProceedsWhenTheBudgetAllows(t *testing.T) {
	const node = "pdb-paced"
	addGPUNode(t, node, nil)
	owner := namespace(t, "pdb-paced")
	createPods(t, owner, node, gpuPods("paced", 3, map[string]string{"app": "paced"})...)
	b := pdb(t, owner.Namespace, "paced", 3)

	c := &counter{}
	o := gpudrain.Options{Client: countingClient(t, c, 50, 100), Node: node, GPUOnly: true, Timeout: time.Minute}
	o.Complete()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := o.Run(t.Context(), &bytes.Buffer{})
		done <- err
	}()
	time.Sleep(4 * time.Second) // blocked meanwhile
	blocked := c.Between(start.Add(2*time.Second), time.Now())
	patch := []byte(`{"spec":{"minAvailable":0}}`)
	if _, err := kube.Client.PolicyV1().PodDisruptionBudgets(owner.Namespace).Patch(t.Context(), b.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("eviction did not proceed after the budget allowed it")
	}
	if left := nodePodNames(t, owner.Namespace, node); len(left) != 0 {
		t.Fatalf("pods left %v", left)
	}
	if blocked > 1 {
		t.Fatalf("%d requests while blocked", blocked)
	}
	evictions := 0
	for _, r := range c.reqs {
		if strings.HasPrefix(r, "POST") && strings.Contains(r, "/eviction") {
			evictions++
		}
	}
	if evictions > 6 {
		t.Fatalf("%d eviction requests for 3 pods refused once each:\n%s", evictions, strings.Join(c.reqs, "\n"))
	}
}

// The operands' DaemonSets of the driver-manager tests: on every node labelled operandNodeLabel=true, honouring
// the nvidia.com/gpu.deploy.<operand> switch (absent or true), as the chart's DaemonSets do.
const (
	operatorNamespace = "gpu-system"
	operandNodeLabel  = "drainbench.kube-gpu-stack.io/operands"
)

var operandsOnce sync.Once

func operands(t *testing.T) {
	t.Helper()
	operandsOnce.Do(func() {
		ctx := context.Background()
		if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"device-plugin", "operator-validator"} {
			sw := nodestate.DeployLabelPrefix + op
			onNode := corev1.NodeSelectorRequirement{Key: operandNodeLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}
			labels := map[string]string{"app": "nvidia-" + op, drivermanager.ComponentLabel: op}
			ds := &appsv1.DaemonSet{
				ObjectMeta: metav1.ObjectMeta{Name: "nvidia-" + op, Namespace: operatorNamespace},
				Spec: appsv1.DaemonSetSpec{
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{
							Containers: []corev1.Container{{Name: op, Image: "registry.example/" + op + ":1"}},
							Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
								NodeSelectorTerms: []corev1.NodeSelectorTerm{
									{MatchExpressions: []corev1.NodeSelectorRequirement{onNode, {Key: sw, Operator: corev1.NodeSelectorOpDoesNotExist}}},
									{MatchExpressions: []corev1.NodeSelectorRequirement{onNode, {Key: sw, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}},
								}}}},
						},
					},
				},
			}
			if _, err := kube.Client.AppsV1().DaemonSets(operatorNamespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// dmNode is a simulated GPU node for the driver-manager tests: operands running and Ready on it, a containerized
// driver loaded in its fixture host tree (old digest), GPU and CPU workloads in its own namespace.
type dmNode struct {
	name  string
	owner *corev1.ConfigMap
	host  *kmodtest.Fixture
}

const (
	oldDigest = "old-driver-config"
	newDigest = "new-driver-config"
)

func newDMNode(t *testing.T, name string, labels map[string]string, pods ...podSpec) *dmNode {
	t.Helper()
	operands(t)
	l := map[string]string{operandNodeLabel: "true"}
	maps.Copy(l, labels)
	addGPUNode(t, name, l)
	waitOperands(t, name, 2)
	n := &dmNode{name: name, owner: namespace(t, name), host: kmodtest.New(t)}
	n.host.LoadDriver()
	n.host.DriverState(oldDigest)
	n.host.PidFile()
	n.host.MountDriverRoot()
	if len(pods) > 0 {
		createPods(t, n.owner, name, pods...)
	}
	return n
}

func waitOperands(t *testing.T, node string, ready int) {
	t.Helper()
	waitPods(t, operatorNamespace, node, drivermanager.ComponentLabel, func(ps []*corev1.Pod) bool {
		n := 0
		for _, p := range ps {
			if podReady(p) && p.DeletionTimestamp == nil {
				n++
			}
		}
		return n == ready
	})
}

func (n *dmNode) options(t *testing.T, c *counter) *drivermanager.Options {
	o := &drivermanager.Options{
		Client: countingClient(t, c, 50, 100), NodeName: n.name, Namespace: operatorNamespace, Host: n.host.Host(),
		Digest: newDigest, Eviction: drivermanager.Eviction{Enabled: true, Timeout: time.Minute}, OperandTimeout: time.Minute,
	}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

func (n *dmNode) node(t *testing.T) *corev1.Node {
	t.Helper()
	node, err := kube.Client.CoreV1().Nodes().Get(t.Context(), n.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func (n *dmNode) uncordon(t *testing.T) {
	t.Helper()
	o := drivermanager.UncordonOptions{Client: kube.Client, NodeName: n.name, Namespace: operatorNamespace, Timeout: time.Minute}
	o.Complete()
	var out bytes.Buffer
	if err := o.Run(t.Context(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
}

func operandUIDs(t *testing.T, node string) map[types.UID]string {
	t.Helper()
	list, err := kube.Client.CoreV1().Pods(operatorNamespace).List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]string{}
	for _, p := range list.Items {
		out[p.UID] = p.Name
	}
	return out
}

func upgradeState(n *corev1.Node) nodestate.UpgradeState {
	return nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
}

// A driver change on a node: GPU pods evicted, the rest left, operands paused until their pods are gone, the
// driver unloaded, the node kept cordoned until the validator (back after the resume) is Ready, then uncordoned.
func TestDriverManagerUpgradesANode(t *testing.T) {
	n := newDMNode(t, "dm-upgrade", map[string]string{nodestate.DeployLabelPrefix + "device-plugin": "true"},
		append(gpuPods("train", 3, nil), podSpec{name: "web"})...)
	before := operandUIDs(t, n.name)
	c := &counter{}
	var out bytes.Buffer
	if err := n.options(t, c).Run(t.Context(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if left := nodePodNames(t, n.owner.Namespace, n.name); !maps.Equal(left, map[string]bool{"web": true}) {
		t.Fatalf("workload pods left %v, want only web", left)
	}
	if mods := n.host.LoadedModules(); len(mods) != 0 {
		t.Fatalf("modules still loaded: %v", mods)
	}
	now := operandUIDs(t, n.name)
	for uid, name := range before {
		if _, ok := now[uid]; ok {
			t.Fatalf("operand pod %s outlived the pause", name)
		}
	}
	node := n.node(t)
	if upgradeState(node) != nodestate.ValidationRequired || !node.Spec.Unschedulable || !nodestate.CordonedByUs(node) {
		t.Fatalf("state %q unschedulable %v ours %v", upgradeState(node), node.Spec.Unschedulable, nodestate.CordonedByUs(node))
	}
	if node.Labels[nodestate.DeployLabelPrefix+"device-plugin"] != "true" || node.Labels[nodestate.DeployLabelPrefix+"dcgm"] != "" {
		t.Fatalf("switches not restored: %v", node.Labels)
	}
	t.Logf("driver manager: %d API requests\n%s", c.Total(), out.String())

	n.uncordon(t) // the validator DaemonSet's pod comes back (switch resumed) and turns Ready
	node = n.node(t)
	if upgradeState(node) != nodestate.UpgradeDone || node.Spec.Unschedulable || nodestate.CordonedByUs(node) {
		t.Fatalf("after validation: state %q unschedulable %v", upgradeState(node), node.Spec.Unschedulable)
	}
}

// A budget that never allows eviction: the node fails within the timeout with a reason naming pod and budget,
// and is restored (operands resumed, our cordon lifted, driver untouched).
func TestDriverManagerFailsOnAnUnevictablePodAndRestores(t *testing.T) {
	n := newDMNode(t, "dm-pdb", nil, podSpec{name: "critical", gpu: true, labels: map[string]string{"app": "critical"}})
	pdb(t, n.owner.Namespace, "critical", 1)
	o := n.options(t, &counter{})
	o.Eviction.Timeout = 5 * time.Second
	start := time.Now()
	err := o.Run(t.Context(), &bytes.Buffer{})
	if err == nil {
		t.Fatal("the run succeeded with an unevictable GPU pod")
	}
	if time.Since(start) > 30*time.Second {
		t.Fatalf("failed after %s with a 5s eviction timeout", time.Since(start))
	}
	for _, want := range []string{"dm-pdb/critical", "PodDisruptionBudget dm-pdb/critical-budget"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	node := n.node(t)
	if upgradeState(node) != nodestate.UpgradeFailed || !strings.Contains(node.Annotations[nodestate.UpgradeReasonAnnotation], "critical-budget") {
		t.Fatalf("state %q reason %q", upgradeState(node), node.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if node.Spec.Unschedulable || nodestate.CordonedByUs(node) {
		t.Fatal("our cordon was not lifted after the failure")
	}
	for k, v := range node.Labels {
		if v == nodestate.Paused {
			t.Fatalf("%s left paused", k)
		}
	}
	if mods := n.host.LoadedModules(); len(mods) != 4 {
		t.Fatalf("driver touched: modules %v", mods)
	}
	waitOperands(t, n.name, 2)
}

// Killed after each step (nothing restored, as a kill leaves it) and started again, the driver manager converges
// on the real API server: GPU pods gone, nothing paused, the admin's cordon kept, ours only until validation.
func TestDriverManagerKilledAfterEachStepConverges(t *testing.T) {
	for i, step := range drivermanager.Steps {
		adminCordon := i%2 == 1
		t.Run(step, func(t *testing.T) {
			n := newDMNode(t, "dm-kill-"+step, nil, append(gpuPods("train", 2, nil), podSpec{name: "web"})...)
			if adminCordon {
				if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			killed := errors.New("killed")
			o := n.options(t, &counter{})
			o.AfterStep = func(s string) error {
				if s == step {
					return killed
				}
				return nil
			}
			if err := o.Run(t.Context(), &bytes.Buffer{}); !errors.Is(err, killed) {
				t.Fatalf("first run: %v", err)
			}
			var out bytes.Buffer
			if err := n.options(t, &counter{}).Run(t.Context(), &out); err != nil {
				t.Fatalf("restarted run: %v\n%s", err, out.String())
			}
			node := n.node(t)
			for k, v := range node.Labels {
				if v == nodestate.Paused {
					t.Fatalf("%s left paused", k)
				}
			}
			if upgradeState(node) != nodestate.ValidationRequired || !node.Spec.Unschedulable || nodestate.CordonedByUs(node) == adminCordon {
				t.Fatalf("state %q unschedulable %v ours %v (admin cordon %v)", upgradeState(node), node.Spec.Unschedulable, nodestate.CordonedByUs(node), adminCordon)
			}
			if left := nodePodNames(t, n.owner.Namespace, n.name); !maps.Equal(left, map[string]bool{"web": true}) {
				t.Fatalf("workload pods left %v", left)
			}
			n.uncordon(t)
			node = n.node(t)
			if upgradeState(node) != nodestate.UpgradeDone || node.Spec.Unschedulable != adminCordon {
				t.Fatalf("end: state %q unschedulable %v (admin cordon %v)", upgradeState(node), node.Spec.Unschedulable, adminCordon)
			}
		})
	}
}

// Evicting the GPU pods fails (an unmanaged GPU pod, force off); with auto-drain the node is drained instead,
// with the drain's own switches (force on, a pod selector that keeps app=keep): drain-required on the way.
func TestDriverManagerFallsBackToADrain(t *testing.T) {
	n := newDMNode(t, "dm-drain", nil,
		podSpec{name: "bare-gpu", gpu: true, bare: true},
		podSpec{name: "web", labels: map[string]string{"app": "web"}},
		podSpec{name: "keeper", labels: map[string]string{"app": "keep"}})
	o := n.options(t, &counter{})
	o.Drain = drivermanager.Drain{Enabled: true, Force: true, PodSelector: "app!=keep", Timeout: time.Minute}
	var out bytes.Buffer
	if err := o.Run(t.Context(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if left := nodePodNames(t, n.owner.Namespace, n.name); !maps.Equal(left, map[string]bool{"keeper": true}) {
		t.Fatalf("pods left %v, want only keeper", left)
	}
	for _, want := range []string{"not managed by a controller", "draining the node (auto-drain)", `msg="node drained"`} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("log lacks %q:\n%s", want, out.String())
		}
	}
	if node := n.node(t); upgradeState(node) != nodestate.ValidationRequired || !node.Spec.Unschedulable {
		t.Fatalf("state %q unschedulable %v", upgradeState(node), node.Spec.Unschedulable)
	}
}
