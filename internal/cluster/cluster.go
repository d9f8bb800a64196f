// Package cluster runs a real local control plane for tests and the demo: etcd and kube-apiserver through
// controller-runtime's envtest, plus kube-controller-manager, kube-scheduler and kwok as child processes, all on
// 127.0.0.1. kwok plays the kubelet of simulated nodes (it marks their pods Running without running anything),
// so DaemonSet rollout, scheduling, evictions and PDBs are the API server's and controllers' real behaviour.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

// Binaries the control plane needs in its folder (built by ci/build-controlplane.sh).
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// SimulatedNodeAnnotation marks the nodes kwok manages; nodes without it are left alone.
const SimulatedNodeAnnotation = "kwok.x-k8s.io/node"

// ErrNoBinaries means the control plane has not been built on this machine.
var ErrNoBinaries = errors.New("control plane binaries not found: run `make controlplane` (or ci/build-controlplane.sh) and set KUBEBUILDER_ASSETS to the folder it prints")

// BinDir returns the folder holding the control-plane binaries: $KUBEBUILDER_ASSETS.
func BinDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", ErrNoBinaries
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%w (%v)", ErrNoBinaries, err)
		}
	}
	return dir, nil
}

// Cluster is a running local control plane.
type Cluster struct {
	// Config is an admin client config for the API server.
	Config *rest.Config
	// Kubeconfig is the path of an admin kubeconfig file.
	Kubeconfig string
	// Client is an admin clientset.
	Client kubernetes.Interface

	env   *envtest.Environment
	dir   string
	procs []*exec.Cmd
	once  sync.Once
	log   io.Writer
	// restarted are kube-apiserver and etcd as Restart started them again (envtest's own have exited).
	restarted []*exec.Cmd
	// nodes is the simulated nodes' kubelet endpoint, for pod logs (ServeContainerLogs).
	nodes *nodeEndpoint
}

// ServeContainerLogs has the simulated nodes serve pod logs from logs (the kubelet stand-in's runs): `kubectl logs`
// and helm's hook logs read them through the API server. Until it is called every log is a 404 that says none is
// kept.
func (c *Cluster) ServeContainerLogs(logs ContainerLogs) { c.nodes.serve(logs) }

// TolerateLateHeartbeats are the controller-manager flags of a cluster whose nodes kwok simulates while the
// tests play the kubelet for some pods: kwok renews every node's lease from one process that shares the machine's
// cores with the system under test (and cannot renew while a fault test has the API server down), and a renewal
// late by the default grace period would turn the node NotReady and its pods unready. The node lifecycle
// controller marks them; no kubelet marks them back, and the DaemonSet controller replaces an unready old pod
// outside its maxUnavailable budget. That is the simulator's fault, not the stack's, so the grace is 10 minutes.
var TolerateLateHeartbeats = []string{"--node-monitor-grace-period=10m"}

// nodeLeaseSeconds is how long kwok's node leases last; kwok renews each at a quarter of it, as a kubelet does.
// With the 10-minute grace of TolerateLateHeartbeats the leases last 4 minutes (a renewal a minute per node rather
// than every 10 s: on the 28 nodes of tests/e2e those writes were 6% of its requests); with the default grace
// (50 s) they stay at 40 s.
func nodeLeaseSeconds(controllerManagerArgs []string) int {
	if slices.Contains(controllerManagerArgs, TolerateLateHeartbeats[0]) {
		return 240
	}
	return 40
}

// Options tune Start.
type Options struct {
	// BinDir holds the binaries; empty means BinDir().
	BinDir string
	// Log receives the child processes' output; nil discards it.
	Log io.Writer
	// HarnessComponents are pod components (label app.kubernetes.io/component) that kwok leaves alone: the tests
	// play the kubelet for them (internal/kubelet), running the project's own code instead of faking success.
	HarnessComponents []string
	// HarnessTerminates are harness components whose deleted pods the harness removes itself, once their
	// containers stopped (a preStop hook, the grace period), as a kubelet does; kwok removes every other deleted pod
	// at once.
	HarnessTerminates []string
	// APIServerAddress and APIServerPort, when both set, are where the API server listens (and the address its serving
	// certificate names) instead of a free port on 127.0.0.1: a real kubelet's pods must reach it (tests/node).
	APIServerAddress string
	APIServerPort    int
	// APIServerArgs are extra kube-apiserver flags (name without dashes -> values); no values drops one of envtest's
	// defaults (e.g. disable-admission-plugins, which turns off ServiceAccount admission: real pods need their token).
	APIServerArgs map[string][]string
	// ControllerManagerArgs are extra kube-controller-manager flags ("--name=value").
	ControllerManagerArgs []string
}

