package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	namespace  = "gpu-operator"
	release    = "gpu"
	workloadNS = "ml"
	lateNS     = "late"
	// gateTimeout is the release gate's deadline: a change's canaries validate well within it.
	gateTimeout = 10 * time.Minute
	// settle bounds a seed's rollout: from the driver change until every node runs its pool's driver, validated.
	settle = 8 * time.Minute
	// quietSettle is the least time the rollout gets to end once the routine operations (and the last Helm
	// operation) ended: a re-registration or a failing driver in the deadline's last seconds takes a validation
	// (and, failing, a revert) to settle
	quietSettle = 3 * time.Minute
	// validationTimeout is the gates' wait for a validator with a new driver (upgradePolicy.validationTimeoutSeconds):
	// short, so that a driver failing on one node reverts it within the seed, yet several times what a working
	// driver takes on the loaded machine.
	validationTimeout = 30 * time.Second
)

// poolBounds are each pool's upgradePolicy.maxUnavailable (by its nvidia.com/driver.pool value; "" is the default
// pool), written into the values and read back by the checker as the pool's bound.
var poolBounds = map[string]intstr.IntOrString{"": intstr.FromString("10%"), "a": intstr.FromInt32(3), "b": intstr.FromString("20%")}

// TestSoak installs the stack once, then for each seed changes every pool's driver while the seed's schedule of
// routine operations runs, and checks the invariants throughout.
func TestSoak(t *testing.T) {
	env := installOnce(t)
	var seeds []uint64
	switch {
	case *seedFlag != 0:
		seeds = []uint64{*seedFlag}
	case *seedsFlag > 0:
		for i := 1; i <= *seedsFlag; i++ {
			seeds = append(seeds, uint64(i))
		}
	default:
		for _, f := range strings.Split(*seedListFlag, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil || n == 0 {
				t.Fatalf("-seed-list %q: want seeds of 1 or more, comma-separated", *seedListFlag)
			}
			seeds = append(seeds, n)
		}
	}
	var covered []string
	checks := 0
	for i, seed := range seeds {
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			checks += env.soak(t, seed, fmt.Sprintf("600.%d.%02d", 70+i, seed%100))
		})
		covered = append(covered, fmt.Sprintf("%d:%v", seed, map[bool]string{true: "ok", false: "FAIL"}[ok]))
		if !ok {
			break // the cluster is in an unknown state: later seeds would say nothing
		}
	}
	t.Logf("soak: %d nodes in %d pools, seeds covered %s, %d invariant checks", len(env.gpuNodes), len(poolBounds), strings.Join(covered, " "), checks)
}

type soakEnv struct {
	gpuNodes []string
	pool     map[string]string // node -> its pool's label value
	bound    map[string]int    // pool label value -> its bound in nodes
	hosts    map[string]*kmodtest.Fixture
	// values are the release's values files: pool b under its first name, and renamed (the same nodes)
	values, renamedValues string
	// renamed: the release renders pool b under its second name now
	renamed bool
	// lateOwner owns the GPU pods that land on nodes being emptied
	lateOwner *corev1.ConfigMap
	// tag is the driver tag the release renders now
	tag string
	// forcedStops counts the old drivers stopped by a delete with no grace period (a Node gone): outside the
	// invariant, as nothing can hold such a stop
	forcedStops int
	// moved is the node an admin moved out of its pool (by its label), "" when none is: the next move takes it back
	moved string
	// faulty are the nodes where a driver tag fails its validation (node -> tag) until the admin fixes them
	faulty map[string]string
	// failures are the nodes seen reverted or upgrade-failed this seed, and what they showed; the admin fixes and
	// retries each the next time round
	failures map[string]string
}

var (
	installed     *soakEnv
	installFailed bool
)

