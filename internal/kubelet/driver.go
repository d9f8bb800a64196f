package kubelet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanagercli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// DriverComponent is the driver DaemonSets' component.
const DriverComponent = "driver"

// DriverManagerRun is the Run.Component of a driver pod's driver-manager init container run, UncordonRun of its
// driver-upgrade-gate sidecar, and DriverInstallRun of its driver container's install (from its start to the
// driver loaded; none when the container keeps a loaded driver).
const (
	DriverManagerRun = "driver-manager"
	UncordonRun      = "driver-upgrade-gate"
	DriverInstallRun = "driver-install"
)

// DriverHost is a simulated node's host, for its driver pods. Without one a driver pod is simply made Ready (what
// kwok does); with one the stand-in plays the kubelet for the pod's containers:
//
//   - the driver-manager init container: the real driver manager, configured from the container's environment as
//     the binary is, against Fixture (a fake kernel on a fixture host tree); a failed run restarts after a short
//     back-off, as the kubelet restarts a failed init container, until the pod goes;
//   - the driver container: loads a driver into Fixture when none is loaded (taking Install to do it), recording
//     the pod's DRIVER_CONFIG_DIGEST, as the containerized driver does;
//   - the driver-upgrade-gate sidecar: the real `uncordon-when-valid`, from the container's arguments; the pod
//     turns Ready when it has written its ready file (the sidecar's startup probe); a failed run restarts
//     after a short back-off, as the kubelet restarts the container.
type DriverHost struct {
	Fixture *kmodtest.Fixture
	// Kill, when set, is the driver manager's AfterStep on this node: an error kills the init container right
	// after that step, leaving what a kill leaves; it then restarts.
	Kill func(step string) error
	// Stop, when set, is also asked after each of the driver manager's steps on this node: true stops the driver pod
	// there as a pod deletion does (a rollout, a second `helm upgrade`, a drain): the pod is deleted with its grace
	// period and the manager's context ends (its SIGTERM) before the step returns. The DaemonSet's next pod resumes.
	Stop func(step string) bool
	// Install is how long the driver container takes to build and load the driver when it installs one (0: at
	// once), so that a rollout's time can be told apart from the install's.
	Install time.Duration
}

// labelAllocation writes the driver pod's GPU_ALLOCATION on its node as the driver manager does on a node without
// the label (nodestate.SetAllocation, recorded so the pre-delete cleanup removes it); a labelled node is left as it is.
func (k *Kubelet) labelAllocation(ctx context.Context, pod *corev1.Pod) error {
	manager := containerWith(pod.Spec.InitContainers, "driver-manager")
	if manager == nil {
		return nil
	}
	mode := envOf(pod, manager)("GPU_ALLOCATION")
	if mode == "" {
		return nil
	}
	_, err := nodestate.Update(ctx, k.client, pod.Spec.NodeName, func(n *corev1.Node) (nodestate.Patch, error) {
		if n.Labels[nodestate.AllocationLabel] != "" {
			return nodestate.Patch{}, nil
		}
		return nodestate.SetAllocation(n, mode)
	})
	return err
}

// SetDriverFault makes every driver whose image tag starts with tag fail the validator's driver check with reason
// on any node where the driver container loaded it (a driver that installs but never validates); an empty reason
// clears it. The validators of the nodes running such a driver re-run their checks at once, as a crash-looping
// validator retries.
func (k *Kubelet) SetDriverFault(tag, reason string) {
	k.mu.Lock()
	if reason == "" {
		delete(k.faults, tag)
	} else {
		k.faults[tag] = reason
	}
	var nodes []string
	for node, image := range k.loaded {
		if strings.HasPrefix(imageTag(image), tag) {
			nodes = append(nodes, node)
		}
	}
	k.mu.Unlock()
	for _, n := range nodes {
		k.poke(n)
	}
}

