package kubelet

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

// RunPackage is a test package's TestMain body: it starts the local control plane (kwok leaving Components() to
// the stand-in), the stand-in and the given simulated nodes, hands the cluster and stand-in to use, runs the
// package's tests and stops everything, returning the exit code. Without control-plane binaries (and not under
// CI=true) the package says it skipped.
func RunPackage(m *testing.M, name string, nodes []*corev1.Node, use func(*cluster.Cluster, *Kubelet)) int {
	return RunPackageWith(m, name, nodes, nil, use)
}

// RunPackageWith is RunPackage with the control plane's options changed by edit first (the API server's audit
// flags, say); nil changes nothing.
func RunPackageWith(m *testing.M, name string, nodes []*corev1.Node, edit func(*cluster.Options), use func(*cluster.Cluster, *Kubelet)) int {
	start := time.Now()
	opts := options()
	if edit != nil {
		edit(&opts)
	}
	c, skip, err := cluster.ForPackage(opts)
	switch {
	case skip:
		fmt.Printf("SKIP %s: %v\n", name, err)
		return 0
	case err != nil:
		fmt.Printf("%s: %v\n", name, err)
		return 1
	}
	defer c.Stop()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stand, err := standIn(ctx, c, nodes)
	if err != nil {
		fmt.Printf("%s: %v\n", name, err)
		return 1
	}
	fmt.Printf("%s: cluster with %d simulated nodes ready in %s\n", name, len(nodes), time.Since(start).Round(time.Millisecond))
	use(c, stand)
	return m.Run()
}

// Env is one more control plane as RunPackage starts it, with its stand-in and simulated nodes: a package that
// runs independent tests side by side gives each its own.
type Env struct {
	Cluster *cluster.Cluster
	Kubelet *Kubelet
	stop    context.CancelFunc
}

// StartEnv starts a control plane (its processes' output to log; nil discards it), the stand-in and nodes, as
// RunPackage does. Stop it when done.
func StartEnv(ctx context.Context, nodes []*corev1.Node, log io.Writer) (*Env, error) {
	opts := options()
	opts.Log = log
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	c.StopOnSignal()
	standCtx, stop := context.WithCancel(context.Background())
	k, err := standIn(standCtx, c, nodes)
	if err != nil {
		stop()
		c.Stop()
		return nil, err
	}
	return &Env{Cluster: c, Kubelet: k, stop: stop}, nil
}

// Stop stops the stand-in and the control plane.
func (e *Env) Stop() {
	e.stop()
	e.Cluster.Stop()
}

func options() cluster.Options {
	return cluster.Options{Log: cluster.LogSink(), HarnessComponents: Components(), HarnessTerminates: Terminates(), ControllerManagerArgs: cluster.TolerateLateHeartbeats}
}

// standIn starts the stand-in on c (until ctx ends) and registers nodes.
func standIn(ctx context.Context, c *cluster.Cluster, nodes []*corev1.Node) (*Kubelet, error) {
	stand, err := Start(ctx, c.Client, c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubelet stand-in: %w", err)
	}
	c.ServeContainerLogs(stand.ContainerLog)
	addCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.AddNodes(addCtx, nodes...); err != nil {
		return nil, err
	}
	return stand, nil
}

// Pool shares a package's control planes among tests that run side by side: Use gives a test one of its own for
// the test's whole run (the first is the package's own, from RunPackage; more are started on demand, up to the
// pool's size), so tests that each own a cluster (cluster-scoped objects, node snapshots) need not wait for one
// another. Memory bounds the size: about 1 GiB per control plane.
type Pool struct {
	nodes []*corev1.Node
	setup func(context.Context, *Env)
	log   func(n int) io.Writer
	ctx   context.Context // ends at Stop
	end   context.CancelFunc
	idle  chan *Env
	slots chan struct{}

	mu      sync.Mutex
	count   int // control planes started or starting here (the first is number 1, these 2, 3...)
	started []*Env
}

// NewPool is a pool of size control planes, first among them (nil: the pool starts every one on demand); each new
// one gets nodes and its processes' output to log(n) (nil: discarded). setup, when set, runs on each before its
// first use, with a context that ends at Stop. Stop stops the control planes the pool started.
func NewPool(first *Env, size int, nodes []*corev1.Node, log func(n int) io.Writer, setup func(context.Context, *Env)) *Pool {
	size = max(size, 1)
	started := size
	if first != nil {
		started--
	}
	p := &Pool{nodes: nodes, setup: setup, log: log, idle: make(chan *Env, size), slots: make(chan struct{}, started)}
	p.ctx, p.end = context.WithCancel(context.Background())
	if first != nil {
		if setup != nil {
			setup(p.ctx, first)
		}
		p.idle <- first
	}
	return p
}

// Use marks t parallel and gives it a control plane until it ends: an idle one, else a new one while the pool has
// room, else the first one freed.
func (p *Pool) Use(t *testing.T) *Env {
	t.Helper()
	t.Parallel()
	var e *Env
	select {
	case e = <-p.idle:
	default:
		select {
		case e = <-p.idle:
		case p.slots <- struct{}{}:
			var err error
			if e, err = p.start(t.Context()); err != nil {
				<-p.slots
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { p.idle <- e })
	return e
}

func (p *Pool) start(ctx context.Context) (*Env, error) {
	p.mu.Lock()
	p.count++
	n := p.count + 1
	p.mu.Unlock()
	var log io.Writer
	if p.log != nil {
		log = p.log(n)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	e, err := StartEnv(ctx, p.nodes, log)
	if err != nil {
		return nil, fmt.Errorf("control plane %d of the pool: %w", n, err)
	}
	fmt.Printf("control plane %d with %d simulated nodes ready in %s\n", n, len(p.nodes), time.Since(start).Round(time.Millisecond))
	if p.setup != nil {
		p.setup(p.ctx, e)
	}
	p.mu.Lock()
	p.started = append(p.started, e)
	p.mu.Unlock()
	return e, nil
}

// Nodes are the simulated nodes of the pool's control planes.
func (p *Pool) Nodes() []*corev1.Node { return p.nodes }

// Stop ends the setups' context and stops the control planes the pool started.
func (p *Pool) Stop() {
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range p.started {
		wg.Go(e.Stop)
	}
	wg.Wait()
}
