package rolloutbench

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/workloads"
)

const (
	namespace  = "gpu-operator"
	release    = "gpu"
	workloadNS = "ml"
	// the gate's wait after an upgrade: a 200-node rollout of 30 s installs takes minutes
	gateTimeout = 30 * time.Minute
)

// BenchmarkRolloutOverhead installs the chart on the pool (every node's first driver install taking -install at
// once), with a GPU and a CPU workload pinned to each node, then times one driver change (helm upgrade to another
// driver version) per iteration, with no canary and with the default canary of one node. Per iteration it reports:
//
//   - rollout-s: from the upgrade's start until every node is upgrade-done with its new driver pod Ready;
//   - overhead-s/batch: the rollout's time beyond its installs, per batch of maxUnavailable nodes (plus the
//     canary's own batch): rollout-s / batches - install. The goal is 3 s; the GPU Operator's upgrade controller
//     requeues every 2 minutes;
//   - overhead-s/node: per node, how long it holds its slot (cordon-required to upgrade-done) beyond its install
//     (median);
//   - handoff-s: from a node giving its slot back (upgrade-done) to the next waiting node taking it (cordon-required)
//     (median);
//   - requests/node: the API requests of the driver manager and the upgrade gate (client side) per node;
//
// and logs the breakdown by phase (from node state changes, pod events and the stand-in's runs), the requests by
// component and call, the response bytes, and the requests in a window where every changing node installs.
func BenchmarkRolloutOverhead(b *testing.B) {
	env := setup(b)
	for _, canary := range []int{0, 1} {
		b.Run(fmt.Sprintf("canary=%d", canary), func(b *testing.B) {
			for range b.N {
				env.change(b, canary)
			}
		})
	}
}

// bench is the installed pool and the counters of the stack's own clients.
type bench struct {
	gpuNodes     []string
	hosts        map[string]*kmodtest.Fixture
	manager      *apiCounter // every driver manager's requests
	gate         *apiCounter // every upgrade gate's requests
	harness      kubernetes.Interface
	changes      int
	installTaken time.Duration
}

var (
	setupOnce sync.Once
	env       *bench
)

func setup(b *testing.B) *bench {
	setupOnce.Do(func() { env = install1(b) })
	if env == nil {
		b.Fatal("setup failed")
	}
	return env
}

func install1(b *testing.B) *bench {
	ctx := b.Context()
	e := &bench{hosts: map[string]*kmodtest.Fixture{}, manager: &apiCounter{}, gate: &apiCounter{}}
	var err error
	if e.harness, err = kubernetes.NewForConfig(withAgent(kube.Config, "rolloutbench")); err != nil {
		b.Fatal(err)
	}
	// each node's driver manager and gate have a client (and a connection) of their own
	managers, gates := map[string]kubernetes.Interface{}, map[string]kubernetes.Interface{}
	for _, n := range nodes {
		if managers[n.Name], err = e.manager.client(kube.Config, "driver-manager"); err != nil {
			b.Fatal(err)
		}
		if gates[n.Name], err = e.gate.client(kube.Config, "driver-upgrade-gate"); err != nil {
			b.Fatal(err)
		}
	}
	stand.UseClients(func(component, node string) kubernetes.Interface {
		if component == kubelet.UncordonRun {
			return gates[node]
		}
		return managers[node]
	})
	for _, n := range nodes {
		if _, ok := n.Status.Capacity["nvidia.com/gpu"]; ok {
			e.gpuNodes = append(e.gpuNodes, n.Name)
			e.hosts[n.Name] = kmodtest.New(b)
			stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: e.hosts[n.Name], Install: *installTime})
		}
	}
	if err := workloads.Deploy(ctx, e.harness, workloadNS, e.gpuNodes); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := target().Install(ctx, profile(), settings(0)...); err != nil {
		// the gate may give up on a machine shared with other work; the rollout is measured once the pool is
		// installed all the same
		logFailedRuns(b, start)
		b.Logf("install: %v; waiting for every node to be upgrade-done with its driver pod Ready", err)
		if err := allInstalled(ctx, e.harness, len(e.gpuNodes), 15*time.Minute); err != nil {
			b.Fatalf("install: %v", err)
		}
	}
	e.installTaken = time.Since(start)
	b.Logf("installed on %d GPU nodes (each driver install %s) in %s", len(e.gpuNodes), *installTime, e.installTaken.Round(100*time.Millisecond))
	return e
}

