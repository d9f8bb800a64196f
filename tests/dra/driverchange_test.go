package dra

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/draplugin"
)

const (
	// changeNode is the DRA node whose driver change is followed; its claim holder is pinned to it.
	changeNode = "gpu-01"
	holderNS   = "ml-driver"
	// legacyTag pins the device-plugin pool's driver, so that the change of the default pool's driver leaves it.
	legacyTag      = "595.91.07"
	changedTag     = "600.10.01"
	draPluginLabel = "nvidia.com/gpu.deploy.dra-driver"
)

// step is one thing the API server saw (or, for the unload, the revision the API server was at when the fake
// kernel got the first delete_module), in etcd revision order.
type step struct {
	What string
	RV   int64
	At   time.Time
}

// timeline records steps from watches; first keeps only the first step of each name.
type timeline struct {
	mu    sync.Mutex
	steps []step
	seen  map[string]bool
}

func (tl *timeline) add(what string, rv string) {
	n, _ := strconv.ParseInt(rv, 10, 64)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.seen[what] {
		return
	}
	tl.seen[what] = true
	tl.steps = append(tl.steps, step{what, n, time.Now()})
}

func (tl *timeline) get(what string) (step, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, s := range tl.steps {
		if s.What == what {
			return s, true
		}
	}
	return step{}, false
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	s := slices.Clone(tl.steps)
	slices.SortStableFunc(s, func(a, b step) int { return int(a.RV - b.RV) })
	var b strings.Builder
	for _, st := range s {
		fmt.Fprintf(&b, "  rv %-8d %s  %s\n", st.RV, st.At.Format("15:04:05.000"), st.What)
	}
	return b.String()
}