func installOnce(t *testing.T) *soakEnv {
	t.Helper()
	if installed != nil || installFailed {
		if installFailed {
			t.Fatal("the install failed earlier")
		}
		return installed
	}
	installFailed = true
	ctx := t.Context()
	e := &soakEnv{pool: map[string]string{}, bound: map[string]int{}, hosts: map[string]*kmodtest.Fixture{}, tag: "580.95.05",
		faulty: map[string]string{}, failures: map[string]string{}}
	count := map[string]int{}
	for _, n := range nodes {
		if _, ok := n.Status.Capacity["nvidia.com/gpu"]; !ok {
			continue
		}
		e.gpuNodes = append(e.gpuNodes, n.Name)
		e.pool[n.Name] = n.Labels[nodefixtures.DriverPoolLabel]
		count[e.pool[n.Name]]++
		e.hosts[n.Name] = kmodtest.New(t)
		stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: e.hosts[n.Name], Install: 300 * time.Millisecond})
	}
	for p, mu := range poolBounds {
		b, err := (driverpools.Pool{Name: p, MaxUnavailable: &mu}).MaxUnavailableNodes(count[p])
		if err != nil {
			t.Fatal(err)
		}
		e.bound[p] = b
	}
	e.values, e.renamedValues = filepath.Join(t.TempDir(), "soak.yaml"), filepath.Join(t.TempDir(), "soak-renamed.yaml")
	for _, v := range []struct {
		path, nameOfB string
	}{{e.values, "b"}, {e.renamedValues, renamedB}} {
		if err := os.WriteFile(v.path, []byte(soakValues(v.nameOfB)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := workloads.Deploy(ctx, kube.Client, workloadNS, e.gpuNodes); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lateNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	owner, err := kube.Client.CoreV1().ConfigMaps(lateNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late-owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.lateOwner = owner
	start := time.Now()
	if _, err := e.helm().Install(ctx, e.files(), e.set()...); err != nil {
		logFailedRuns(t, start)
		t.Fatal(err)
	}
	if why := e.converged(ctx); why != "" {
		t.Fatalf("after install: %s", why)
	}
	t.Logf("installed on %d GPU nodes in pools %v (bounds %v) in %s", len(e.gpuNodes), count, e.bound, time.Since(start).Round(100*time.Millisecond))
	installed, installFailed = e, false
	return e
}

// renamedB is pool b's second name: the same nodes (its selector names the label value b), another pool name.
const renamedB = "b-renamed"

// soakValues are the release's values with pool b named nameOfB.
func soakValues(nameOfB string) string {
	var pools strings.Builder
	fmt.Fprintf(&pools, "    - name: a\n      upgradePolicy:\n        maxUnavailable: %s\n", yamlValue(poolBounds["a"]))
	fmt.Fprintf(&pools, "    - name: %s\n      nodeSelector:\n        matchLabels: {%s: b}\n      upgradePolicy:\n        maxUnavailable: %s\n",
		nameOfB, nodefixtures.DriverPoolLabel, yamlValue(poolBounds["b"]))
	return fmt.Sprintf(`driver:
  upgradePolicy:
    maxUnavailable: %s
    canary: 1
    maxFailures: 1
%s  pools:
%shooks:
  validation:
    timeoutSeconds: %d
nfd:
  mode: none
gfd:
  useNodeFeatureAPI: false
`, yamlValue(poolBounds[""]), validationTimeoutValue(), pools.String(), int(gateTimeout.Seconds()))
}

func (e *soakEnv) helm() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: gateTimeout + time.Minute, NoWait: true}
}

func (e *soakEnv) files() []string {
	values := e.values
	if e.renamed {
		values = e.renamedValues
	}
	return []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml"), values}
}

func (e *soakEnv) set() []string { return []string{"driver.image.tag=" + e.tag} }

// soak runs one seed: a driver change of every pool under the seed's operations; it returns the invariant checks made.
func (e *soakEnv) soak(t *testing.T, seed uint64, tag string) int {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	// the failing drivers draw from a stream of their own: the other operations' schedule stays the seed's as it was
	faults := rand.New(rand.NewPCG(seed, 0xfa17))
	start := time.Now()
	check := watchInvariants(t, e)
	stopHolding := holdEvictedPods(t)
	ops := &opLog{start: start}
	defer func() {
		if t.Failed() {
			t.Logf("seed %d (replay: go test ./tests/soak -run TestSoak -args -seed %d); operations:\n%s", seed, seed, ops)
			logFailedRuns(t, start)
		}
	}()

	// one Helm operation at a time, as Helm itself allows
	var helmMu sync.Mutex
	var helmWG sync.WaitGroup
	var helmErrs []string
	helmOp := func(what string, f func() error) {
		helmWG.Add(1)
		go func() {
			defer helmWG.Done()
			defer helmMu.Unlock()
			err := f()
			ops.add("%s ended: %v", what, err)
			if err != nil {
				helmErrs = append(helmErrs, fmt.Sprintf("%s: %v", what, err))
			}
		}()
	}
	revision := func() int {
		rel, err := e.helm().Status()
		if err != nil {
			return 0
		}
		return rel.Version
	}

	helmMu.Lock()
	before := revision()
	previousTag, renamedBefore := e.tag, e.renamed
	e.tag = tag
	ops.add("driver change to %s (revision %d)", tag, before+1)
	helmOp("upgrade to "+tag, func() error { _, err := e.helm().Upgrade(ctx, e.files(), e.set()...); return err })

	var downMu sync.Mutex
	down := map[string]bool{}
	var timers sync.WaitGroup
	// half the seeds roll the release back mid-way, at a time of their own (or as soon after as Helm is free)
	rollback, rollbackAt := rng.IntN(2) == 1, time.Duration(3+rng.IntN(20))*time.Second
	deadline := time.Now().Add(settle)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
		// done once no Helm operation runs (the driver change's first) and the rollout settled
		if helmMu.TryLock() {
			settled := e.converged(ctx) == ""
			helmMu.Unlock()
			if settled {
				break
			}
		}
		if rollback && time.Since(start) > rollbackAt && helmMu.TryLock() { // helm rollback mid-way
			rollback = false
			to := before // the revision before this seed's driver change
			e.tag, e.renamed = previousTag, renamedBefore
			// half the rollbacks plan on a node whose clock is minutes behind: the rollback's plan then carries an
			// earlier time than the plan it replaces, and the nodes must follow it all the same
			skew := time.Duration(0)
			if rng.IntN(2) == 0 {
				skew = -time.Duration(1+rng.IntN(10)) * time.Minute
			}
			ops.add("helm rollback to revision %d (driver %s), its hooks' clock off by %s", to, previousTag, skew)
			helmOp(fmt.Sprintf("rollback to %d", to), func() error {
				stand.SetClockSkew(skew)
				defer stand.SetClockSkew(0)
				return e.helm().Rollback(to)
			})
			continue
		}
		switch op := rng.IntN(100); {
		case op < 30: // a re-sync that changes no driver (an Argo CD sync, a chart-only upgrade)
			if helmMu.TryLock() {
				ops.add("re-sync")
				helmOp("re-sync", func() error { _, err := e.helm().Upgrade(ctx, e.files(), e.set()...); return err })
			}
		case op < 55: // a node goes NotReady for a few seconds
			n := e.gpuNodes[rng.IntN(len(e.gpuNodes))]
			d := time.Duration(1000+rng.IntN(4000)) * time.Millisecond
			downMu.Lock()
			if !down[n] {
				down[n] = true
				ops.add("node %s NotReady for %s", n, d)
				if err := setReady(ctx, n, false); err != nil {
					t.Error(err)
				}
				timers.Add(1)
				time.AfterFunc(d, func() {
					defer timers.Done()
					downMu.Lock()
					defer downMu.Unlock()
					if err := setReady(context.WithoutCancel(ctx), n, true); err != nil {
						t.Error(err)
					}
					delete(down, n)
				})
			}
			downMu.Unlock()
		case op < 76: // a GPU pod lands on a node being emptied (it names the node, or tolerates the cordon)
			if n := e.beingEmptied(ctx, rng); n != "" {
				// one in three is held by a finalizer once evicted, its containers ended (phase Failed), until the
				// seed's end: it no longer uses the GPU, and the emptying must not wait for it
				held := rng.IntN(3) == 0
				if held {
					ops.add("GPU pod held by a finalizer lands on node %s (%s)", n, nodeState(ctx, n))
				} else {
					ops.add("GPU pod lands on node %s (%s)", n, nodeState(ctx, n))
				}
				if err := latePod(ctx, n, seed, e.lateOwner, held); err != nil {
					t.Error(err)
				}
			}
		case op < 80: // a driver pod deleted by hand: its gate empties the node before its driver stops
			n := e.gpuNodes[rng.IntN(len(e.gpuNodes))]
			if p := liveDriverPod(ctx, n); p != nil {
				ops.add("driver pod %s on %s deleted by hand (%s)", p.Name, n, nodeState(ctx, n))
				if err := kube.Client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Error(err)
				}
			}
		case op < 84: // a Node object deleted and registered again, its pods gone with it
			n := e.gpuNodes[rng.IntN(len(e.gpuNodes))]
			downMu.Lock()
			if !down[n] {
				down[n] = true
				ops.add("Node %s deleted and registered again (%s)", n, nodeState(ctx, n))
				timers.Add(1)
				go func() {
					defer timers.Done()
					if err := registerAgain(context.WithoutCancel(ctx), n); err != nil {
						t.Error(err)
					}
					downMu.Lock()
					delete(down, n)
					downMu.Unlock()
				}()
			}
			downMu.Unlock()
		case op < 87: // pool b renamed (the same nodes): its driver DaemonSets replaced, their pods deleted
			if helmMu.TryLock() {
				e.renamed = !e.renamed
				name := map[bool]string{false: "b", true: renamedB}[e.renamed]
				ops.add("pool b renamed to %s", name)
				helmOp("rename to "+name, func() error { _, err := e.helm().Upgrade(ctx, e.files(), e.set()...); return err })
			}
		case op < 90: // a waiting node moved to another pool (to restore capacity, say), or the one moved taken back
			downMu.Lock()
			if n, to := e.nextMove(ctx, rng); n != "" && !down[n] {
				ops.add("node %s moved to pool %q (%s)", n, to, nodeState(ctx, n))
				if err := movePool(ctx, n, to); err != nil {
					t.Error(err)
				}
				e.moved = map[bool]string{true: "", false: n}[n == e.moved]
			}
			downMu.Unlock()
		case op < 92 && *faultsFlag: // the new driver does not work on one node: it fails validation there, and the node goes back
			if n := e.faultCandidate(ctx, faults); n != "" {
				check.expectFailure(n)
				stand.SetDriverFaultOn(n, e.tag, "nvidia-smi: Failed to initialize NVML: Unknown Error")
				e.faulty[n] = e.tag
				ops.add("driver %s fails validation on node %s (%s)", e.tag, n, nodeState(ctx, n))
			}
		}
		e.adminFixes(ctx, t, ops)
	}
	timers.Wait()
	helmMu.Lock() // the last Helm operation ended
	helmMu.Unlock()
	helmWG.Wait()

	// the rollout ends: every node on its pool's driver, validated, in service
	var why string
	// the last Helm operation (a gate waiting on validations) may have run past the deadline: the rollout then gets
	// quietSettle from the end of the routine operations, not what is left of the deadline
	err := wait.PollUntilContextTimeout(ctx, time.Second, max(time.Until(deadline.Add(time.Minute)), quietSettle), true, func(ctx context.Context) (bool, error) {
		e.adminFixes(ctx, t, ops)
		now := e.converged(ctx)
		if ctx.Err() != nil {
			return false, nil // the deadline cut the look short: the last full look says what is left
		}
		why = now
		return why == "", nil
	})
	for n, tag := range e.faulty { // faults the rollout never reached
		stand.SetDriverFaultOn(n, tag, "")
		delete(e.faulty, n)
	}
	if err != nil {
		t.Errorf("the rollout did not end within %s, nor %s after the last routine operation: %s", settle, quietSettle, why)
		if stuck, _, ok := strings.Cut(strings.TrimPrefix(why, "node "), ":"); ok {
			t.Logf("node %s, its last changes:\n    %s", stuck, check.changesOf(stuck))
			logRuns(t, func(r kubelet.Run) bool { return r.Node == stuck })
		}
	}
	// the release's result matches: a final re-sync passes its plan and its gate (after a rollout that did not end,
	// its gate would only wait out its timeout, past the package's)
	if err == nil {
		if _, err := e.helm().Upgrade(ctx, e.files(), e.set()...); err != nil {
			t.Errorf("the re-sync after the rollout failed: %v", err)
		}
	}
	checks := check.stop(t)
	stopHolding()
	for _, s := range stand.DriverStops() {
		// a pod created while the node's device plugin was paused never got a GPU on a real node
		using := slices.DeleteFunc(slices.Clone(s.GPUPods), func(p string) bool {
			rv, late := lateRV.Load(p)
			return late && check.whilePaused(s.Node, rv.(int64))
		})
		if s.Forced && s.At.After(start) {
			// a Node gone long enough for the pod garbage collector: its pods are deleted with no grace period and
			// the kubelet kills them at once, preStop and all, while the Node registered again may take new pods
			e.forcedStops++
			continue
		}
		if s.At.After(start) && len(using) > 0 {
			t.Errorf("old driver of %s (pod %s) stopped at %s with GPU pods running: %v (%s); the node's last changes:\n    %s", s.Node, s.Pod, s.At.Format(time.TimeOnly), using,
				check.pausedSpans(s.Node, using), check.changesOf(s.Node))
			logRuns(t, func(r kubelet.Run) bool { return r.Pod == s.Pod })
		}
	}
	failed := len(e.failures) > 0
	clear(e.failures)
	for _, h := range helmErrs {
		// a re-sync the plan refuses while too many of a pool's nodes are NotReady is the plan doing its job; and
		// while a node of it failed (reverted, or upgrade-failed), a release fails (its gate) or is refused (its plan)
		failedRelease := failed && (strings.Contains(h, "hooks failed") || strings.Contains(h, "in upgrade-failed"))
		if !strings.Contains(h, "are already unavailable") && !failedRelease {
			t.Errorf("helm: %s", h)
			logRuns(t, func(r kubelet.Run) bool { return r.ExitCode != 0 && r.Node == "" })
		}
	}
	if err := kube.Client.CoreV1().Pods(lateNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Error(err)
	}
	t.Logf("seed %d: driver %s, settled in %s, %d invariant checks, %d drivers stopped by a forced delete; operations: %s", seed, e.tag, time.Since(start).Round(100*time.Millisecond), checks, e.forcedStops, ops.summary())
	if testing.Verbose() && !t.Failed() {
		t.Logf("seed %d operations:\n%s", seed, ops)
	}
	return checks
}