// logFailedRuns logs the stand-in's failed runs since start, the end of their output.
func logFailedRuns(b *testing.B, since time.Time) {
	for _, r := range stand.Runs() {
		if r.ExitCode != 0 && !r.Started.Before(since) {
			out := r.Output
			if len(out) > 2000 {
				out = "..." + out[len(out)-2000:]
			}
			b.Logf("%s %s on %s (exit %d):\n%s", r.Component, r.Pod, r.Node, r.ExitCode, out)
		}
	}
}

// allInstalled waits until want nodes are upgrade-done and as many driver pods Ready.
func allInstalled(ctx context.Context, client kubernetes.Interface, want int, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 5*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodestate.UpgradeStateLabel + "=" + string(nodestate.UpgradeDone)})
		if err != nil {
			return false, nil
		}
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=" + kubelet.DriverComponent})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready++
				}
			}
		}
		last = fmt.Sprintf("%d nodes upgrade-done, %d driver pods Ready, want %d", len(nodes.Items), ready, want)
		return len(nodes.Items) == want && ready == want, nil
	})
	if err != nil {
		return fmt.Errorf("%w: %s", err, last)
	}
	return nil
}

func profile() []string {
	return []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
}

func settings(canary int, extra ...string) []string {
	return append([]string{
		fmt.Sprintf("driver.upgradePolicy.maxUnavailable=%d", *maxUnavailable),
		fmt.Sprintf("driver.upgradePolicy.canary=%d", canary),
		fmt.Sprintf("hooks.validation.timeoutSeconds=%d", int(gateTimeout.Seconds())),
		// the fixture nodes carry NFD's labels; its 200 worker pods would only load the 2-core machine
		"nfd.mode=none", "gfd.useNodeFeatureAPI=false",
	}, extra...)
}

func target() install.Target {
	return install.Target{Kubeconfig: kube.Kubeconfig, Release: release, Namespace: namespace, Timeout: gateTimeout + 5*time.Minute, NoWait: true}
}