// Start starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, and returns once the API
// server answers. Stop tears everything down; call it even when Start's caller fails.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	// envtest logs through controller-runtime's logger, which otherwise prints a stack trace complaining it was
	// never set; the children's output goes to opts.Log
	ctrllog.SetLogger(logr.Discard())
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = BinDir(); err != nil {
			return nil, err
		}
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	dir, err := os.MkdirTemp("", "kube-gpu-stack-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, log: log, env: &envtest.Environment{
		BinaryAssetsDirectory:    bin,
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}}
	// Without an endpoint reconciler the apiserver does not try to publish its (loopback) address.
	// etcd's data in a folder of ours, not one envtest removes when it stops: Restart keeps it
	c.env.ControlPlane.Etcd = &envtest.Etcd{DataDir: filepath.Join(dir, "etcd")}
	api := c.env.ControlPlane.GetAPIServer()
	api.Configure().Set("endpoint-reconciler-type", "none")
	for k, v := range opts.APIServerArgs {
		if len(v) == 0 {
			api.Configure().Disable(k)
			continue
		}
		api.Configure().Set(k, v...)
	}
	if opts.APIServerAddress != "" {
		api.SecureServing.Address, api.SecureServing.Port = opts.APIServerAddress, fmt.Sprint(opts.APIServerPort)
	}
	token, err := writeAdminToken(dir)
	if err != nil {
		c.Stop()
		return nil, err
	}
	for k, v := range harnessAPIServerArgs(filepath.Join(dir, adminTokenFile)) {
		api.Configure().Append(k, v...)
	}
	started, err := c.env.Start()
	if err != nil {
		c.Stop()
		return nil, fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	c.Config = adminConfig(started, token)
	if err := c.writeKubeconfig(); err != nil {
		c.Stop()
		return nil, err
	}
	if c.Client, err = kubernetes.NewForConfig(protobuf(c.Config)); err != nil {
		c.Stop()
		return nil, err
	}
	stages, err := c.writeKwokStages(opts.HarnessComponents, opts.HarnessTerminates)
	if err != nil {
		c.Stop()
		return nil, err
	}
	if c.nodes, err = startNodeEndpoint(); err != nil {
		c.Stop()
		return nil, err
	}
	kwokHome := filepath.Join(dir, "kwok-home")
	if err := os.MkdirAll(kwokHome, 0o700); err != nil {
		c.Stop()
		return nil, err
	}
	// The controllers' and the scheduler's client-side limits (20 and 50 requests/s by default) would pace every
	// DaemonSet rollout and every garbage collection of the simulated nodes' pods; lifted as kwokctl does for its
	// simulated clusters. The API server's own limits stay.
	unthrottled := []string{"--kube-api-qps=5000", "--kube-api-burst=10000"}
	children := []struct {
		name string
		args []string
		env  []string
	}{
		{"kube-controller-manager", append([]string{
			"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--bind-address=127.0.0.1",
			"--use-service-account-credentials=false", controllers,
		}, slices.Concat(unthrottled, opts.ControllerManagerArgs)...), nil},
		{"kube-scheduler", append([]string{
			"--kubeconfig=" + c.Kubeconfig, "--leader-elect=false", "--secure-port=0", "--bind-address=127.0.0.1",
		}, unthrottled...), nil},
		{"kwok", []string{
			"--kubeconfig=" + c.Kubeconfig, "--config=" + stages, "--manage-all-nodes=false",
			"--manage-nodes-with-annotation-selector=" + SimulatedNodeAnnotation + "=fake",
			fmt.Sprintf("--node-lease-duration-seconds=%d", nodeLeaseSeconds(opts.ControllerManagerArgs)), "--cidr=10.0.0.1/16", "--node-ip=127.0.0.1", "--server-address=127.0.0.1:0",
			fmt.Sprintf("--node-port=%d", c.nodes.port), // the port each simulated node's status names for its kubelet
		}, []string{"HOME=" + kwokHome}},
	}
	for _, ch := range children {
		if err := c.spawn(filepath.Join(bin, ch.name), ch.args, ch.env, log); err != nil {
			c.Stop()
			return nil, fmt.Errorf("start %s: %w", ch.name, err)
		}
	}
	return c, nil
}

func (c *Cluster) writeKubeconfig() error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos[adminUser] = &clientcmdapi.AuthInfo{Token: c.Config.BearerToken}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: adminUser}
	kc.CurrentContext = "local"
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	return clientcmd.WriteToFile(*kc, c.Kubeconfig)
}

// writeKwokStages writes kwok's own fast stages: nodes become Ready at once and keep a lease; pods become Ready,
// Jobs' pods complete, and deleted pods go away. Pods of the harness components are left out of "ready" and
// "complete", so only the harness decides how they end, and those of terminates out of "delete" too.
func (c *Cluster) writeKwokStages(harness, terminates []string) (string, error) {
	docs := []string{nodefast.DefaultNodeInit, nodelease.DefaultNodeHeartbeatWithLease}
	for _, stage := range []string{podfast.DefaultPodReady, podfast.DefaultPodComplete} {
		if len(harness) > 0 {
			var err error
			if stage, err = withMatchExpression(stage, excludeComponents(harness)); err != nil {
				return "", err
			}
		}
		docs = append(docs, stage)
	}
	podDelete, err := withMatchExpression(podfast.DefaultPodDelete, notYetDeletedAtOnce)
	if err != nil {
		return "", err
	}
	if len(terminates) > 0 {
		if podDelete, err = withMatchExpression(podDelete, excludeComponents(terminates)); err != nil {
			return "", err
		}
	}
	docs = append(docs, podDelete)
	path := filepath.Join(c.dir, "kwok-stages.yaml")
	return path, os.WriteFile(path, []byte(strings.Join(docs, "\n---\n")), 0o600)
}