// converged says what still differs from a finished rollout ("" when none does): every GPU node upgrade-done,
// schedulable, and its driver pod Ready with its DaemonSet's current driver config.
func (e *soakEnv) converged(ctx context.Context) string {
	dss, err := kube.Client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		return err.Error()
	}
	want := map[string]string{} // DaemonSet name -> its template's digest
	for _, ds := range dss.Items {
		want[ds.Name] = upgradeplan.PodDigest(&corev1.Pod{Spec: ds.Spec.Template.Spec})
	}
	pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		return err.Error()
	}
	current := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		owner := metav1.GetControllerOf(p)
		if p.DeletionTimestamp == nil && owner != nil && podReady(p) && upgradeplan.PodDigest(p) == want[owner.Name] {
			current[p.Spec.NodeName] = true
		}
	}
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, n := range list.Items {
		if _, gpu := e.pool[n.Name]; !gpu {
			continue
		}
		if nodestate.Reverted(&n) {
			return fmt.Sprintf("node %s: reverted (%s)", n.Name, nodestate.RevertSummary(&n))
		}
		if st := n.Labels[nodestate.UpgradeStateLabel]; st != string(nodestate.UpgradeDone) || n.Spec.Unschedulable || !current[n.Name] {
			return fmt.Sprintf("node %s: %s, unschedulable %v, driver pod of the current config Ready %v", n.Name, st, n.Spec.Unschedulable, current[n.Name])
		}
	}
	return ""
}

