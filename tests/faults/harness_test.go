package faults

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	namespace  = "gpu-operator"
	release    = "gpu"
	workloadNS = "ml"
	// maxUnavailable is the driver pool's rollout bound.
	maxUnavailable = 2
	// evictionTimeout bounds the GPU pod eviction, in seconds: long enough for the scenarios that change things
	// while the manager waits on a PodDisruptionBudget.
	evictionTimeout = 40
	// driverDaemonSet is the pool's driver DaemonSet for the nodes' OS.
	driverDaemonSet = "nvidia-driver-daemonset-ubuntu2204"
)

func profile() []string {
	return []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
}

// settings are the release's values on top of the profile, for driver tag tag.
func settings(tag string, extra ...string) []string {
	return append([]string{
		fmt.Sprintf("driver.upgradePolicy.maxUnavailable=%d", maxUnavailable),
		fmt.Sprintf("driver.manager.gpuPodDeletion.timeoutSeconds=%d", evictionTimeout),
		// a rollout here takes well under a minute on an idle machine, and up to about two while the other test
		// packages share its two cores; a stopped one fails the gate (and ends the release) after this long
		"hooks.validation.timeoutSeconds=180",
		"driver.image.tag=" + tag,
	}, extra...)
}

func target() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: 4 * time.Minute, NoWait: true}
}

func patchNode(t *testing.T, name, patch string) {
	t.Helper()
	if _, err := kube.Client.CoreV1().Nodes().Patch(context.Background(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch node %s: %v", name, err)
	}
}

// upgrade is one `helm upgrade` running in the background.
type upgrade struct {
	done chan struct{}
	err  error
}

func startUpgrade(ctx context.Context, set []string) *upgrade {
	u := &upgrade{done: make(chan struct{})}
	go func() {
		defer close(u.done)
		_, u.err = target().Upgrade(ctx, profile(), set...)
	}()
	return u
}

// wait returns the upgrade's error, or says it is still running after timeout.
func (u *upgrade) wait(timeout time.Duration) error {
	select {
	case <-u.done:
		return u.err
	case <-time.After(timeout):
		return fmt.Errorf("helm upgrade still running after %s more", timeout)
	}
}

// settle waits until every GPU node is upgrade-done with a Ready driver pod of the DaemonSet's current template
// (true), or until nothing moves any more with some node upgrade-failed (false: the failure is the scenario's
// to report), failing the test after timeout.
func settle(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	var last string
	var stuckSince time.Time
	var lastStates string
	ok := false
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		done, why, states, failed := rolledOut(t)
		last = why
		if done {
			ok = true
			return true, nil
		}
		if !failed || states != lastStates {
			stuckSince, lastStates = time.Now(), states
			return false, nil
		}
		return time.Since(stuckSince) > 5*time.Second, nil
	})
	if err != nil {
		t.Fatalf("the rollout neither finished nor stopped on a failed node within %s: %s\n%s", timeout, last, nodeTable(t))
	}
	return ok
}

// rolledOut: every GPU node upgrade-done and its driver pod, of the DaemonSet's current template, Ready. states
// is every node's state (to see whether anything moves), failed whether a node is upgrade-failed.
func rolledOut(t *testing.T) (done bool, why, states string, failed bool) {
	ctx := t.Context()
	ds, err := kube.Client.AppsV1().DaemonSets(namespace).Get(ctx, driverDaemonSet, metav1.GetOptions{})
	if err != nil {
		return false, err.Error(), "", false
	}
	pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		return false, err.Error(), "", false
	}
	ready := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Spec.Containers[0].Image != ds.Spec.Template.Spec.Containers[0].Image {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready[p.Spec.NodeName] = true
			}
		}
	}
	// one list, not a get per node: settle asks four times a second for minutes on end
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error(), "", false
	}
	byName := map[string]*corev1.Node{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	done = true
	var st []string
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		node, ok := byName[n]
		if !ok {
			t.Fatalf("node %s is gone", n) // as the get per node it replaces failed
		}
		s := node.Labels[nodestate.UpgradeStateLabel]
		st = append(st, n+"="+s+fmt.Sprint(ready[n]))
		failed = failed || s == string(nodestate.UpgradeFailed)
		if s != string(nodestate.UpgradeDone) || !ready[n] {
			if done {
				why = fmt.Sprintf("node %s: %s, new driver pod Ready %v", n, s, ready[n])
			}
			done = false
		}
	}
	return done, why, strings.Join(st, " "), failed
}