// change rolls one driver change across the pool and reports what it cost.
func (e *bench) change(b *testing.B, canary int) {
	ctx := b.Context()
	e.changes++
	tag := fmt.Sprintf("600.%d.01", 40+e.changes)
	rec, err := record(ctx, e.harness, ":"+tag, len(e.gpuNodes))
	if err != nil {
		b.Fatal(err)
	}
	defer rec.stop()
	var maxGoroutines atomic.Int64
	sampling, stopSampling := context.WithCancel(ctx)
	go func() {
		for {
			maxGoroutines.Store(max(maxGoroutines.Load(), int64(runtime.NumGoroutine())))
			select {
			case <-sampling.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	b.ResetTimer()
	start := time.Now()
	upgraded := make(chan error, 1)
	go func() {
		_, err := target().Upgrade(ctx, profile(), settings(canary, "driver.image.tag="+tag)...)
		upgraded <- err
	}()
	var upErr error
	returned := false
	select {
	case <-rec.done:
	case upErr = <-upgraded:
		returned = true
		deadline := time.After(gateTimeout)
	waiting:
		for {
			select {
			case <-rec.done:
				break waiting
			case <-time.After(2 * time.Minute):
				if !rec.started() { // refused by the plan: nothing rolls
					logFailedRuns(b, start)
					b.Fatalf("upgrade to %s: %v; no driver pod replaced", tag, upErr)
				}
			case <-deadline:
				logFailedRuns(b, start)
				b.Fatalf("upgrade to %s returned (%v), but the rollout did not finish: %s", tag, upErr, rec.progress())
			}
		}
	case <-time.After(gateTimeout):
		b.Fatalf("rollout to %s unfinished after %s: %s", tag, gateTimeout, rec.progress())
	}
	end := time.Now()
	b.StopTimer()
	stopSampling()
	e.report(b, rec, canary, start, end, int(maxGoroutines.Load()))
	// the post-upgrade gate's own end is not part of the rollout: it is reported, not waited for long
	if !returned {
		select {
		case upErr = <-upgraded:
		case <-time.After(2 * time.Minute):
			b.Logf("upgrade to %s: the post-upgrade gate still runs 2 minutes after the rollout finished", tag)
		}
	}
	if upErr != nil {
		logFailedRuns(b, start)
		b.Logf("upgrade to %s: %v (the rollout finished all the same)", tag, upErr)
	}
}

// report computes the figures of one change from its recording and the stand-in's runs.
func (e *bench) report(b *testing.B, rec *recording, canary int, start, end time.Time, goroutines int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := len(e.gpuNodes)
	install := *installTime
	total := end.Sub(start)
	batches := int(math.Ceil(float64(n-canary) / float64(*maxUnavailable)))
	if canary > 0 {
		batches++
	}
	perBatch := total.Seconds()/float64(batches) - install.Seconds()

	managerRun, installRun, gateRun := map[string]kubelet.Run{}, map[string]kubelet.Run{}, map[string]kubelet.Run{}
	for _, r := range stand.Runs() {
		if r.Started.Before(start) || r.Pod != rec.newPod[r.Node] {
			continue
		}
		switch r.Component {
		case kubelet.DriverManagerRun:
			if _, ok := managerRun[r.Node]; !ok {
				managerRun[r.Node] = r // the first run; a later one (a restart) ends it
			} else if cur := managerRun[r.Node]; r.Ended.After(cur.Ended) {
				cur.Ended = r.Ended
				managerRun[r.Node] = cur
			}
		case kubelet.DriverInstallRun:
			installRun[r.Node] = r
		case kubelet.UncordonRun:
			gateRun[r.Node] = r
		}
	}
	st := func(node string, s nodestate.UpgradeState) time.Time { return rec.states[node][s] }
	// a node's cycle, in the order it runs: the old pod's gate takes a slot and empties the node, then evicts its own
	// pod; the new pod's manager unloads, the install runs, the new pod's gate validates and uncordons
	phases := []phase{
		{"cordon-required -> pod-deletion-required (cordon)", func(n string) time.Time { return st(n, nodestate.CordonRequired) }, func(n string) time.Time { return st(n, nodestate.PodDeletionRequired) }},
		{"pod-deletion-required -> pod-restart-required (GPU pod eviction)", func(n string) time.Time { return st(n, nodestate.PodDeletionRequired) }, func(n string) time.Time { return st(n, nodestate.PodRestartRequired) }},
		{"pod-restart-required -> old pod deleted (operands paused and gone, the gate evicts its pod)", func(n string) time.Time { return st(n, nodestate.PodRestartRequired) }, func(n string) time.Time { return rec.oldDeleted[n] }},
		{"old pod deleted -> new pod created (pod deletion, DaemonSet controller)", func(n string) time.Time { return rec.oldDeleted[n] }, func(n string) time.Time { return rec.newCreated[n] }},
		{"new pod created -> driver manager started (scheduler, stand-in)", func(n string) time.Time { return rec.newCreated[n] }, func(n string) time.Time { return managerRun[n].Started }},
		{"driver manager started -> validation-required (old pod gone, lease, unload, resume)", func(n string) time.Time { return managerRun[n].Started }, func(n string) time.Time { return st(n, nodestate.ValidationRequired) }},
		{"validation-required -> driver install starts (init container exit)", func(n string) time.Time { return st(n, nodestate.ValidationRequired) }, func(n string) time.Time { return installRun[n].Started }},
		{"driver install (fixed)", func(n string) time.Time { return installRun[n].Started }, func(n string) time.Time { return installRun[n].Ended }},
		{"install done -> uncordon-required (validator Ready, seen by the gate)", func(n string) time.Time { return installRun[n].Ended }, func(n string) time.Time { return st(n, nodestate.UncordonRequired) }},
		{"uncordon-required -> upgrade-done (uncordon, slot given back)", func(n string) time.Time { return st(n, nodestate.UncordonRequired) }, func(n string) time.Time { return st(n, nodestate.UpgradeDone) }},
		{"upgrade-done -> new driver pod Ready (ready file, pod status; off the slot's path)", func(n string) time.Time { return st(n, nodestate.UpgradeDone) }, func(n string) time.Time { return rec.newReady[n] }},
	}
	if *timeline != "" {
		// columns: node, cordon-required, each phase's end, slot given back, slot taken
		if err := writeTimeline(*timeline, e.gpuNodes, start, phases[0].from, phases, func(n string) []time.Time {
			return []time.Time{rec.gaveSlot[n], rec.tookSlot[n]}
		}); err != nil {
			b.Error(err)
		}
	}
	var lines []string
	for _, p := range phases {
		lines = append(lines, fmt.Sprintf("  %-95s %s", p.name, quantiles(between(e.gpuNodes, p.from, p.to))))
	}
	var overhead []time.Duration
	for _, node := range e.gpuNodes {
		if c, d, ir := st(node, nodestate.CordonRequired), st(node, nodestate.UpgradeDone), installRun[node]; !c.IsZero() && !d.IsZero() && !ir.Ended.IsZero() {
			overhead = append(overhead, d.Sub(c)-ir.Ended.Sub(ir.Started))
		}
	}
	handoff := rec.handoffs()
	// the rollout's own start and end, outside every slot's cycle: counted once, not per batch
	var firstOut, lastDone time.Time
	for _, node := range e.gpuNodes {
		if c := st(node, nodestate.CordonRequired); !c.IsZero() && (firstOut.IsZero() || c.Before(firstOut)) {
			firstOut = c
		}
		if d := st(node, nodestate.UpgradeDone); d.After(lastDone) {
			lastDone = d
		}
	}
	lines = append(lines, fmt.Sprintf("  %-95s %s", "slot held minus its install (cordon-required -> upgrade-done)", quantiles(overhead)),
		fmt.Sprintf("  %-95s %s", "slot handed on (a node upgrade-done -> the next waiting node cordon-required)", quantiles(handoff)),
		fmt.Sprintf("  %-95s %s", "  of which: upgrade-done -> slot given back (the gate's give-back, seen on the slots Lease)", quantiles(between(e.gpuNodes, func(n string) time.Time { return st(n, nodestate.UpgradeDone) }, func(n string) time.Time { return rec.gaveSlot[n] }))),
		fmt.Sprintf("  %-95s %s", "  of which: slot given back -> the next waiting node took it (watch, jitter, take)", quantiles(rec.slotHandoffs())),
		fmt.Sprintf("  %-95s %s", "  of which: slot taken -> cordon-required (the taker's run under its node Lease)", quantiles(between(e.gpuNodes, func(n string) time.Time { return rec.tookSlot[n] }, func(n string) time.Time { return st(n, nodestate.CordonRequired) }))),
		fmt.Sprintf("rollout start -> first node cordon-required (the plan hook, the DaemonSets updated, the gates see it): %s; last node upgrade-done -> rollout end (every new pod Ready): %s",
			firstOut.Sub(start).Round(10*time.Millisecond), end.Sub(lastDone).Round(10*time.Millisecond)))

	mt, gt := e.manager.tally(start, end), e.gate.tally(start, end)
	quietFrom, quietTo := quietWindow(managerRun, installRun)
	var quiet string
	if quietTo.Sub(quietFrom) >= time.Second {
		qm, qg := e.manager.tally(quietFrom, quietTo), e.gate.tally(quietFrom, quietTo)
		quiet = fmt.Sprintf("%d driver-manager and %d upgrade-gate requests in %s while the first batch installed (%s)",
			qm.total, qg.total, quietTo.Sub(quietFrom).Round(100*time.Millisecond), qm)
	} else {
		quiet = "no window where every changing node installed"
	}
	b.Logf("%d nodes, maxUnavailable %d, canary %d, install %s: rollout %s in %d batches: %.1f s overhead per batch; at most %d goroutines in the test process\n"+
		"per node (median / p90 / max, count):\n%s\n"+
		"driver manager: %.1f requests/node, %.1f KiB/node read: %s\n"+
		"upgrade gate: %.1f requests/node, %.1f KiB/node read: %s\n"+
		"steady polling check: %s",
		n, *maxUnavailable, canary, install, total.Round(100*time.Millisecond), batches, perBatch, goroutines,
		strings.Join(lines, "\n"),
		float64(mt.total)/float64(n), float64(mt.bytes)/1024/float64(n), mt,
		float64(gt.total)/float64(n), float64(gt.bytes)/1024/float64(n), gt,
		quiet)
	reqs, err := apiload.Read(apiload.AuditLog(auditDir))
	if err != nil {
		b.Fatal(err)
	}
	server := apiload.Summarize(reqs, start, end)
	var byAgent []string
	for _, agent := range []string{"driver-manager", "driver-upgrade-gate", "kubelet-stand-in", "kube-controller-manager", "kube-scheduler", "kwok", "rolloutbench.test"} {
		a := server.Agent(agent)
		byAgent = append(byAgent, fmt.Sprintf("%s %.1f (%v)", agent, float64(a.Total())/float64(n), a.Verbs()))
	}
	var conflicts []string
	for k, c := range apiload.Refused(reqs, start, end, http.StatusConflict) {
		conflicts = append(conflicts, fmt.Sprintf("%s %d", k, c))
	}
	slices.Sort(conflicts)
	b.Logf("server side (audit log), requests per node by user agent: %s\nconflicts (409): %s\n%s",
		strings.Join(byAgent, "; "), strings.Join(conflicts, "; "), server)
	b.ReportMetric(total.Seconds(), "rollout-s")
	b.ReportMetric(perBatch, "overhead-s/batch")
	b.ReportMetric(median(overhead).Seconds(), "overhead-s/node")
	b.ReportMetric(median(handoff).Seconds(), "handoff-s")
	b.ReportMetric(float64(mt.total+gt.total)/float64(n), "requests/node")
}

// quietWindow is a stretch of the rollout where the nodes of the first batch whose driver manager has ended all
// install, and nothing else of the stack's should be running: from the last of those managers' end (plus a second)
// to the first install's end (less a second). A driver manager still waiting there (for a canary) may only hold
// its watch.
func quietWindow(managerRun, installRun map[string]kubelet.Run) (time.Time, time.Time) {
	var firstInstallEnd time.Time
	for _, r := range installRun {
		if firstInstallEnd.IsZero() || r.Ended.Before(firstInstallEnd) {
			firstInstallEnd = r.Ended
		}
	}
	var lastManagerEnd time.Time
	for _, r := range managerRun {
		if r.Ended.Before(firstInstallEnd) && r.Ended.After(lastManagerEnd) {
			lastManagerEnd = r.Ended
		}
	}
	return lastManagerEnd.Add(time.Second), firstInstallEnd.Add(-time.Second)
}

// phase is a stretch of a node's cycle, between two times the recording or the stand-in's runs have.
type phase struct {
	name     string
	from, to func(node string) time.Time
}

// writeTimeline writes one CSV row per node, ordered by when it went out (first), with each phase's end and the
// extra times, in seconds from start.
func writeTimeline(path string, nodes []string, start time.Time, first func(string) time.Time, phases []phase, extra func(string) []time.Time) error {
	ordered := slices.Clone(nodes)
	slices.SortFunc(ordered, func(a, b string) int { return first(a).Compare(first(b)) })
	var sb strings.Builder
	sec := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return fmt.Sprintf("%.3f", t.Sub(start).Seconds())
	}
	for _, n := range ordered {
		row := []string{n, sec(first(n))}
		for _, p := range phases {
			row = append(row, sec(p.to(n)))
		}
		for _, t := range extra(n) {
			row = append(row, sec(t))
		}
		sb.WriteString(strings.Join(row, ",") + "\n")
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

// between is, for each node that has both times, from's to to's.
func between(nodes []string, from, to func(string) time.Time) []time.Duration {
	var ds []time.Duration
	for _, node := range nodes {
		if f, t := from(node), to(node); !f.IsZero() && !t.IsZero() {
			ds = append(ds, t.Sub(f))
		}
	}
	return ds
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(f float64) time.Duration { return s[min(len(s)-1, int(f*float64(len(s))))] }
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s / %s / %s (%d)", r(q(0.5)), r(q(0.9)), r(s[len(s)-1]), len(s))
}

// recording is what a change's watchers saw, per node, with the times they saw it: its old driver pod's deletion,
// its new driver pod's creation and readiness, and the first time it entered each upgrade state.
type recording struct {
	mu         sync.Mutex
	image      string // the new driver's image tag suffix
	start      time.Time
	want       int
	oldDeleted map[string]time.Time
	newCreated map[string]time.Time
	newReady   map[string]time.Time
	newPod     map[string]string
	states     map[string]map[nodestate.UpgradeState]time.Time
	// holders is each slots Lease's holders as last seen; tookSlot and gaveSlot when a node first appeared among
	// a pool's holders and last left them
	holders  map[string]map[string]string
	tookSlot map[string]time.Time
	gaveSlot map[string]time.Time
	done     chan struct{}
	closed   bool
	cancel   context.CancelFunc
}

func record(ctx context.Context, client kubernetes.Interface, image string, want int) (*recording, error) {
	ctx, cancel := context.WithCancel(ctx)
	r := &recording{image: image, start: time.Now(), want: want, oldDeleted: map[string]time.Time{}, newCreated: map[string]time.Time{},
		newReady: map[string]time.Time{}, newPod: map[string]string{}, states: map[string]map[nodestate.UpgradeState]time.Time{},
		holders: map[string]map[string]string{}, tookSlot: map[string]time.Time{}, gaveSlot: map[string]time.Time{},
		done: make(chan struct{}), cancel: cancel}
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = kubelet.ComponentLabel + "=" + kubelet.DriverComponent
		}))
	nodeInf := informers.NewSharedInformerFactory(client, 0)
	if _, err := pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.pod(obj) },
		UpdateFunc: func(_, obj any) { r.pod(obj) },
	}); err != nil {
		cancel()
		return nil, err
	}
	if _, err := nodeInf.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.node(obj) },
		UpdateFunc: func(_, obj any) { r.node(obj) },
	}); err != nil {
		cancel()
		return nil, err
	}
	leaseInf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	if _, err := leaseInf.Coordination().V1().Leases().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.slots(obj) },
		UpdateFunc: func(_, obj any) { r.slots(obj) },
	}); err != nil {
		cancel()
		return nil, err
	}
	pods.Start(ctx.Done())
	nodeInf.Start(ctx.Done())
	leaseInf.Start(ctx.Done())
	pods.WaitForCacheSync(ctx.Done())
	nodeInf.WaitForCacheSync(ctx.Done())
	leaseInf.WaitForCacheSync(ctx.Done())
	r.mu.Lock()
	clear(r.tookSlot) // holders from before the change are the starting point, not claims of it
	clear(r.gaveSlot)
	r.mu.Unlock()
	return r, nil
}