// beingEmptied picks a node whose GPU pods are being moved off, or were (its old driver pod still there, or the new
// one about to unload it), or "".
func (e *soakEnv) beingEmptied(ctx context.Context, rng *rand.Rand) string {
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var out []string
	for _, n := range list.Items {
		switch nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) {
		case nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired:
			out = append(out, n.Name)
		}
	}
	if len(out) == 0 {
		return ""
	}
	slices.Sort(out)
	return out[rng.IntN(len(out))]
}

// nextMove picks the next move of a node to another pool: the node moved earlier back to its own, or else a node
// waiting for its turn (upgrade-required, in service) to another pool; "" when none waits.
func (e *soakEnv) nextMove(ctx context.Context, rng *rand.Rand) (node, to string) {
	if e.moved != "" {
		return e.moved, e.pool[e.moved]
	}
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", ""
	}
	var waiting []*corev1.Node
	for i := range list.Items {
		n := &list.Items[i]
		if _, gpu := e.pool[n.Name]; gpu && n.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeRequired) && !n.Spec.Unschedulable {
			waiting = append(waiting, n)
		}
	}
	if len(waiting) == 0 {
		return "", ""
	}
	slices.SortFunc(waiting, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	n := waiting[rng.IntN(len(waiting))]
	others := slices.DeleteFunc(slices.Sorted(maps.Keys(poolBounds)), func(p string) bool { return p == n.Labels[nodefixtures.DriverPoolLabel] })
	return n.Name, others[rng.IntN(len(others))]
}