// TestDRADriverChangeOrder: a driver change of the DRA pool, with the driver manager and the upgrade gate run for
// real against fake kernels, on a DRA node whose pod holds a GPU claim that the scheduler allocated: watched on the
// API server, the claim holder is evicted first, then the DRA kubelet plugin's switch is paused and its pod goes,
// then the driver unloads; the plugin's switch is restored and its pod comes back, the new driver runs, and the node
// ends upgrade-done. The device-plugin pool, whose driver does not change, is not touched.
func TestDRADriverChangeOrder(t *testing.T) {
	start := time.Now()
	ctx := t.Context()
	profile := filepath.Join(chartrender.RepoRoot(), "values", "dra-mixed.yaml")
	// no canary: the gate then waits for the whole pool (with one it passes once the canary validated), so its report
	// shows every DRA node after its change
	settings := []string{"driver.upgradePolicy.maxUnavailable=100%", "driver.upgradePolicy.canary=0", "driver.pools[0].image.tag=" + legacyTag}
	hosts := map[string]*kmodtest.Fixture{}
	for _, n := range nodes {
		if _, gpu := n.Status.Capacity["nvidia.com/gpu"]; gpu {
			hosts[n.Name] = kmodtest.New(t)
			stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: hosts[n.Name]})
		}
	}

	plugin, stopPlugin := context.WithCancel(ctx)
	defer stopPlugin()
	pluginErrs := make(chan error, 1)
	go draplugin.Play(plugin, kube.Client, namespace, pluginErrs)

	tg := target()
	if _, err := tg.Install(ctx, []string{profile}, settings...); err != nil {
		logHooks(t)
		t.Fatal(err)
	}
	defer func() { _ = target().Uninstall() }()
	waitForSlices(t, draNodes, pluginErrs)
	holder := startPinnedHolder(t)
	t.Logf("installed, claim holder %s running on %s, in %s", holder, changeNode, time.Since(start).Round(time.Millisecond))

	legacyBefore := operandPods(t, func(n string) bool { return slices.Contains(legacyNodes, n) })
	tl := &timeline{seen: map[string]bool{}}
	rv := currentRevision(t)
	go recordPods(ctx, t, tl, rv, holder)
	go recordNodes(ctx, t, tl, rv)
	var unloadCheck string
	hosts[changeNode].Kernel.Fail = func(call string) error {
		if !strings.HasPrefix(call, "delete_module ") {
			return nil
		}
		if _, ok := tl.get("unload"); !ok {
			// what the API server holds when the driver manager unloads: its revision, and the node's plugin pods
			unloadCheck = pluginPodsOn(changeNode)
			tl.add("unload", strconv.FormatInt(currentRevision(t), 10))
		}
		return nil
	}

	step := time.Now()
	tg.NoWait = true // the gate is the wait
	if _, err := tg.Upgrade(ctx, []string{profile}, append(settings, "driver.image.tag="+changedTag)...); err != nil {
		logHooks(t)
		t.Fatalf("driver change: %v\n%s", err, tl)
	}
	waitFor(t, 45*time.Second, "node "+changeNode+" upgrade-done and its DRA kubelet plugin back", tl.String, func() bool {
		_, done := tl.get("upgrade-done")
		_, back := tl.get("plugin pod back")
		return done && back
	})
	t.Logf("driver change on %s in %s; what the API server saw, in revision order:\n%s", changeNode, time.Since(step).Round(time.Millisecond), tl)

	order := []string{"holder evicted", "plugin paused", "plugin pod gone", "unload"}
	for i := 1; i < len(order); i++ {
		before(t, tl, order[i-1], order[i])
	}
	for _, after := range []string{"plugin resumed", "new driver running", "plugin pod back", "upgrade-done"} {
		before(t, tl, "unload", after)
	}
	// The plugin's switch comes back with the others when the driver manager hands the node to the new driver; its
	// pod then waits in its driver-validation init container for the new driver's driver-ready (kwok runs it at
	// once). The stand-in's validator does not wait for the node's slices as the real dra check does, so here the
	// node may reach upgrade-done before the plugin's pod is back; the post-upgrade gate below waits for the slices.
	before(t, tl, "plugin resumed", "plugin pod back")
	before(t, tl, "plugin resumed", "upgrade-done")
	before(t, tl, "new driver running", "upgrade-done")
	if unloadCheck != "" {
		t.Errorf("at the unload the DRA kubelet plugin still ran on %s: %s", changeNode, unloadCheck)
	}
	if s, ok := tl.get("legacy node touched"); ok {
		t.Errorf("the device-plugin pool was touched at rv %d:\n%s", s.RV, tl)
	}
	legacyAfter := operandPods(t, func(n string) bool { return slices.Contains(legacyNodes, n) })
	if d := podDiff(legacyBefore, legacyAfter); d != "" {
		t.Errorf("the driver change replaced operand pods on the device-plugin pool:\n%s", d)
	}
	// the post-upgrade gate passed with every DRA node's slices published, the device-plugin pool on the device plugin
	r, ok := stand.LastRun("validation-gate", step)
	if !ok || r.ExitCode != 0 {
		t.Errorf("post-upgrade gate (found %v, exit %d) did not pass:\n%s", ok, r.ExitCode, r.Output)
	}
	rows := gateRows(r.Output)
	for _, n := range draNodes {
		if row := rows[n]; len(row) < 2 || row[1] != "dra" || row[len(row)-1] != "ok" {
			t.Errorf("gate row of %s: %v, want allocation dra and its resourceslices ok:\n%s", n, row, r.Output)
		}
	}
	for _, n := range legacyNodes {
		if row := rows[n]; len(row) < 2 || row[1] != "device-plugin" || row[len(row)-1] != "." {
			t.Errorf("gate row of %s: %v, want allocation device-plugin and no slices cell:\n%s", n, row, r.Output)
		}
	}
	t.Logf("post-upgrade gate:\n%s", r.Output)
	select {
	case err := <-pluginErrs:
		t.Errorf("kubelet plugin stand-in: %v", err)
	default:
	}
	t.Logf("whole proof %s", time.Since(start).Round(time.Millisecond))
}

// gateRows are the gate table's rows by node name, split into fields (node, allocation, cells...).
func gateRows(out string) map[string][]string {
	rows := map[string][]string{}
	header := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "node" && f[1] == "allocation":
			header = true
		case header && len(f) > 2:
			rows[f[0]] = f
		}
	}
	return rows
}

// before fails unless step a was seen at a lower revision than step b.
func before(t *testing.T, tl *timeline, a, b string) {
	t.Helper()
	sa, oka := tl.get(a)
	sb, okb := tl.get(b)
	if !oka || !okb || sa.RV >= sb.RV {
		t.Errorf("want %q (seen %v, rv %d) before %q (seen %v, rv %d):\n%s", a, oka, sa.RV, b, okb, sb.RV, tl)
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, detail func() string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		logHooks(t)
		t.Fatalf("never, within %s: %s; the API server saw:\n%s", timeout, what, detail())
	}
}

// currentRevision is the API server's revision now (a quorum list's resourceVersion).
func currentRevision(t *testing.T) int64 {
	l, err := kube.Client.CoreV1().Namespaces().List(context.WithoutCancel(t.Context()), metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Error(err)
		return 0
	}
	n, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
	return n
}

// pluginPodsOn names the DRA kubelet plugin pods on node that are not being deleted ("" when none).
func pluginPodsOn(node string) string {
	pods, err := kube.Client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: draplugin.PluginSelector, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	return strings.Join(out, ", ")
}

