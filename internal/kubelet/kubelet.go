// Package kubelet plays the kubelet for the stack's own containers on simulated nodes. kwok marks ordinary pods
// Running at once; for the pods this package handles (excluded from kwok's stages, see cluster.Options) it runs the
// project's code instead — the hook Jobs' `kube-gpu-stack` commands in-process against the real API server, and
// the validator's checks with outcomes the test sets, the driver pods' driver manager and upgrade gate against a
// node's fixture host (see DriverHost) — and writes the pod status a kubelet would: Succeeded or Failed for a
// Job's pod, Ready or stuck in an init container for a validator or a driver pod.
package kubelet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// ComponentLabel names a pod's operand or hook.
const ComponentLabel = "app.kubernetes.io/component"

// Validators are the validator DaemonSets' components; HookComponents the chart's hook pods'.
var (
	Validators     = []string{"operator-validator", "sandbox-validator"}
	HookComponents = []string{"validation-gate", "validation-test", "cleanup", "pre-upgrade"}
)

// Components is every component this package plays the kubelet for.
func Components() []string {
	return append(append(append([]string{}, Validators...), HookComponents...), DriverComponent)
}

// Terminates are the components whose deleted pods this package removes itself once their containers stopped
// (cluster.Options.HarnessTerminates): a driver pod's driver container waits in its preStop for its upgrade gate.
func Terminates() []string { return []string{DriverComponent} }

// Run records one hook pod's run.
type Run struct {
	Pod, Component, Node string
	// Container is the container the run played, when it played one of the pod's own (a hook pod's).
	Container      string
	Args           []string
	ExitCode       int
	Output         string
	Started, Ended time.Time
}

// Kubelet is the stand-in. Create it with Start.
type Kubelet struct {
	client     kubernetes.Interface
	kubeconfig string

	// api and apiKubeconfig are what the project's code run here talks to (the driver manager, the upgrade gate and
	// the hooks): the API server itself unless UseAPI pointed them elsewhere. The stand-in's own writes (pod status,
	// the validators' outcomes) always go straight to the API server. Both are read and set under mu.
	api           kubernetes.Interface
	apiKubeconfig string
	// perComponent, when set, gives the driver manager and the upgrade gate of each node a client (UseClients).
	perComponent func(component, node string) kubernetes.Interface

	mu       sync.Mutex
	outcomes map[string]map[string]nodestate.Validation // node -> check -> outcome (absent: ready)
	runs     []Run
	handled  map[types.UID]bool
	readyAt  map[string]time.Time   // node -> when its validator pod was last marked Ready
	readies  map[string][]time.Time // node -> each time a validator pod of it was about to be marked Ready
	inFlight map[string]int         // hook component -> runs in progress
	pokes    chan string            // node names whose validators must be re-evaluated
	hosts    map[string]*DriverHost
	// apiChanged is closed (and replaced) when UseAPI or UseClients points the project's code elsewhere
	apiChanged chan struct{}
	// driverRunning: driver pods whose driver container started; driverStops: their stops (DriverStops)
	driverRunning map[types.UID]bool
	driverStops   []DriverStop
	loaded        map[string]string                // node -> image of the driver its host has loaded
	faults        map[string]string                // driver image tag prefix -> why its validation fails
	nodeFaults    map[string]string                // "<node>/<driver image tag>" -> why its validation fails there
	stops         map[types.UID]context.CancelFunc // a handled pod's containers, stopped when it is deleted
	monitors      map[string]gpuhealth.Monitor     // node -> the GPU health agent's NVML (SetGPUMonitor)
	// driverDone: closed when a driver pod's containers all returned; terminating: driver pods being stopped
	driverDone  map[types.UID]chan struct{}
	terminating map[types.UID]bool
	// skew: how far the hook pods' clock is off (SetClockSkew)
	skew time.Duration
	// validating serializes the runs of one validator pod's checks
	validating map[types.UID]*sync.Mutex
	// statuses counts each pod's status writes asked for: a write still retrying gives way to a newer one
	statuses map[types.UID]uint64
	// nodeClients are each node's client (apiFor)
	nodeClients map[string]kubernetes.Interface
}