// movePool moves node to pool (by its label; "" is the default pool) as an admin does with `kubectl label`.
func movePool(ctx context.Context, node, pool string) error {
	value := any(pool)
	if pool == "" {
		value = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{nodefixtures.DriverPoolLabel: value}}})
	if err != nil {
		return err
	}
	if _, err := kube.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("move node %s to pool %q: %w", node, pool, err)
	}
	return nil
}

// latePod puts a GPU pod on node, naming it and tolerating every taint, as a pod that bypasses the scheduler or
// tolerates the cordon does. Its controller is owner, an object no controller acts for: an eviction is accepted (the
// drain moves only pods something owns) and nothing recreates the pod.
func latePod(ctx context.Context, node string, seed uint64, owner *corev1.ConfigMap, held bool) error {
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: fmt.Sprintf("late-%d-%s-", seed, node), Namespace: lateNS, Labels: map[string]string{"app": "late"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyNever,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "c", Image: "registry.example/late", Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu}}}},
	}
	if held {
		pod.Finalizers = []string{holdFinalizer}
	}
	created, err := kube.Client.CoreV1().Pods(lateNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	rv, err := strconv.ParseInt(created.ResourceVersion, 10, 64)
	lateRV.Store(lateNS+"/"+created.Name, rv)
	return err
}