func watchFrom(ctx context.Context, t *testing.T, rv int64, w cache.WatchFuncWithContext) <-chan watch.Event {
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, strconv.FormatInt(rv, 10), &cache.ListWatch{WatchFuncWithContext: w})
	if err != nil {
		t.Error(err)
		return nil
	}
	go func() { <-ctx.Done(); rw.Stop() }()
	return rw.ResultChan()
}

// recordPods records the claim holder's eviction, the change node's DRA kubelet plugin pod going and coming back,
// and its new driver pod running (init containers done: the driver manager finished and the driver loaded).
func recordPods(ctx context.Context, t *testing.T, tl *timeline, rv int64, holder string) {
	events := watchFrom(ctx, t, rv, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = "spec.nodeName=" + changeNode
		return kube.Client.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
	})
	for ev := range events {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		gone := ev.Type == watch.Deleted || p.DeletionTimestamp != nil
		switch {
		case p.Namespace+"/"+p.Name == holder && gone:
			tl.add("holder evicted", p.ResourceVersion)
		case p.Labels["app"] == "nvidia-dra-driver-kubelet-plugin" && gone:
			tl.add("plugin pod gone", p.ResourceVersion)
		case p.Labels["app"] == "nvidia-dra-driver-kubelet-plugin" && ev.Type == watch.Added:
			if _, ok := tl.get("plugin pod gone"); ok {
				tl.add("plugin pod back", p.ResourceVersion)
			}
		case p.Labels[kubelet.ComponentLabel] == kubelet.DriverComponent && strings.Contains(p.Spec.Containers[0].Image, ":"+changedTag):
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodInitialized && c.Status == corev1.ConditionTrue && !gone {
					tl.add("new driver running", p.ResourceVersion)
				}
			}
		}
	}
}

// recordNodes records the change node's DRA plugin switch and upgrade states, and any change of a device-plugin
// node's labels, annotations or cordon.
func recordNodes(ctx context.Context, t *testing.T, tl *timeline, rv int64) {
	events := watchFrom(ctx, t, rv, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return kube.Client.CoreV1().Nodes().Watch(ctx, o)
	})
	legacy := map[string]string{}
	for _, n := range legacyNodes {
		legacy[n] = nodeShape(t, n, nil)
	}
	paused, state := false, string(nodestate.UpgradeDone)
	for ev := range events {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			continue
		}
		if was, ok := legacy[n.Name]; ok && nodeShape(t, n.Name, n) != was {
			tl.add("legacy node touched", n.ResourceVersion)
		}
		if n.Name != changeNode {
			continue
		}
		sw := n.Labels[draPluginLabel]
		switch {
		case sw == nodestate.Paused:
			paused = true
			tl.add("plugin paused", n.ResourceVersion)
		case paused:
			tl.add("plugin resumed", n.ResourceVersion)
		}
		if st := n.Labels[nodestate.UpgradeStateLabel]; st != state { // transitions only: status heartbeats repeat it
			state = st
			tl.add(st, n.ResourceVersion)
		}
	}
}

// nodeShape is what a driver change could change on a node: labels, annotations and cordon (of n, or read afresh).
func nodeShape(t *testing.T, name string, n *corev1.Node) string {
	if n == nil {
		var err error
		if n, err = kube.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{}); err != nil {
			t.Error(err)
			return ""
		}
	}
	return fmt.Sprint(n.Labels, n.Annotations, n.Spec.Unschedulable)
}

// startPinnedHolder runs a ReplicaSet's pod on changeNode that takes one GPU through a claim from a template, and
// returns it (namespace/name) once it runs with its claim allocated there.
func startPinnedHolder(t *testing.T) string {
	t.Helper()
	ctx := t.Context()
	c := kube.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: holderNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: holderNS},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: draplugin.GPUDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			}}},
		}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(holderNS).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "infer"}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: holderNS},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				NodeSelector:   map[string]string{"kubernetes.io/hostname": changeNode},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
				Containers: []corev1.Container{{Name: "infer", Image: "busybox", Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: "gpu"}},
				}}},
			}}},
	}
	if _, err := c.AppsV1().ReplicaSets(holderNS).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var name string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := c.CoreV1().Pods(holderNS).List(ctx, metav1.ListOptions{LabelSelector: "app=infer"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false, err
		}
		claims, err := c.ResourceV1().ResourceClaims(holderNS).List(ctx, metav1.ListOptions{})
		if err != nil || len(claims.Items) != 1 {
			return false, err
		}
		a := claims.Items[0].Status.Allocation
		if a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Pool != changeNode {
			return false, fmt.Errorf("claim %s allocated %v, want a device of pool %s", claims.Items[0].Name, a, changeNode)
		}
		name = pods.Items[0].Name
		return true, nil
	})
	if err != nil {
		t.Fatalf("claim holder never ran on %s: %v", changeNode, err)
	}
	return holderNS + "/" + name
}