// SetDriverFaultOn is SetDriverFault for one node and one tag as the chart names it (the image's tag, or it followed
// by -<OS>): the driver with that tag fails its validation there only (a driver that does not work on one node's
// hardware); an empty reason clears it.
func (k *Kubelet) SetDriverFaultOn(node, tag, reason string) {
	k.mu.Lock()
	if reason == "" {
		delete(k.nodeFaults, node+"/"+tag)
	} else {
		k.nodeFaults[node+"/"+tag] = reason
	}
	k.mu.Unlock()
	k.poke(node)
}

// imageTag is the tag of an image reference ("" without one).
func imageTag(image string) string {
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}
	return ""
}

// SetDriverHost gives node a host; driver pods bound there from now on run against it.
func (k *Kubelet) SetDriverHost(node string, h DriverHost) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hosts[node] = &h
}

// driverLoaded reports whether the node's host has a driver loaded (true for a node without a host: nothing to
// wait for).
func (k *Kubelet) driverLoaded(node string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.hosts[node]
	return h == nil || len(h.Fixture.LoadedModules()) > 0
}

func (k *Kubelet) record(run Run) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.runs = append(k.runs, run)
}

// runDriver plays a driver pod; ctx ends when the pod is deleted.
func (k *Kubelet) runDriver(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	h := k.hosts[pod.Spec.NodeName]
	k.mu.Unlock()
	if h == nil {
		// without a host the driver manager does not run; what it leaves on a node new to the stack is played: the
		// pool's allocation mode, which places the device plugin or the DRA kubelet plugin
		if err := k.labelAllocation(ctx, pod); err != nil {
			k.setStatus(ctx, pod, running(pod, false, &initStuck{0, "CrashLoopBackOff", err.Error()}))
			return
		}
		k.setStatus(ctx, pod, running(pod, true, nil))
		return
	}
	manager, gate := containerWith(pod.Spec.InitContainers, "driver-manager"), containerWith(pod.Spec.Containers, "driver-manager")
	if manager == nil || gate == nil {
		k.setStatus(ctx, pod, running(pod, false, &initStuck{0, "CrashLoopBackOff", "no driver-manager init container or upgrade gate sidecar in the pod"}))
		return
	}
	initIndex := 0
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == manager.Name {
			initIndex = i
		}
	}
	getenv := envOf(pod, manager)
	for restarts := 0; ; restarts++ {
		err := k.runManager(ctx, pod, h, getenv)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		k.setStatus(ctx, pod, withRestarts(running(pod, false, &initStuck{initIndex, "CrashLoopBackOff", err.Error()}), manager.Name, restarts+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(time.Duration(restarts+1)*500*time.Millisecond, 3*time.Second)):
		}
	}

	// the driver container: a driver is loaded unless the manager kept the old one (fast path). As nvidia-driver
	// does, it keeps loaded modules only when the host's state file records its DRIVER_CONFIG_DIGEST; otherwise it
	// unloads them first, which fails while GPU pods hold them ("driver is in use"): the container crash-loops.
	k.mu.Lock()
	if recorded, _, _ := h.Fixture.Host().RecordedDigest(); len(h.Fixture.LoadedModules()) > 0 && recorded != getenv("DRIVER_CONFIG_DIGEST") {
		k.mu.Unlock()
		k.setStatus(ctx, pod, running(pod, false, &initStuck{0, "CrashLoopBackOff",
			"nvidia-driver: the loaded driver records config " + recorded + ", not this pod's: Could not unload NVIDIA driver kernel modules, driver is in use"}))
		return
	}
	install := len(h.Fixture.LoadedModules()) == 0
	k.mu.Unlock()
	if install {
		if h.Install > 0 {
			// the container runs, un-Ready, while it builds and loads the driver
			k.setStatus(ctx, pod, running(pod, false, nil))
		}
		started := time.Now()
		if h.Install > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(h.Install):
			}
		}
		k.mu.Lock()
		if len(h.Fixture.LoadedModules()) == 0 {
			h.Fixture.LoadDriver()
			h.Fixture.DriverState(getenv("DRIVER_CONFIG_DIGEST"))
			h.Fixture.PidFile()
			h.Fixture.MountDriverRoot()
			k.loaded[pod.Spec.NodeName] = pod.Spec.Containers[0].Image
		}
		k.runs = append(k.runs, Run{Pod: pod.Name, Component: DriverInstallRun, Node: pod.Spec.NodeName, Started: started, Ended: time.Now()})
		k.mu.Unlock()
	}
	k.poke(pod.Spec.NodeName)
	if !install || h.Install == 0 {
		k.setStatus(ctx, pod, running(pod, false, nil))
	}

	// from here on the driver container runs: its stop is the upstream driver's shutdown (DriverStops)
	k.mu.Lock()
	k.driverRunning[pod.UID] = true
	k.mu.Unlock()

	// the sidecar, as its container runs it: the pod turns Ready once it wrote its ready file (its startup probe),
	// and with --replace-outdated it goes on as the node's agent until the pod goes; a failed run restarts after a
	// short back-off, as the kubelet restarts a pod's failed container, until the pod goes
	for restarts := 0; ; restarts++ {
		// the gate keeps running as the node's agent: when the test points the project's code at another API
		// (UseAPI, UseClients) it is restarted to talk through it, as a container's client never changes
		gctx, stopGate := context.WithCancel(ctx)
		redial := k.onAPIChange(stopGate)
		err := k.runGate(gctx, pod, gate)
		redial()
		stopGate()
		switch {
		case ctx.Err() != nil:
			return
		case gctx.Err() != nil:
			continue
		case err == nil:
			k.setStatus(ctx, pod, running(pod, true, nil))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(time.Duration(restarts+1)*500*time.Millisecond, 3*time.Second)):
		}
	}
}