// holdFinalizer keeps an evicted late pod on the API server (a finalizer whose controller is slow or gone).
const holdFinalizer = "soak.kube-gpu-stack.io/hold"

// holdEvictedPods plays the kubelet for late pods held by holdFinalizer: once deleted, their containers end (phase
// Failed), while the finalizer keeps them. The returned func removes every such finalizer and stops.
func holdEvictedPods(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w, err := kube.Client.CoreV1().Pods(lateNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.DeletionTimestamp == nil || !slices.Contains(p.Finalizers, holdFinalizer) || p.Status.Phase == corev1.PodFailed {
				continue
			}
			p = p.DeepCopy()
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Killed"}}}}
			if _, err := kube.Client.CoreV1().Pods(lateNS).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				t.Errorf("end the containers of evicted pod %s: %v", p.Name, err)
			}
		}
	}()
	return func() {
		cancel()
		w.Stop()
		<-done
		pods, err := kube.Client.CoreV1().Pods(lateNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		for _, p := range pods.Items {
			if slices.Contains(p.Finalizers, holdFinalizer) {
				patch := []byte(`{"metadata":{"finalizers":null}}`)
				if _, err := kube.Client.CoreV1().Pods(lateNS).Patch(t.Context(), p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Error(err)
				}
			}
		}
	}
}

// lateRV is the etcd revision at which each late pod (namespace/name) was created.
var lateRV sync.Map

// setReady sets the node's Ready condition, as its kubelet's heartbeat would (or its absence).
func setReady(ctx context.Context, name string, ready bool) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		for i, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.Status.Conditions[i].Status = status
				n.Status.Conditions[i].LastTransitionTime = metav1.Now()
			}
		}
		_, err = kube.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	})
}

// liveDriverPod is node's driver pod not being deleted (nil when none).
func liveDriverPod(ctx context.Context, node string) *corev1.Pod {
	pods, err := kube.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=" + kubelet.DriverComponent,
		FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	return nil
}