// nodeTable is every GPU node's state, cordon and reason, for failure messages.
func nodeTable(t *testing.T) string {
	var b strings.Builder
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		node := rollouttest.Node(t, kube.Client, n)
		fmt.Fprintf(&b, "  %s: %s unschedulable=%v ours=%v reason=%q\n", n, node.Labels[nodestate.UpgradeStateLabel],
			node.Spec.Unschedulable, nodestate.CordonedByUs(node), node.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	return b.String()
}

// endState says what each node must look like once a scenario's faults cleared.
type endState struct {
	// adminCordoned nodes are cordoned by the admin (kept, and their GPU workload stays away).
	adminCordoned map[string]bool
	// labels are labels the admin set that must survive, node -> key -> value.
	labels map[string]map[string]string
}

// assertEndState checks every GPU node: upgrade-done, no cordon of ours and the admin's kept, nothing paused and no
// pause record, the admin's labels, the new driver loaded on its fixture host, and the GPU workload running again
// where the admin did not cordon the node. It logs one line per node (the measured end state).
func assertEndState(t *testing.T, hosts map[string]*kmodtest.Fixture, want endState) {
	t.Helper()
	digest := rollouttest.DriverDigest(t, kube.Client, namespace, driverDaemonSet)
	// the evicted GPU workloads come back where the nodes are schedulable (a node left cordoned is reported below)
	_ = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		running := runningGPU(t)
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if !want.adminCordoned[n] && !running[n] && !rollouttest.Node(t, kube.Client, n).Spec.Unschedulable {
				return false, nil
			}
		}
		return true, nil
	})
	running := runningGPU(t)
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		node := rollouttest.Node(t, kube.Client, n)
		var problems []string
		st := node.Labels[nodestate.UpgradeStateLabel]
		if st != string(nodestate.UpgradeDone) {
			problems = append(problems, fmt.Sprintf("state %s (reason %q)", st, node.Annotations[nodestate.UpgradeReasonAnnotation]))
		}
		if nodestate.CordonedByUs(node) {
			problems = append(problems, "still cordoned by the upgrade")
		}
		if node.Spec.Unschedulable != want.adminCordoned[n] {
			problems = append(problems, fmt.Sprintf("unschedulable=%v, want %v (the admin's cordon only)", node.Spec.Unschedulable, want.adminCordoned[n]))
		}
		paused := false
		if v, ok := node.Annotations[nodestate.PausedLabelsAnnotation]; ok {
			problems, paused = append(problems, "pause record left: "+v), true
		}
		for k, v := range node.Labels {
			if strings.HasPrefix(k, nodestate.DeployLabelPrefix) && v == nodestate.Paused {
				problems, paused = append(problems, k+" left paused"), true
			}
		}
		for k, v := range want.labels[n] {
			if got, ok := node.Labels[k]; got != v || !ok {
				problems = append(problems, fmt.Sprintf("the admin's %s=%s, set while the node was being evicted, became %q (present %v) after the pause and resume: the pause recorded the value of a node read before the eviction",
					k, v, got, ok))
			}
		}
		mods := hosts[n].LoadedModules()
		recorded, _, err := hosts[n].Host().RecordedDigest()
		if err != nil {
			problems = append(problems, err.Error())
		}
		if len(mods) != 4 || recorded != digest {
			problems = append(problems, fmt.Sprintf("host runs driver config %s with modules %v, want the new %s loaded",
				nodestate.ShortDigest(recorded), mods, nodestate.ShortDigest(digest)))
		}
		if !running[n] && !want.adminCordoned[n] {
			problems = append(problems, "GPU workload not running")
		}
		t.Logf("end state %s: %s, unschedulable=%v (admin's cordon %v), cordoned by us=%v, paused=%v, driver %s with %d modules (new %v), GPU workload running=%v",
			n, st, node.Spec.Unschedulable, want.adminCordoned[n], nodestate.CordonedByUs(node), paused,
			nodestate.ShortDigest(recorded), len(mods), recorded == digest, running[n])
		if len(problems) > 0 {
			t.Errorf("node %s: %s", n, strings.Join(problems, "; "))
		}
	}
}