// terminateDriver stops a deleted driver pod as a kubelet does: SIGTERM to its containers (their context ends); the
// driver container's preStop holds its stop until the upgrade gate, stopping too, has let it go (the gate's Run
// returned: it empties the node first when another driver pod takes the node over), within the pod's grace
// period; then the driver's stop (recorded) and the pod's removal.
func (k *Kubelet) terminateDriver(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	done := k.driverDone[pod.UID]
	k.mu.Unlock()
	k.stop(pod.UID)
	if done != nil {
		grace := 30 * time.Second
		if s := pod.DeletionGracePeriodSeconds; s != nil {
			grace = time.Duration(*s) * time.Second
		}
		select {
		case <-done:
		case <-time.After(grace):
		case <-ctx.Done():
			return
		}
	}
	k.recordDriverStop(ctx, pod, false)
	now := int64(0)
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &now,
		Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
		slog.Warn("kubelet stand-in: remove a stopped driver pod", "pod", pod.Name, "err", err)
	}
	k.mu.Lock()
	delete(k.driverDone, pod.UID)
	k.mu.Unlock()
}

// DriverStop is the moment a driver container got its stop (its pod deleted while the driver container ran): the
// upstream driver's shutdown then stops nvidia-persistenced and the fabric manager, whatever uses the GPUs.
// GPUPods are the GPU pods (gpupods.RequestsGPU) still on the node then, namespace/name: each one lost those
// daemons under it.
type DriverStop struct {
	Pod, Node string
	At        time.Time
	GPUPods   []string
	// Forced: the pod was deleted with no grace period (the pod garbage collector's delete of a gone Node's pods,
	// or a forced delete by hand), so its driver stopped at once: no preStop holds it, nothing could empty the
	// node first.
	Forced bool
}

// DriverStops are the driver containers' stops so far, oldest first.
func (k *Kubelet) DriverStops() []DriverStop {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]DriverStop(nil), k.driverStops...)
}

// recordDriverStop records a deleted driver pod's stop when its driver container ran, with the GPU pods the API
// server still has on its node at that moment.
func (k *Kubelet) recordDriverStop(ctx context.Context, pod *corev1.Pod, forced bool) {
	k.mu.Lock()
	ran := k.driverRunning[pod.UID]
	delete(k.driverRunning, pod.UID)
	k.mu.Unlock()
	if !ran {
		return
	}
	stop := DriverStop{Pod: pod.Name, Node: pod.Spec.NodeName, At: time.Now(), Forced: forced}
	pods, err := k.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + pod.Spec.NodeName})
	if err != nil {
		stop.GPUPods = []string{"(the node's pods could not be listed: " + err.Error() + ")"}
	}
	if pods != nil {
		for i := range pods.Items {
			p := &pods.Items[i]
			if gpupods.RequestsGPU(p) && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				stop.GPUPods = append(stop.GPUPods, p.Namespace+"/"+p.Name)
			}
		}
	}
	k.mu.Lock()
	k.driverStops = append(k.driverStops, stop)
	k.mu.Unlock()
}