// registerAgain deletes the Node object and registers it again as its kubelet would, with the labels it was first
// registered with: the pod garbage collector deletes a gone node's pods as it does (phase Failed with the condition
// DisruptionTarget, then deleted at once; here without its 40 s wait, and the workloads first, so that no driver
// stops under a GPU pod the test itself left there), and the kubelet kills them.
func registerAgain(ctx context.Context, name string) error {
	i := slices.IndexFunc(nodes, func(n *corev1.Node) bool { return n.Name == name })
	if i < 0 {
		return fmt.Errorf("no fixture for node %s", name)
	}
	if err := kube.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete node %s: %w", name, err)
	}
	pods, err := kube.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return err
	}
	stack := func(p corev1.Pod) int { // the stack's own pods last
		if p.Namespace == namespace {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(pods.Items, func(a, b corev1.Pod) int { return stack(a) - stack(b) })
	for _, p := range pods.Items {
		if err := markFailedByPodGC(ctx, p.Namespace, p.Name); err != nil {
			return err
		}
		err := kube.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s/%s of the gone node: %w", p.Namespace, p.Name, err)
		}
	}
	return kube.AddNodes(ctx, nodes[i])
}

// markFailedByPodGC writes a live pod's status as the pod garbage collector does before it deletes a gone node's
// pod: phase Failed, with the condition DisruptionTarget.
func markFailedByPodGC(ctx context.Context, namespace, name string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := kube.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return err
		}
		p.Status.Phase = corev1.PodFailed
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: "DeletionByPodGC", Message: "PodGC: node no longer exists", LastTransitionTime: metav1.Now()})
		_, err = kube.Client.CoreV1().Pods(namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark pod %s/%s of the gone node failed: %w", namespace, name, err)
	}
	return nil
}

// logRuns logs the last three runs (hooks, driver managers, gates) the stand-in recorded that match, each output's
// last 3,000 characters.
func logRuns(t *testing.T, match func(kubelet.Run) bool) {
	t.Helper()
	runs := slices.DeleteFunc(stand.Runs(), func(r kubelet.Run) bool { return !match(r) })
	for _, r := range runs[max(0, len(runs)-3):] {
		out := r.Output
		if len(out) > 3000 {
			out = "..." + out[len(out)-3000:]
		}
		t.Logf("%s %s on %q (exit %d, %s to %s):\n%s", r.Component, r.Pod, r.Node, r.ExitCode, r.Started.Format("15:04:05.000"), r.Ended.Format("15:04:05.000"), out)
	}
}

func nodeState(ctx context.Context, name string) string {
	n, err := kube.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return n.Labels[nodestate.UpgradeStateLabel]
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// logFailedRuns logs the stand-in's failed runs since start, the end of their output.
func logFailedRuns(t *testing.T, since time.Time) {
	for _, r := range stand.Runs() {
		if r.ExitCode != 0 && !r.Started.Before(since) && r.Component != kubelet.DriverManagerRun {
			out := r.Output
			if len(out) > 3000 {
				out = "..." + out[len(out)-3000:]
			}
			t.Logf("%s %s on %s (exit %d):\n%s", r.Component, r.Pod, r.Node, r.ExitCode, out)
		}
	}
}

// opLog is the seed's operations, timed from its start.
type opLog struct {
	mu    sync.Mutex
	start time.Time
	lines []string
}

func (l *opLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%7.1fs ", time.Since(l.start).Seconds())+fmt.Sprintf(format, args...))
}

// summary counts the operations by kind.
func (l *opLog) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	kinds := map[string]int{}
	for _, line := range l.lines {
		switch f := strings.Fields(line); {
		case strings.Contains(line, " ended: "):
		case len(f) > 2 && f[1] == "node" && strings.Contains(line, " moved to pool "):
			kinds["node moved to another pool"]++
		case len(f) > 2 && f[1] == "node":
			kinds["NotReady"]++
		case len(f) > 2 && f[1] == "GPU" && strings.Contains(line, "finalizer"):
			kinds["GPU pod held by a finalizer on a node being emptied"]++
		case len(f) > 2 && f[1] == "GPU":
			kinds["GPU pod on a node being emptied"]++
		case len(f) > 2 && f[1] == "Node":
			kinds["Node registered again"]++
		case len(f) > 2 && f[1] == "helm":
			kinds["rollback"]++
		case len(f) > 2 && f[1] == "pool" && strings.Contains(line, "renamed"):
			kinds["pool renamed"]++
		case strings.Contains(line, " fails validation on node "):
			kinds["driver failing on one node"]++
		case strings.Contains(line, " reverted: "):
			kinds["node reverted by itself"]++
		case strings.Contains(line, " upgrade-failed: "):
			kinds["node upgrade-failed"]++
		case strings.Contains(line, "admin fixed node "):
			kinds["admin fix and retry"]++
		case strings.Contains(line, " deleted by hand "):
			kinds["driver pod deleted by hand"]++
		case len(f) > 2 && f[1] == "driver":
			kinds["driver change"]++
		case len(f) > 1:
			kinds[f[1]]++
		}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		out = append(out, fmt.Sprintf("%d %s", kinds[k], k))
	}
	return strings.Join(out, ", ")
}