// retryFailed runs `kube-gpu-stack upgrade retry` for every upgrade-failed node (what the admin does once the
// cause is gone), and says which.
func retryFailed(t *testing.T) []string {
	t.Helper()
	var retried []string
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeFailed) {
			continue
		}
		var out bytes.Buffer
		cmd := stackcli.NewCommand(&out)
		cmd.SetArgs([]string{"upgrade", "retry", n, "--kubeconfig", kube.Kubeconfig, "-n", namespace, "--release", release})
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("upgrade retry %s: %v\n%s", n, err, out.String())
		}
		retried = append(retried, n)
	}
	return retried
}

// recorder watches every node (an informer: it survives an API server restart) and checks the invariants of a
// rollout under faults:
//   - never more than maxUnavailable nodes out of service: in flight (cordon-required .. uncordon-required),
//     upgrade-failed, or cordoned by the upgrade;
//   - no node uncordoned by the upgrade without a validator Ready since its current driver started to install
//     (kube-gpu-stack.io/driver-since).
//
// It also keeps each node's sequence of states.
type recorder struct {
	mu  sync.Mutex
	seq map[string][]nodestate.UpgradeState
	// versions are the node versions the recorder saw, in the order it saw them (see outOfService)
	versions  []nodeVersion
	badRV     []string
	violation []string
	cancel    context.CancelFunc
}

// nodeVersion is one version of a node as the recorder saw it.
type nodeVersion struct {
	rv                    uint64
	seen                  time.Time
	name                  string
	state                 nodestate.UpgradeState
	cordonedByUs, unsched bool
	outOfService          bool
}

func recordNodes(t *testing.T) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{seq: map[string][]nodestate.UpgradeState{}, cancel: cancel}
	factory := informers.NewSharedInformerFactory(kube.Client, 0)
	inf := factory.Core().V1().Nodes().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { r.observe(nil, obj.(*corev1.Node)) },
		UpdateFunc: func(old, obj any) {
			r.observe(old.(*corev1.Node), obj.(*corev1.Node))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	t.Cleanup(r.stop)
	return r
}

func (r *recorder) observe(old, n *corev1.Node) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	if s := r.seq[n.Name]; st != "" && (len(s) == 0 || s[len(s)-1] != st) {
		r.seq[n.Name] = append(s, st)
	}
	v := nodeVersion{seen: now, name: n.Name, state: st, cordonedByUs: nodestate.CordonedByUs(n), unsched: n.Spec.Unschedulable}
	switch st {
	case nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired,
		nodestate.ValidationRequired, nodestate.UncordonRequired, nodestate.UpgradeFailed:
		v.outOfService = true
	default:
		v.outOfService = v.cordonedByUs
	}
	rv, err := strconv.ParseUint(n.ResourceVersion, 10, 64)
	if err != nil {
		r.badRV = append(r.badRV, fmt.Sprintf("node %s resourceVersion %q", n.Name, n.ResourceVersion))
	}
	v.rv = rv
	r.versions = append(r.versions, v)
	if old != nil && nodestate.CordonedByUs(old) && old.Spec.Unschedulable && !n.Spec.Unschedulable && !nodestate.CordonedByUs(n) {
		since, err := nodestate.ValidationSince(n)
		validated := false
		for _, at := range stand.ValidatorReadies(n.Name) {
			if err == nil && !at.Truncate(time.Second).Before(since) && !at.After(now) {
				validated = true
			}
		}
		if !validated {
			r.violation = append(r.violation, fmt.Sprintf("%s uncordoned by the upgrade in state %s without a validator Ready since its driver started to install (%s; validator Ready at %v)",
				n.Name, st, n.Annotations[nodestate.DriverSinceAnnotation], stand.ValidatorReadies(n.Name)))
		}
	}
}