// Start watches pods of the handled components and acts on each once it is bound to a node.
func Start(ctx context.Context, client kubernetes.Interface, kubeconfig string) (*Kubelet, error) {
	k := &Kubelet{client: client, kubeconfig: kubeconfig, api: client, apiKubeconfig: kubeconfig, readies: map[string][]time.Time{}, outcomes: map[string]map[string]nodestate.Validation{},
		handled: map[types.UID]bool{}, readyAt: map[string]time.Time{}, inFlight: map[string]int{}, pokes: make(chan string, 64),
		hosts: map[string]*DriverHost{}, stops: map[types.UID]context.CancelFunc{}, monitors: map[string]gpuhealth.Monitor{}, loaded: map[string]string{}, faults: map[string]string{}, nodeFaults: map[string]string{},
		validating: map[types.UID]*sync.Mutex{}, statuses: map[types.UID]uint64{}, driverRunning: map[types.UID]bool{}, apiChanged: make(chan struct{}),
		driverDone: map[types.UID]chan struct{}{}, terminating: map[types.UID]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = ComponentLabel + " in (" + strings.Join(Components(), ",") + ")"
	}))
	pods := factory.Core().V1().Pods().Informer()
	handle := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok {
			k.consider(ctx, pod)
		}
	}
	stop := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			if pod.Labels[ComponentLabel] == DriverComponent {
				k.recordDriverStop(ctx, pod, true) // deleted at once (no grace period): the stop came now
				k.mu.Lock()
				delete(k.terminating, pod.UID)
				delete(k.driverDone, pod.UID)
				k.mu.Unlock()
			}
			k.stop(pod.UID)
		}
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: handle, UpdateFunc: func(_, obj any) { handle(obj) }, DeleteFunc: stop,
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case node := <-k.pokes:
				for _, obj := range pods.GetStore().List() {
					if pod := obj.(*corev1.Pod); pod.Spec.NodeName == node && isValidator(pod) && pod.DeletionTimestamp == nil {
						// each pod's validators run in a goroutine of their own, as each node's kubelet does: one at a
						// time here would pace a rollout's nodes by the stand-in's requests
						go k.validate(ctx, pod)
					}
				}
			}
		}
	}()
	return k, nil
}

func isValidator(pod *corev1.Pod) bool {
	c := pod.Labels[ComponentLabel]
	return c == Validators[0] || c == Validators[1]
}

// SetClockSkew sets how far the clock of the nodes that run hook pods from now on is off (0: right), as on nodes
// whose clocks drift: the pre-upgrade plan stamps its plan with it.
func (k *Kubelet) SetClockSkew(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.skew = d
}

func (k *Kubelet) clockSkew() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.skew
}

// poke re-runs node's validators.
func (k *Kubelet) poke(node string) { k.pokes <- node }

// stop ends the goroutines playing a pod's containers and forgets the pod (called once it is deleting, when no
// later event of it acts again): a status write for it still retrying gives way.
func (k *Kubelet) stop(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.validating, uid)
	delete(k.handled, uid)
	delete(k.statuses, uid)
	if cancel := k.stops[uid]; cancel != nil {
		cancel()
		delete(k.stops, uid)
	}
}

// SetOutcome makes check report v on node from now on (and re-runs that node's validators); Reset forgets all.
func (k *Kubelet) SetOutcome(node, check string, v nodestate.Validation) {
	k.mu.Lock()
	if k.outcomes[node] == nil {
		k.outcomes[node] = map[string]nodestate.Validation{}
	}
	k.outcomes[node][check] = v
	k.mu.Unlock()
	k.pokes <- node
}

// Reset makes every check pass again on every node (validators re-run as their pods are recreated).
func (k *Kubelet) Reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.outcomes = map[string]map[string]nodestate.Validation{}
}

