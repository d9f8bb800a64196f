// The demo's body runs the README's demo: a local control plane with simulated GPU nodes, the chart installed with
// the helm SDK (its hooks run by the kubelet stand-in, validators passing), and a node x operand table of what runs
// where, followed by the post-install gate's own report. Every GPU node has a fixture host tree, so the stand-in
// runs the real driver manager and upgrade gate for each driver pod, as in tests/rollout: a driver change (the
// demo's -upgrade-driver, or a `helm upgrade` against the kept cluster) moves the nodes through the real upgrade
// states.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// Options of the demo.
type Options struct {
	// Profile is the values file to install (relative to the repository root).
	Profile string
	// UpgradeDriver, when set, is a driver version the demo upgrades to after the install, showing the plan, each
	// node's upgrade states and the post-upgrade gate.
	UpgradeDriver string
	// Keep leaves the cluster running until Enter is pressed on Stdin (or Ctrl-C) and prints its kubeconfig. Enter
	// ends the demo with exit 0 under make too, where Ctrl-C also interrupts make itself.
	Keep  bool
	Stdin io.Reader
}

const (
	release   = "gpu"
	namespace = "gpu-operator"
)

// Run starts the cluster, registers the demo nodes, installs the chart and prints the table.
func Run(ctx context.Context, opts Options, out io.Writer) (err error) {
	parent := ctx
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Ctrl-C is how the demo ends (with --keep, the only way): whatever it cut short, the cluster is stopped by the
	// deferred calls and that is no failure
	defer func() {
		if err != nil && ctx.Err() != nil && parent.Err() == nil {
			fmt.Fprintf(out, "\ninterrupted (%v): the demo cluster is stopped\n", err)
			err = nil
		}
	}()
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{HarnessComponents: kubelet.Components(), HarnessTerminates: kubelet.Terminates(), ControllerManagerArgs: cluster.TolerateLateHeartbeats})
	if err != nil {
		return err
	}
	defer c.Stop()
	stand, err := kubelet.Start(ctx, c.Client, c.Kubeconfig)
	if err != nil {
		return err
	}
	// helm's hook logs and `kubectl logs` of a hook pod read what the stand-in ran, as on a real cluster
	c.ServeContainerLogs(stand.ContainerLog)
	hosts, err := newHosts()
	if err != nil {
		return err
	}
	defer hosts.remove()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r) // a fixture host tree could not be written
		}
	}()
	var nodes []*corev1.Node
	var names []string
	for _, n := range nodefixtures.Demo() {
		nodes = append(nodes, n.Object())
		names = append(names, n.Name)
		if n.GPUs > 0 {
			stand.SetDriverHost(n.Name, kubelet.DriverHost{Fixture: kmodtest.New(hosts)})
		}
	}
	if err := c.AddNodes(ctx, nodes...); err != nil {
		return err
	}
	fmt.Fprintf(out, "control plane with %d simulated nodes up in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))

	// the chart's own versions, not the tests' pinned one: an upgrade from the clone afterwards restarts nothing
	t := install.Target{Kubeconfig: c.Kubeconfig, Release: release, Namespace: namespace, Timeout: 3 * time.Minute, Released: true}
	start = time.Now()
	profile := filepath.Join(chartrender.RepoRoot(), opts.Profile)
	if _, err := t.Install(ctx, []string{profile}); err != nil {
		return err
	}
	fmt.Fprintf(out, "helm install %s: rolled out in %s\n", opts.Profile, time.Since(start).Round(time.Millisecond))
	// one node x operand table, the gate's (what `kube-gpu-stack status` shows later), nodes by name as every table
	// here; the pods running per node only where the profile runs no gate
	if r, ok := stand.LastRun("validation-gate", start); ok {
		fmt.Fprintf(out, "\noperands per node, as the post-install gate validated them (kube-gpu-stack check):\n%s", r.Output)
	} else {
		slices.Sort(names)
		running, err := t.Running(ctx, c.Client, names)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\noperand pods running per node:\n\n%s", running.Table(names))
	}
	fmt.Fprintf(out, "\ndriver per node (kube-gpu-stack upgrade status):\n")
	if err := upgradeplan.WriteStatus(ctx, c.Client, namespace, release, out); err != nil {
		return err
	}

	if opts.UpgradeDriver != "" {
		if err := upgradeDriver(ctx, c, stand, t, profile, opts.UpgradeDriver, out); err != nil {
			return err
		}
	}
	if opts.Keep {
		fmt.Fprintf(out, "\ncluster kept running: export KUBECONFIG=%s  (Enter stops it, as does Ctrl-C)\n", c.Kubeconfig)
		select {
		case <-ctx.Done():
		case <-enterPressed(opts.Stdin):
			fmt.Fprintln(out, "stopping the demo cluster")
		}
	}
	return nil
}