func (l *opLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// yamlValue writes a maxUnavailable as values take it: a number, or a quoted percentage.
func yamlValue(v intstr.IntOrString) string {
	if v.Type == intstr.Int {
		return fmt.Sprint(v.IntVal)
	}
	return fmt.Sprintf("%q", v.StrVal)
}

// faultCandidate picks a node whose driver change has not started (upgrade-required), not the one an admin moved,
// for a driver that will not work on it ("" when none, or two nodes already have one).
func (e *soakEnv) faultCandidate(ctx context.Context, rng *rand.Rand) string {
	if len(e.faulty) >= 2 {
		return ""
	}
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodestate.UpgradeStateLabel + "=" + string(nodestate.UpgradeRequired)})
	if err != nil || len(list.Items) == 0 {
		return ""
	}
	n := list.Items[rng.IntN(len(list.Items))].Name
	if _, gpu := e.pool[n]; !gpu || n == e.moved || e.faulty[n] != "" {
		return ""
	}
	// only a node whose driver changes to the tag (after a rollback the tag is the one most nodes run)
	if p := liveDriverPod(ctx, n); p == nil || len(p.Spec.Containers) == 0 || strings.Contains(p.Spec.Containers[0].Image, ":"+e.tag) {
		return ""
	}
	return n
}

// validationTimeoutValue is the values line for the validation timeout with -driver-faults ("" without: the default).
func validationTimeoutValue() string {
	if !*faultsFlag {
		return ""
	}
	return fmt.Sprintf("    validationTimeoutSeconds: %d\n", int(validationTimeout.Seconds()))
}

// adminFixes plays the admin on the nodes whose driver change failed: a node seen reverted (back on its old driver,
// validated, in service) or upgrade-failed is logged, and the next time round it is fixed (its driver fault
// cleared) and retried (`kube-gpu-stack upgrade retry`), which moves it on to its pool's driver.
func (e *soakEnv) adminFixes(ctx context.Context, t *testing.T, ops *opLog) {
	list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range list.Items {
		n := &list.Items[i]
		st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
		var what string
		switch {
		case nodestate.Reverted(n) && st == nodestate.UpgradeDone:
			what = "reverted: " + nodestate.RevertSummary(n)
		case st == nodestate.UpgradeFailed:
			what = "upgrade-failed: " + n.Annotations[nodestate.UpgradeReasonAnnotation]
		default:
			continue
		}
		if seen, ok := e.failures[n.Name]; !ok || seen != what {
			e.failures[n.Name] = what
			ops.add("node %s %s", n.Name, what)
			continue
		}
		if tag := e.faulty[n.Name]; tag != "" {
			stand.SetDriverFaultOn(n.Name, tag, "")
			delete(e.faulty, n.Name)
		}
		if err := upgradeplan.Retry(ctx, kube.Client, namespace, release, n.Name, time.Now(), io.Discard); err != nil {
			t.Logf("upgrade retry %s: %v", n.Name, err)
			continue
		}
		ops.add("admin fixed node %s and retried it", n.Name)
		e.failures[n.Name] = "retried"
	}
}