// excludeComponents is a kwok match expression "component NotIn harness".
func excludeComponents(harness []string) map[string]any {
	return map[string]any{"key": `.metadata.labels["app.kubernetes.io/component"]`, "operator": "NotIn", "values": harness}
}

// notYetDeletedAtOnce keeps kwok's pod-delete stage off pods whose deletion grace period is already 0. kwok's own
// delete (grace period 0) first shortens the period, which the API server writes as an update before it removes
// the pod; kwok sees that update, plays the stage again and deletes a pod that is gone (a 404), one wasted request
// for every pod the suites delete. A pod at grace period 0 needs no delete from kwok: the API server removes it at
// once, or as soon as its last finalizer goes, which a delete cannot hasten.
var notYetDeletedAtOnce = map[string]any{"key": ".metadata.deletionGracePeriodSeconds == 0", "operator": "NotIn", "values": []string{"true"}}

// withMatchExpression adds a match expression to a kwok Stage's selector.
func withMatchExpression(stage string, expr map[string]any) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(stage), &doc); err != nil {
		return "", err
	}
	spec, _ := doc["spec"].(map[string]any)
	sel, _ := spec["selector"].(map[string]any)
	if sel == nil {
		return "", fmt.Errorf("kwok stage without a selector: %.80s", stage)
	}
	exprs, _ := sel["matchExpressions"].([]any)
	sel["matchExpressions"] = append(exprs, expr)
	out, err := yaml.Marshal(doc)
	return string(out), err
}

func (c *Cluster) spawn(path string, args, env []string, log io.Writer) error {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, and killed with the test binary if it dies first, so nothing outlives a run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// StopOnSignal stops the cluster and exits when the process is interrupted (Ctrl-C, SIGTERM), so no etcd or API
// server outlives a run; with several clusters in one process, all of them. A SIGKILL'ed test binary still takes
// controller-manager, scheduler and kwok with it (Pdeathsig); envtest's etcd and API server then need a manual kill.
func (c *Cluster) StopOnSignal() {
	live.Lock()
	defer live.Unlock()
	live.clusters = append(live.clusters, c)
	live.once.Do(func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-sig
			live.Lock()
			all := slices.Clone(live.clusters)
			live.Unlock()
			var wg sync.WaitGroup
			for _, c := range all {
				wg.Go(c.Stop)
			}
			wg.Wait()
			os.Exit(1)
		}()
	})
}

// live are the clusters StopOnSignal stops.
var live struct {
	sync.Mutex
	once     sync.Once
	clusters []*Cluster
}

// Stop kills the child processes (by process group), stops etcd and the API server and removes temp dirs; an
// API server or etcd that does not stop in time is killed, and the cluster's log says so. It is safe to call more
// than once.
func (c *Cluster) Stop() {
	c.once.Do(func() {
		if c.nodes != nil {
			c.nodes.stop()
		}
		for _, p := range c.procs {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		}
		for _, p := range c.procs {
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
		for _, p := range c.restarted {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
		if c.env != nil {
			if err := c.env.Stop(); err != nil {
				fmt.Fprintf(c.log, "cluster: stop: %v\n", err)
			}
		}
		_ = os.RemoveAll(c.dir)
	})
}

// ForPackage starts the cluster a test package shares (from its TestMain), with StopOnSignal set; the caller
// stops it. Without control-plane binaries it reports skip (the package's tests are skipped), except under
// CI=true, where a missing control plane is an error, never a skip.
func ForPackage(opts Options) (c *Cluster, skip bool, err error) {
	if _, err := BinDir(); err != nil {
		return nil, errors.Is(err, ErrNoBinaries) && os.Getenv("CI") != "true", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c, err = Start(ctx, opts); err != nil {
		return nil, false, fmt.Errorf("start cluster: %w", err)
	}
	c.StopOnSignal()
	return c, false, nil
}

// Main is a test package's TestMain: it starts the package's cluster (ForPackage), hands it to use, runs the
// tests and stops the cluster, and returns the exit code. Without a control plane outside CI it prints a SKIP line
// naming the package and returns 0.
func Main(m *testing.M, name string, opts Options, use func(*Cluster)) int {
	c, skip, err := ForPackage(opts)
	switch {
	case skip:
		fmt.Printf("SKIP %s: %v\n", name, err)
		return 0
	case err != nil:
		fmt.Printf("%s: %v\n", name, err)
		return 1
	}
	defer c.Stop()
	use(c)
	return m.Run()
}

// LogSink is where a test package sends the control plane's logs: the file E2E_LOG names, else nowhere.
func LogSink() io.Writer {
	if p := os.Getenv("E2E_LOG"); p != "" {
		if f, err := os.Create(p); err == nil {
			return f
		}
	}
	return nil
}