// upgradeDriver changes the driver version as `helm upgrade --set driver.image.tag=TAG` does (without --wait:
// the post-upgrade gate waits) and prints the plan, the states each node went through, and the gate's report.
func upgradeDriver(ctx context.Context, c *cluster.Cluster, stand *kubelet.Kubelet, t install.Target, profile, tag string, out io.Writer) error {
	rec, err := watchStates(ctx, c)
	if err != nil {
		return err
	}
	start := time.Now()
	t.NoWait = true
	_, upErr := t.Upgrade(ctx, []string{profile}, "driver.image.tag="+tag)
	seq := rec.stop()
	fmt.Fprintf(out, "\nhelm upgrade --set driver.image.tag=%s: ", tag)
	if upErr != nil {
		fmt.Fprintf(out, "failed after %s: %v\n", time.Since(start).Round(time.Millisecond), upErr)
	} else {
		fmt.Fprintf(out, "done in %s\n", time.Since(start).Round(time.Millisecond))
	}
	if r, ok := stand.LastRun("pre-upgrade", start); ok {
		fmt.Fprintf(out, "\npre-upgrade plan:\n%s", r.Output)
	}
	fmt.Fprintf(out, "\ndriver upgrade states per node (nvidia.com/gpu-driver-upgrade-state):\n")
	for _, n := range slices.Sorted(maps.Keys(seq)) {
		fmt.Fprintf(out, "  %s: %s\n", n, strings.Join(seq[n], " -> "))
	}
	if r, ok := stand.LastRun("validation-gate", start); ok {
		fmt.Fprintf(out, "\npost-upgrade gate (kube-gpu-stack check):\n%s", r.Output)
	}
	fmt.Fprintf(out, "\ndriver per node (kube-gpu-stack upgrade status):\n")
	return upgradeplan.WriteStatus(ctx, c.Client, namespace, release, out)
}

// stateRecorder keeps, per node, the upgrade states it went through while it watched.
type stateRecorder struct {
	mu     sync.Mutex
	seq    map[string][]string
	cancel context.CancelFunc
	done   chan struct{}
}

func watchStates(ctx context.Context, c *cluster.Cluster) (*stateRecorder, error) {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &stateRecorder{seq: map[string][]string{}, cancel: cancel, done: make(chan struct{})}
	for i := range list.Items {
		r.observe(&list.Items[i])
	}
	w, err := c.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(r.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type != watch.Deleted {
				r.observe(n)
			}
		}
	}()
	return r, nil
}

func (r *stateRecorder) observe(n *corev1.Node) {
	st, ok := n.Labels[nodestate.UpgradeStateLabel]
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.seq[n.Name]; len(s) == 0 || s[len(s)-1] != st {
		r.seq[n.Name] = append(s, st)
	}
}

func (r *stateRecorder) stop() map[string][]string {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// fixtureHosts is what a fixture host tree needs outside a test: folders under one temporary folder, removed when
// the demo ends; a tree that cannot be written ends the demo (the panic Run recovers).
type fixtureHosts struct {
	testing.TB
	dir string
	n   int
}

func newHosts() (*fixtureHosts, error) {
	dir, err := os.MkdirTemp("", "kube-gpu-stack-demo-hosts-")
	return &fixtureHosts{dir: dir}, err
}

func (h *fixtureHosts) remove() { _ = os.RemoveAll(h.dir) }

func (h *fixtureHosts) Helper() {}

func (h *fixtureHosts) TempDir() string {
	h.n++
	dir := filepath.Join(h.dir, fmt.Sprintf("host-%d", h.n))
	if err := os.Mkdir(dir, 0o755); err != nil {
		panic(err)
	}
	return dir
}

func (h *fixtureHosts) Cleanup(func())               {}
func (h *fixtureHosts) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (h *fixtureHosts) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (h *fixtureHosts) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (h *fixtureHosts) Logf(string, ...any)          {}

// enterPressed is closed once a line is read from in; never when in is nil or ends first (no terminal: only a
// signal stops the demo then).
func enterPressed(in io.Reader) <-chan struct{} {
	pressed := make(chan struct{})
	if in == nil {
		return pressed
	}
	go func() {
		if _, err := bufio.NewReader(in).ReadString('\n'); err == nil {
			close(pressed)
		}
	}()
	return pressed
}