// UseAPI makes the project's code the stand-in runs from now on (driver manager, upgrade gate, hook commands) talk
// to the API server through cfg (a proxy in front of it, say), with a kubeconfig file written under dir; nil goes
// back to the API server itself.
func (k *Kubelet) UseAPI(cfg *rest.Config, dir string) error {
	client, kubeconfig := k.client, k.kubeconfig
	if cfg != nil {
		var err error
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			return err
		}
		kubeconfig = filepath.Join(dir, "kubeconfig-api")
		c := clientcmdapi.NewConfig()
		c.Clusters["api"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
		c.AuthInfos["api"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
		c.Contexts["api"] = &clientcmdapi.Context{Cluster: "api", AuthInfo: "api"}
		c.CurrentContext = "api"
		if err := clientcmd.WriteToFile(*c, kubeconfig); err != nil {
			return err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.api, k.apiKubeconfig = client, kubeconfig
	k.apiMoved()
	return nil
}

// apiMoved tells the running upgrade gates that the API moved (onAPIChange); called under mu.
func (k *Kubelet) apiMoved() {
	close(k.apiChanged)
	k.apiChanged = make(chan struct{})
}

// UseClients makes the driver manager and the upgrade gate the stand-in runs from now on on node talk to the API
// server through clientFor(DriverManagerRun, node) and clientFor(UncordonRun, node): clients with a user agent
// each, so that the API server's audit log tells their requests apart (in a cluster each runs in its own
// container). Each node's should have a connection of its own, as apiFor explains. nil goes back to the client
// UseAPI set.
func (k *Kubelet) UseClients(clientFor func(component, node string) kubernetes.Interface) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.perComponent = clientFor
	k.apiMoved()
}

// apiFor is what component (DriverManagerRun or UncordonRun) on node talks to now (see UseAPI and UseClients). By
// default each node's runs get a client of their own, with its own connection, as each driver pod's containers
// have in a cluster: one connection shared by a hundred nodes' watches would reach the API server's limit of
// concurrent HTTP/2 streams on a connection, past which client requests wait for a free stream.
func (k *Kubelet) apiFor(component, node string) kubernetes.Interface {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.perComponent != nil:
		return k.perComponent(component, node)
	case k.api != k.client: // UseAPI moved it
		return k.api
	}
	if c, ok := k.nodeClients[node]; ok {
		return c
	}
	c, err := nodeClient(k.kubeconfig)
	if err != nil {
		return k.api // the shared client, as before
	}
	if k.nodeClients == nil {
		k.nodeClients = map[string]kubernetes.Interface{}
	}
	k.nodeClients[node] = c
	return c
}

// nodeClient is a client of the kubeconfig with a transport of its own: a Dial of its own keeps client-go from
// sharing the cached transport (and its connection) of another client of the same config.
func nodeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cfg.QPS, cfg.Burst = 100, 200
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return kubernetes.NewForConfig(cfg)
}

// apiOf returns what the project's code talks to now (see UseAPI).
func (k *Kubelet) apiOf() (kubernetes.Interface, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.api, k.apiKubeconfig
}

// ValidatorReadies are the times node's validator pods were marked Ready, oldest first; each is taken just before
// the status write, so it is never later than the moment anything could see that pod Ready.
func (k *Kubelet) ValidatorReadies(node string) []time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]time.Time(nil), k.readies[node]...)
}

// ReadyAt is when node's validator pod was last marked Ready (zero: never).
func (k *Kubelet) ReadyAt(node string) time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.readyAt[node]
}

// InFlight reports how many runs of a hook component are in progress.
func (k *Kubelet) InFlight(component string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.inFlight[component]
}

// Runs returns the hook runs so far, oldest first.
func (k *Kubelet) Runs() []Run {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]Run(nil), k.runs...)
}

// ContainerLog is the output of the latest run of pod's container here, once it ended (cluster.ContainerLogs): the
// log `kubectl logs` and helm's hook logs read through the simulated node. The stand-in runs pods of one namespace
// per cluster (the release's), so a pod is known by its name.
func (k *Kubelet) ContainerLog(_, pod, container string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.runs) - 1; i >= 0; i-- {
		if r := k.runs[i]; r.Pod == pod && r.Container == container {
			return r.Output, true
		}
	}
	return "", false
}

// LastRun returns the newest run of component (a hook component, DriverManagerRun or UncordonRun) that started
// at or after since.
func (k *Kubelet) LastRun(component string, since time.Time) (Run, bool) {
	runs := k.Runs()
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].Component == component && !runs[i].Started.Before(since) {
			return runs[i], true
		}
	}
	return Run{}, false
}

// consider acts once on a bound, live pod.
func (k *Kubelet) consider(ctx context.Context, pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		if pod.Labels[ComponentLabel] == DriverComponent {
			k.mu.Lock()
			started := !k.terminating[pod.UID]
			k.terminating[pod.UID] = true
			k.mu.Unlock()
			if started {
				go k.terminateDriver(ctx, pod)
			}
			return
		}
		k.stop(pod.UID)
		if !isValidator(pod) && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			go k.killed(ctx, pod)
		}
		return
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	k.mu.Lock()
	seen := k.handled[pod.UID]
	k.handled[pod.UID] = true
	k.mu.Unlock()
	if seen {
		return
	}
	if pod.Labels[ComponentLabel] == DriverComponent {
		podCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		k.mu.Lock()
		k.stops[pod.UID] = cancel
		k.driverDone[pod.UID] = done
		k.mu.Unlock()
		go func() {
			defer close(done)
			k.runDriver(podCtx, pod)
		}()
		return
	}
	if isValidator(pod) {
		if c, m := k.healthAgent(pod); c != nil {
			podCtx, cancel := context.WithCancel(ctx)
			k.mu.Lock()
			k.stops[pod.UID] = cancel
			k.mu.Unlock()
			go k.runHealth(podCtx, pod, c, m)
		}
		go k.validate(ctx, pod)
		return
	}
	podCtx, cancel := context.WithCancel(ctx)
	k.mu.Lock()
	k.stops[pod.UID] = cancel
	k.mu.Unlock()
	go k.runHook(podCtx, pod)
}