func (r *recording) stop() { r.cancel() }

func (r *recording) pod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	node := p.Spec.NodeName
	if node == "" {
		node = nodeOfAffinity(p)
	}
	isNew := strings.Contains(p.Spec.Containers[0].Image, r.image)
	switch {
	case !isNew && p.DeletionTimestamp != nil:
		if _, seen := r.oldDeleted[node]; !seen {
			r.oldDeleted[node] = now
		}
	case isNew && p.DeletionTimestamp == nil:
		if r.newPod[node] != p.Name {
			r.newPod[node], r.newCreated[node] = p.Name, now
			delete(r.newReady, node)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				if _, seen := r.newReady[node]; !seen {
					r.newReady[node] = now
				}
			}
		}
		if len(r.newReady) == r.want && !r.closed {
			r.closed = true
			close(r.done)
		}
	}
}

// nodeOfAffinity is the node a DaemonSet pod is made for (its matchFields term on metadata.name).
func nodeOfAffinity(p *corev1.Pod) string {
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range t.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return ""
}

// slots notes, from a pool's slots Lease, when a node took a slot (first seen among the holders) and gave it back
// (last seen leaving them).
func (r *recording) slots(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || !strings.HasPrefix(l.Name, slots.Prefix) {
		return
	}
	holders, err := slots.Holders(l)
	if err != nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for node := range holders {
		if _, was := r.holders[l.Name][node]; !was {
			if _, seen := r.tookSlot[node]; !seen {
				r.tookSlot[node] = now
			}
		}
	}
	for node := range r.holders[l.Name] {
		if _, is := holders[node]; !is {
			r.gaveSlot[node] = now
		}
	}
	r.holders[l.Name] = holders
}