func (r *recorder) states(node string) []nodestate.UpgradeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seq[node])
}

// firstIn returns the first node whose current state is one of states, waiting up to timeout.
func (r *recorder) firstIn(t *testing.T, timeout time.Duration, states ...nodestate.UpgradeState) string {
	t.Helper()
	var found string
	rollouttest.WaitFor(t, timeout, fmt.Sprintf("a node in %v", states), func() (bool, string) {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if slices.Contains(states, nodestate.UpgradeState(rollouttest.Node(t, kube.Client, n).Labels[nodestate.UpgradeStateLabel])) {
				found = n
				return true, ""
			}
		}
		return false, "none yet"
	})
	return found
}

func (r *recorder) stop() { r.cancel() }

// outOfService replays the versions the recorder saw in resourceVersion order and returns the most nodes out of
// service at one revision, which nodes they were, and the changes that led there. A node's resourceVersion from the
// local etcd-backed API server is the revision of its last write, which grows with every write, so the state at a
// revision is each node's last seen version at or below it. Delivery order is not that order: after the API
// server restarts, the informer's relist hands over the changes it missed in no particular order, and counting
// as they came mixed one node's state from before the outage with another's from after it (three nodes "out" at
// once, the third long done).
func (r *recorder) outOfService() (most int, which []string, led []string) {
	vs := slices.Clone(r.versions)
	slices.SortStableFunc(vs, func(a, b nodeVersion) int { return cmp.Compare(a.rv, b.rv) })
	out := map[string]bool{}
	var lines []string
	worstAt := -1
	for _, v := range vs {
		if v.outOfService {
			out[v.name] = true
		} else {
			delete(out, v.name)
		}
		lines = append(lines, fmt.Sprintf("rv %d (seen %s) %s %s cordoned-by-us=%v unschedulable=%v: out %v",
			v.rv, v.seen.Format("15:04:05.000"), v.name, v.state, v.cordonedByUs, v.unsched, slices.Sorted(maps.Keys(out))))
		if len(out) > most {
			most, which, worstAt = len(out), slices.Sorted(maps.Keys(out)), len(lines)-1
		}
	}
	if worstAt >= 0 {
		led = lines[max(0, worstAt-40) : worstAt+1]
	}
	return most, which, led
}

// sawOutOfService says whether any node was seen out of service.
func (r *recorder) sawOutOfService() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.versions, func(v nodeVersion) bool { return v.outOfService })
}

// assertInvariants checks what the recorder saw.
func (r *recorder) assertInvariants(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.badRV {
		t.Errorf("%s is not a revision: the invariant below is checked in revision order", b)
	}
	most, which, led := r.outOfService()
	t.Logf("at most %d nodes out of service at once (%v)", most, which)
	if most > maxUnavailable {
		t.Errorf("at one revision %d nodes were out of service (in flight, failed or cordoned by the upgrade), want at most %d: %v; the changes that led there:\n%s",
			most, maxUnavailable, which, strings.Join(led, "\n"))
	}
	if most == 0 {
		t.Error("the recorder saw no node out of service: the rollout was not observed")
	}
	for _, v := range r.violation {
		t.Error(v)
	}
}

// startWorkloads pins a GPU Deployment and a CPU Deployment to each GPU node.
func startWorkloads(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	c := kube.Client
	if err := workloads.Deploy(ctx, c, workloadNS, rollouttest.GPUNodeNames(nodes)); err != nil {
		t.Fatal(err)
	}
}

// runningGPU says on which nodes a GPU workload pod is running.
func runningGPU(t *testing.T) map[string]bool {
	t.Helper()
	running, err := workloads.RunningGPU(t.Context(), kube.Client, workloadNS)
	if err != nil {
		t.Fatal(err)
	}
	return running
}