// killed ends a deleted hook pod that had not ended as a kubelet does once it killed the containers: phase Failed,
// its container terminated by the kill (137), and the conditions others wrote kept (DisruptionTarget, written by an
// eviction, the taint manager or the pod garbage collector, is what a Job's podFailurePolicy reads). A Job whose
// pod never reaches a terminal phase would wait for it for good.
func (k *Kubelet) killed(ctx context.Context, pod *corev1.Pod) {
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cur, err := k.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, nil
		}
		if cur.UID != pod.UID || cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed {
			return true, nil
		}
		st := terminated(cur, 137)
		for _, c := range cur.Status.Conditions {
			if c.Type == corev1.DisruptionTarget {
				st.Conditions = append(st.Conditions, c)
			}
		}
		cur.Status = st
		_, err = k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err == nil || apierrors.IsNotFound(err), nil
	})
}

// runHook runs the hook container's command in-process, as the container would, and ends the pod with its exit code.
func (k *Kubelet) runHook(ctx context.Context, pod *corev1.Pod) {
	c := pod.Spec.Containers[0]
	args := append(append([]string{}, c.Command...), c.Args...)
	if len(args) > 0 && strings.HasSuffix(args[0], "kube-gpu-stack") {
		args = args[1:]
	}
	run := Run{Pod: pod.Name, Component: pod.Labels[ComponentLabel], Node: pod.Spec.NodeName, Container: c.Name, Args: args, Started: time.Now()}
	k.mu.Lock()
	k.inFlight[run.Component]++
	k.mu.Unlock()
	k.setStatus(ctx, pod, running(pod, true, nil))
	var out bytes.Buffer
	_, kubeconfig := k.apiOf()
	argv := append(append([]string{}, args...), "--kubeconfig", kubeconfig)
	for _, e := range c.Env {
		switch e.Name { // the container reads them from its environment; in-process they are flags
		case "DRIVER_POOLS":
			argv = append(argv, "--driver-pools", e.Value)
		case "VGPU_MANAGER_POOLS":
			argv = append(argv, "--vgpu-manager-pools", e.Value)
		}
	}
	cmd, scope := stackcli.NewRoot(&out)
	if skew := k.clockSkew(); skew != 0 {
		*scope.Now = func() time.Time { return time.Now().Add(skew) } // the hook pod's node's clock
	}
	// the command's client gets the pace of the stand-in's others (the driver manager's, the validators', envtest's
	// 1000 requests/s), not client-go's default 5/s: cleaning 28 nodes took 10 s of that pace alone
	scope.Flags.WrapConfigFn = func(c *rest.Config) *rest.Config { c.QPS, c.Burst = 1000, 2000; return c }
	cmd.SetArgs(argv)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(ctx)
	run.Ended = time.Now()
	if err != nil {
		run.ExitCode = 1
		fmt.Fprintln(&out, "kube-gpu-stack:", err)
	}
	run.Output = out.String()
	k.mu.Lock()
	k.runs = append(k.runs, run)
	k.inFlight[run.Component]--
	k.mu.Unlock()
	k.setStatus(ctx, pod, terminated(pod, run.ExitCode))
}