// runGate runs the upgrade gate sidecar once.
func (k *Kubelet) runGate(ctx context.Context, pod *corev1.Pod, gate *corev1.Container) error {
	o, err := drivermanagercli.UncordonOptionsFromArgs(gate.Args, envOf(pod, gate))
	run := Run{Pod: pod.Name, Component: UncordonRun, Node: pod.Spec.NodeName, Args: gate.Args, Started: time.Now()}
	var out syncbuffer.Buffer
	log, closeLog := runLog(&out, run)
	defer closeLog()
	if err == nil {
		dir, derr := os.MkdirTemp("", "upgrade-gate-")
		if derr != nil {
			err = derr
		} else {
			defer os.RemoveAll(dir)
			o.Client, o.Hold, o.ReadyFile = k.apiFor(UncordonRun, pod.Spec.NodeName), false, filepath.Join(dir, filepath.Base(o.ReadyFile))
			if o.StopFile != "" {
				o.StopFile = filepath.Join(dir, filepath.Base(o.StopFile))
			}
			o.Log = slog.New(slog.NewTextHandler(log, nil))
			o.Complete()
			if err = o.Validate(); err == nil {
				// the startup probe: Ready once the ready file is there, while the gate goes on as the agent
				pctx, stopProbe := context.WithCancel(ctx)
				go k.probeReady(pctx, pod, o.ReadyFile)
				err = o.Run(ctx, log)
				stopProbe()
			}
		}
	}
	run.Ended, run.Output = time.Now(), out.String()
	if err != nil {
		run.ExitCode = 1
		fmt.Fprintln(&out, "driver-manager:", err)
		run.Output = out.String()
	}
	k.record(run)
	return err
}

// onAPIChange calls f once the project's code is pointed at another API; the returned func stops that.
func (k *Kubelet) onAPIChange(f func()) (stop func()) {
	k.mu.Lock()
	changed := k.apiChanged
	k.mu.Unlock()
	done := make(chan struct{})
	go func() {
		select {
		case <-changed:
			f()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// probeReady marks the driver pod Ready once file exists, as the gate's startup probe does.
func (k *Kubelet) probeReady(ctx context.Context, pod *corev1.Pod, file string) {
	_ = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := os.Stat(file)
		return err == nil, nil
	})
	if ctx.Err() == nil {
		k.setStatus(ctx, pod, running(pod, true, nil))
	}
}

// runManager runs the init container once.
func (k *Kubelet) runManager(ctx context.Context, pod *corev1.Pod, h *DriverHost, getenv func(string) string) error {
	run := Run{Pod: pod.Name, Component: DriverManagerRun, Node: pod.Spec.NodeName, Args: []string{"uninstall-driver"}, Started: time.Now()}
	var out syncbuffer.Buffer
	log, closeLog := runLog(&out, run)
	defer closeLog()
	o, err := drivermanagercli.OptionsFromEnv(getenv)
	if err == nil {
		o.Client, o.Host, o.AfterStep = k.apiFor(DriverManagerRun, pod.Spec.NodeName), h.Fixture.Host(), k.afterStep(ctx, pod, h)
		o.Log = slog.New(slog.NewTextHandler(log, nil))
		o.Complete()
		if err = o.Validate(); err == nil {
			err = o.Run(ctx, log)
		}
	}
	run.Ended = time.Now()
	if err != nil {
		run.ExitCode = 1
		fmt.Fprintln(&out, "driver-manager:", err)
	}
	run.Output = out.String()
	k.record(run)
	return err
}

// afterStep is the driver manager's AfterStep on a host: Kill, then Stop.
func (k *Kubelet) afterStep(ctx context.Context, pod *corev1.Pod, h *DriverHost) func(string) error {
	if h.Kill == nil && h.Stop == nil {
		return nil
	}
	return func(step string) error {
		if h.Kill != nil {
			if err := h.Kill(step); err != nil {
				return err
			}
		}
		if h.Stop == nil || !h.Stop(step) {
			return nil
		}
		// ctx ends when the stand-in sees the pod's deletion, as the container gets SIGTERM
		if err := k.client.CoreV1().Pods(pod.Namespace).Delete(context.WithoutCancel(ctx), pod.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("stop driver pod %s after %s: %w", pod.Name, step, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Minute): // the stand-in sees the deletion late on a loaded machine
			return fmt.Errorf("driver pod %s deleted after %s, but its stop never came", pod.Name, step)
		}
		return nil
	}
}

// containerWith returns the first container whose command starts with binary.
func containerWith(cs []corev1.Container, binary string) *corev1.Container {
	for i := range cs {
		if len(cs[i].Command) > 0 && cs[i].Command[0] == binary {
			return &cs[i]
		}
	}
	return nil
}

// envOf resolves a container's environment as the kubelet does for the values and field references the chart uses.
func envOf(pod *corev1.Pod, c *corev1.Container) func(string) string {
	vals := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vals[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "spec.nodeName":
				vals[e.Name] = pod.Spec.NodeName
			case "metadata.namespace":
				vals[e.Name] = pod.Namespace
			case "metadata.name":
				vals[e.Name] = pod.Name
			case "status.hostIP":
				vals[e.Name] = "127.0.0.1"
			}
		}
	}
	return func(name string) string { return vals[name] }
}