func (r *recording) node(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	now := time.Now()
	s := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.states[n.Name] == nil {
		r.states[n.Name] = map[nodestate.UpgradeState]time.Time{}
	}
	if s == nodestate.UpgradeDone && r.states[n.Name][nodestate.UpgradeRequired].IsZero() {
		return // done with the previous change: this one has not reached it yet
	}
	if _, seen := r.states[n.Name][s]; !seen {
		r.states[n.Name][s] = now
	}
}

// handoffs pairs, in time order, each node turning upgrade-done (its slot given back) with the next node turning
// cordon-required (a slot taken): the k-th upgrade-done frees the slot the (m+k)-th cordon-required takes, m being
// the nodes that went out before the first one was done (the first batch).
func (r *recording) handoffs() []time.Duration {
	var dones, takes []time.Time
	for _, s := range r.states {
		if t, ok := s[nodestate.UpgradeDone]; ok {
			dones = append(dones, t)
		}
		if t, ok := s[nodestate.CordonRequired]; ok {
			takes = append(takes, t)
		}
	}
	return pairInOrder(dones, takes)
}

// slotHandoffs is handoffs as the slots Leases show it: a slot given back -> the next slot taken.
func (r *recording) slotHandoffs() []time.Duration {
	return pairInOrder(slices.Collect(maps.Values(r.gaveSlot)), slices.Collect(maps.Values(r.tookSlot)))
}

// pairInOrder pairs each take, in time order, with the oldest free before it not yet paired, and returns how long
// each paired take came after its free. A take with no such free used a slot no node had given back: the first
// batch's, or those a pool widens to once its canary validated (its slots go from the canary's one to
// maxUnavailable at once), which hand nothing on.
func pairInOrder(frees, takes []time.Time) []time.Duration {
	slices.SortFunc(frees, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(takes, func(a, b time.Time) int { return a.Compare(b) })
	var out []time.Duration
	next := 0 // the oldest free not yet paired
	for _, take := range takes {
		if next < len(frees) && !frees[next].After(take) {
			out = append(out, take.Sub(frees[next]))
			next++
		}
	}
	return out
}

// started says whether an old driver pod was deleted.
func (r *recording) started() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.oldDeleted) > 0
}

func (r *recording) progress() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d old driver pods deleted, %d new created, %d of %d Ready", len(r.oldDeleted), len(r.newCreated), len(r.newReady), r.want)
}