// validate plays the validator pod: each init container's check reports the outcome the test set for this node
// (ready by default) on the node, as the real check does; the pod turns Ready only when all passed, and otherwise
// stays in the first failing or waiting init container.
func (k *Kubelet) validate(ctx context.Context, pod *corev1.Pod) {
	// one run per pod at a time, each reading the outcomes when it starts: the last run writes the latest
	k.mu.Lock()
	one := k.validating[pod.UID]
	if one == nil {
		one = &sync.Mutex{}
		k.validating[pod.UID] = one
	}
	k.mu.Unlock()
	one.Lock()
	defer one.Unlock()
	k.mu.Lock()
	outcomes := map[string]nodestate.Validation{}
	for c, v := range k.outcomes[pod.Spec.NodeName] {
		outcomes[c] = v
	}
	k.mu.Unlock()
	stuck := -1
	var stuckAt nodestate.Validation
	for i, c := range pod.Spec.InitContainers {
		if len(c.Command) < 2 || c.Command[0] != "validator" {
			continue
		}
		check := c.Command[1]
		v, ok := outcomes[check]
		if !ok {
			v = nodestate.Validation{State: nodestate.CheckReady}
			if check == "driver" {
				if waiting, wait := k.driverCheckOutcome(pod.Spec.NodeName); wait {
					v = waiting
				}
			}
		}
		if stuck >= 0 {
			break // later checks have not run yet
		}
		if _, err := nodestate.Apply(ctx, k.client, pod.Spec.NodeName, nodestate.SetValidation(check, v)); err != nil {
			return
		}
		if !v.Passed() {
			stuck, stuckAt = i, v
		}
	}
	if stuck < 0 {
		k.mu.Lock()
		k.readies[pod.Spec.NodeName] = append(k.readies[pod.Spec.NodeName], time.Now())
		k.mu.Unlock()
		k.setStatus(ctx, pod, running(pod, true, nil))
		k.mu.Lock()
		k.readyAt[pod.Spec.NodeName] = time.Now()
		k.mu.Unlock()
		return
	}
	reason := "CrashLoopBackOff"
	if stuckAt.State == nodestate.CheckWaiting {
		reason = ""
	}
	k.setStatus(ctx, pod, running(pod, false, &initStuck{stuck, reason, stuckAt.String()}))
}

type initStuck struct {
	index           int
	reason, message string
}

// setStatus writes pod's status as a kubelet's status manager does: it retries until the write lands, the pod is
// gone, a newer status for the pod is asked for, or ctx ends. A write given up on early would leave the pod in its
// last status for good (no kubelet syncs it again): a driver pod un-Ready after an API server outage, say.
func (k *Kubelet) setStatus(ctx context.Context, pod *corev1.Pod, st corev1.PodStatus) {
	k.mu.Lock()
	k.statuses[pod.UID]++
	mine := k.statuses[pod.UID]
	k.mu.Unlock()
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		k.mu.Lock()
		superseded := k.statuses[pod.UID] != mine
		k.mu.Unlock()
		if superseded {
			return true, nil
		}
		cur, err := k.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, nil
		}
		if cur.UID != pod.UID || cur.DeletionTimestamp != nil {
			return true, nil
		}
		cur.Status = st
		_, err = k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err == nil, nil
	})
}

// MarkUnready writes a live pod's status as running but not Ready, as the kubelet does when a container's readiness
// fails (a driver container that crashed, say); a later status of the pod's own supersedes it.
func (k *Kubelet) MarkUnready(ctx context.Context, namespace, name string) error {
	pod, err := k.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	k.setStatus(ctx, pod, running(pod, false, nil))
	return ctx.Err()
}

func condition(t corev1.PodConditionType, ok bool) corev1.PodCondition {
	s := corev1.ConditionFalse
	if ok {
		s = corev1.ConditionTrue
	}
	return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()}
}

// running is a Running pod: ready, or held in an init container.
func running(pod *corev1.Pod, ready bool, stuck *initStuck) corev1.PodStatus {
	now := metav1.Now()
	st := corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &now, HostIP: "127.0.0.1", PodIP: "127.0.0.1"}
	for i, c := range pod.Spec.InitContainers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image}
		switch {
		case (stuck == nil || i < stuck.index) && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways:
			started := true // a native sidecar runs for the pod's life
			cs.State.Running, cs.Started, cs.Ready = &corev1.ContainerStateRunning{StartedAt: now}, &started, true
		case stuck == nil || i < stuck.index:
			cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}
			cs.Ready = true
		case i == stuck.index && stuck.reason != "":
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: stuck.reason, Message: stuck.message}
			cs.RestartCount = 1
		case i == stuck.index:
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "PodInitializing"}
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: ready}
		if stuck == nil {
			started := true
			cs.Started = &started
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
		} else {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "PodInitializing"}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	st.Conditions = []corev1.PodCondition{condition(corev1.PodScheduled, true), condition(corev1.PodInitialized, stuck == nil),
		condition(corev1.ContainersReady, ready), condition(corev1.PodReady, ready)}
	return st
}

// terminated is a run-to-completion pod that ended with code.
func terminated(pod *corev1.Pod, code int) corev1.PodStatus {
	now := metav1.Now()
	phase, reason := corev1.PodSucceeded, "Completed"
	if code != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	st := corev1.PodStatus{Phase: phase, StartTime: &now, HostIP: "127.0.0.1", PodIP: "127.0.0.1"}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, StartedAt: now, FinishedAt: now}}})
	}
	st.Conditions = []corev1.PodCondition{condition(corev1.PodScheduled, true), condition(corev1.PodInitialized, true),
		condition(corev1.ContainersReady, false), condition(corev1.PodReady, false)}
	return st
}