// withRestarts sets a container's restart count in a status.
func withRestarts(st corev1.PodStatus, container string, n int) corev1.PodStatus {
	for i := range st.InitContainerStatuses {
		if st.InitContainerStatuses[i].Name == container {
			st.InitContainerStatuses[i].RestartCount = int32(n)
		}
	}
	return st
}

// driverCheckOutcome is the validator's driver check on a node with a host: waiting until a driver is loaded, then
// failed while the loaded driver's image has a fault (SetDriverFault).
func (k *Kubelet) driverCheckOutcome(node string) (nodestate.Validation, bool) {
	if !k.driverLoaded(node) {
		return nodestate.Validation{State: nodestate.CheckWaiting, Reason: "no NVIDIA driver loaded yet"}, true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	tag := imageTag(k.loaded[node])
	for key, reason := range k.nodeFaults {
		// the tag as the chart names it: the driver image's carries the OS after a dash
		if n, t, _ := strings.Cut(key, "/"); n == node && tag != "" && (tag == t || strings.HasPrefix(tag, t+"-")) {
			return nodestate.Validation{State: nodestate.CheckFailed, Reason: reason}, true
		}
	}
	for prefix, reason := range k.faults {
		if tag != "" && strings.HasPrefix(tag, prefix) {
			return nodestate.Validation{State: nodestate.CheckFailed, Reason: reason}, true
		}
	}
	return nodestate.Validation{}, false
}

// RunLogDirEnv names a directory that every driver-manager and gate run also streams its output to, one file per
// pod and component, as it runs: a run's Output is recorded only once it ends, and a gate runs as long as its pod.
const RunLogDirEnv = "KUBE_GPU_STACK_RUN_LOGS"

// runLog is where a run writes: out, and with RunLogDirEnv set a file of the run's as well (an *os.File takes
// concurrent writes, as out does).
func runLog(out *syncbuffer.Buffer, run Run) (io.Writer, func()) {
	dir := os.Getenv(RunLogDirEnv)
	if dir == "" {
		return out, func() {}
	}
	f, err := os.OpenFile(filepath.Join(dir, run.Node+"_"+run.Pod+"_"+run.Component+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return out, func() {}
	}
	return io.MultiWriter(out, f), func() { f.Close() }
}
