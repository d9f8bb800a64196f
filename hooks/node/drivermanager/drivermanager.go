// Package drivermanager is the node-local work before a driver pod (re)installs the NVIDIA driver: the init
// container `driver-manager uninstall-driver` of every driver and vGPU-manager pod.
//
// One run holds the node's Lease (lease.go: two driver pods on one node take turns) and walks these steps, writing
// nodestate.UpgradeStateLabel as it goes:
//
//	detect        host driver (no driver-pod files, and a host nvidia-smi that runs: hostdriver) -> mark
//	              pre-installed, hold, fail
//	              (the driver container never starts; the DaemonSet lets go of the node)
//	              modules loaded, DRIVER_CONFIG_DIGEST = recorded digest  -> fast path: keep the driver; a node
//	              that is not upgrade-done (failed, retried, interrupted) validates it first
//	              modules loaded by another installer (the GPU Operator's driver container: no digest of ours
//	              recorded) that are exactly what this pod installs (DriverVersion, KernelModuleType)
//	                                                                       -> adopt: record our digest, keep the
//	              driver, evict nothing, validation-required (the validator vouches for it); otherwise the change
//	              path below
//	              no modules loaded                                        -> clear stale files, validation-required
//	              (our cordon kept: a reboot of a failed node validates the driver that installs next)
//	              node labelled nvidia.com/gpu-driver-upgrade.skip=true   -> keep the driver, wait for the label to go
//	              node upgrade-failed                                     -> refuse until `upgrade retry`
//	              planned node, not its pool's canary (canary.go)          -> wait before the cordon, untouched,
//	              until the canary validated; a pool at its failure threshold holds. The wait holds no Lease
//	              (watches only); a fresh run under the Lease starts over once the turn comes
//	claim         a planned node takes one of its pool's slots (package slots: the mark's maxUnavailable); a full
//	              pool holds it, untouched, as the canary does, until a node gives its slot back (the gate, at
//	              upgrade-done); a failed node keeps its slot
//	cordon        cordon-required -> cordon (recorded as ours) + operand switches paused -> pod-deletion-required
//	evict         GPU pods through the Eviction API (PDB-aware, watched); on failure with auto-drain:
//	              drain-required -> drain the node; meanwhile, watch until the paused operands' pods are gone
//	pause         pod-restart-required
//	              then, on a node whose DRA kubelet plugin runs (Options.DRAPlugin), no pod may still hold a
//	              gpu.nvidia.com claim (the eviction moved them; one left fails the run with the plugin untouched);
//	              the plugin's switch is paused, last, and its pod watched until gone
//	unload        check every module (use counts, holders, processes with /dev/nvidia* open) first: one in use
//	              removes none and names the pod or process in the way (with auto-drain: drain once, retry);
//	              then delete_module in dependency order, and a removal that still fails loads back what was
//	              removed (modprobe)
//	unmount       the stale driver root, recursively; the stale pid file
//	prepare       unload nouveau; release NVIDIA functions left on vfio-pci; with GPUDirect RDMA and a Mellanox
//	              device, wait (bounded) for MOFED. A node with no driver loaded also goes through this
//	restore       switches resumed -> validation-required; our cordon stays until UncordonOptions sees the
//	              node's validator Ready with the new driver -> uncordon-required -> upgrade-done
//
// Only the gate ends a driver change: every path that hands a node a driver it has not validated leaves it
// validation-required, and nodestate.DriverSinceAnnotation says since when a Ready validator vouches for it.
//
// Every step is idempotent and reads the node and the host afresh, so a run killed anywhere converges when the
// pod restarts. Every node write is computed from a fresh read and carries its resourceVersion (nodestate.Update),
// so a change an admin makes meanwhile (a gpu.deploy switch set to false during the eviction) is seen and kept;
// an API error that may pass (etcd timing out, the API server restarting) is retried within APITimeout. A run
// whose pod is stopping (Run's context ends: SIGTERM on a pod deletion, a rollout, a node drain) is no failure: it
// stops where it is and leaves the node as it got it there (cordon, pause record, state), for the next driver pod
// to resume. A failing run resumes what it paused, lifts the cordon it made, and leaves the node upgrade-failed
// with the reason in nodestate.UpgradeReasonAnnotation; on a node left without a working driver (unloaded, or an
// unload that could not load back what it removed) the cordon stays.
package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpudrain"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
)

// Defaults.
const (
	// DefaultOperandTimeout bounds the wait for paused operands' pods to leave the node.
	DefaultOperandTimeout = 5 * time.Minute
	// ComponentLabel carries the operand name on every operand pod.
	ComponentLabel = "app.kubernetes.io/component"
	// cordonReason is the value of nodestate.CordonedAnnotation the manager writes.
	cordonReason = "driver-upgrade"
	// maxReason keeps the reason annotation readable.
	maxReason = 1024
)

// Eviction configures evicting the node's GPU pods (ENABLE_GPU_POD_EVICTION, EVICTION_*).
type Eviction struct {
	Enabled            bool
	Force              bool
	DeleteEmptyDirData bool
	// Timeout bounds the eviction (0: gpudrain.DefaultTimeout).
	Timeout time.Duration
}

// Drain configures the fallback full drain (ENABLE_AUTO_DRAIN, DRAIN_*).
type Drain struct {
	Enabled            bool
	Force              bool
	DeleteEmptyDirData bool
	PodSelector        string
	// Timeout bounds the drain (0: gpudrain.DefaultTimeout).
	Timeout time.Duration
}

// Options configure one run of the driver manager on one node.
type Options struct {
	// Stopping: the run empties the node of a driver pod being deleted (stopguard.go), whose driver stops whatever a
	// plan says: a plan that calls the node off meanwhile (it judges the node by the next pod) gives it no turn.
	Stopping bool
	// PoolDaemonSet, when set, is the DaemonSet whose other nodes carry this node's pool's plan (poolmark.go), in
	// place of its driver pod's own: a driver pod deleted after its node moved to another pool is emptied under the
	// pool whose DaemonSet takes the node over.
	PoolDaemonSet *appsv1.DaemonSet
	// Client talks to the API server.
	Client kubernetes.Interface
	// NodeName is this node (NODE_NAME).
	NodeName string
	// Namespace is where the operand pods run (OPERATOR_NAMESPACE).
	Namespace string
	// Host is the node's filesystem and kernel.
	Host kmod.Host
	// Digest is the DRIVER_CONFIG_DIGEST of the driver about to start; equal to the loaded driver's, the loaded
	// driver is kept.
	Digest string
	// ForceReinstall unloads the driver even when the digests match (FORCE_REINSTALL).
	ForceReinstall bool
	// Eviction and Drain say how the node's workloads are moved off.
	Eviction Eviction
	Drain    Drain
	// OperandTimeout bounds the wait for paused operands' pods to go (default DefaultOperandTimeout).
	OperandTimeout time.Duration
	// Log receives progress; nil logs to Run's writer.
	Log *slog.Logger
	// Now is the clock for nodestate.UpgradeSinceAnnotation (default time.Now).
	Now func() time.Time
	// AfterStep, when set, is called after each of Steps (and AdoptStep, adopt.go); an error stops the run at once
	// and is returned as is, with nothing restored — what a kill at that point leaves (for tests and harnesses
	// proving convergence).
	AfterStep func(step string) error
	// SkipWait bounds the wait on a node labelled nodestate.UpgradeSkipLabel=true (0: until the label goes or the
	// run's context ends).
	SkipWait time.Duration
	// GPUDirectRDMA (GPU_DIRECT_RDMA_ENABLED) makes the run wait for the Mellanox OFED driver before the NVIDIA
	// driver installs, when the node has a Mellanox device; HostMOFED (USE_HOST_MOFED) says MOFED is the host's.
	GPUDirectRDMA, HostMOFED bool
	// MOFEDTimeout bounds that wait (default DefaultMOFEDTimeout); MOFEDInterval is its poll (default 5s).
	MOFEDTimeout, MOFEDInterval time.Duration
	// Lease is the node's Lease the run holds, so that two managers on one node take turns (lease.go).
	Lease Lease
	// HostDriverHold is how long the run holds a driver pod on a host-driver node before it fails, so the pod
	// does not restart in a tight loop while its DaemonSet lets go of the node (default DefaultHostDriverHold).
	HostDriverHold time.Duration
	// DRAPlugin is the operand of the DRA kubelet plugin (DRA_PLUGIN_OPERAND, "dra-driver" on the chart's DRA
	// pools): its switch nodestate.DeployLabelPrefix+DRAPlugin, its pods labelled ComponentLabel=DRAPlugin. On a
	// node where one of its pods runs (or its switch is already paused by us) it is paused last, once no pod holds
	// a gpu.nvidia.com claim. Empty: no DRA plugin is paused.
	DRAPlugin string
	// Allocation is how the pool's nodes hand GPUs to pods after this run (GPU_ALLOCATION: device-plugin or dra),
	// written as nodestate.AllocationLabel, which places the device plugin and the DRA kubelet plugin. A node
	// labelled the other way switches through the driver change path (its GPU pods evicted, both plugins paused,
	// the driver reloaded) even when the driver config is unchanged. Empty: the label is left alone.
	Allocation string
	// DriverVersion (DRIVER_VERSION) and KernelModuleType (KERNEL_MODULE_TYPE: open, proprietary or auto) are what
	// the driver container of this pod installs. With both, a driver loaded by another installer is adopted when
	// it is that version and flavour (adopt.go); without them it never is.
	DriverVersion, KernelModuleType string
	// SlotRecheck is how long a node held by a full pool waits on the pool's slots Lease alone before it tries to
	// take a slot again however full the Lease shows the pool, so that a holder whose give-back was lost (or whose
	// manager stopped between its claim and its cordon) is dropped (default slots.ClaimGrace), plus a random part
	// of up to half of it, so that the pool's waiting nodes do not all look again at once.
	SlotRecheck time.Duration
	// SlotJitter bounds the random pause of a node held by a full pool between seeing a slot freed and going for
	// it (default DefaultSlotJitter): every waiting node of the pool watches the slots Lease, and without it each
	// freed slot would send them all at once to the slots Lease, one of them to win. After the pause the node tries
	// only if its watch still shows the slot free. Negative: no pause.
	SlotJitter time.Duration
	// APITimeout bounds the retries of one node read or write while the API server fails with errors that may
	// pass (default apiretry.DefaultTimeout); then the step fails with the server's last error.
	APITimeout time.Duration
	// Maintenance marks the node while its driver changes, for remediation controllers (maintenance.go).
	Maintenance Maintenance
}

// More defaults.
const (
	DefaultMOFEDTimeout   = 10 * time.Minute
	DefaultHostDriverHold = time.Minute
	DefaultSlotJitter     = time.Second
)

// Steps are the points a run can be stopped at through Options.AfterStep, in order.
var Steps = []string{"detect", "claim", "cordon", "evict", "pause", "operands", "unload", "unmount"}

// Complete fills defaults.
func (o *Options) Complete() {
	o.Host.Complete()
	if o.OperandTimeout <= 0 {
		o.OperandTimeout = DefaultOperandTimeout
	}
	if o.Eviction.Timeout <= 0 {
		o.Eviction.Timeout = gpudrain.DefaultTimeout
	}
	if o.Drain.Timeout <= 0 {
		o.Drain.Timeout = gpudrain.DefaultTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SlotRecheck <= 0 {
		o.SlotRecheck = slots.ClaimGrace
	}
	if o.SlotJitter == 0 {
		o.SlotJitter = DefaultSlotJitter
	}
	if o.MOFEDTimeout <= 0 {
		o.MOFEDTimeout = DefaultMOFEDTimeout
	}
	if o.MOFEDInterval <= 0 {
		o.MOFEDInterval = 5 * time.Second
	}
	if o.HostDriverHold <= 0 {
		o.HostDriverHold = DefaultHostDriverHold
	}
	if o.APITimeout <= 0 {
		o.APITimeout = apiretry.DefaultTimeout
	}
	o.Lease.complete()
}

// scopeErrors names what is missing of the node-local scope every command here needs: a client, this node, and
// the namespace of the operand pods.
func scopeErrors(client kubernetes.Interface, node, namespace string) []error {
	var errs []error
	if client == nil {
		errs = append(errs, errors.New("no API client"))
	}
	if node == "" {
		errs = append(errs, errors.New("no node name: set NODE_NAME (the pod's spec.nodeName)"))
	}
	if namespace == "" {
		errs = append(errs, errors.New("no operand namespace: set OPERATOR_NAMESPACE (the pod's namespace)"))
	}
	return errs
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	errs := scopeErrors(o.Client, o.NodeName, o.Namespace)
	if _, err := labels.Parse(o.Drain.PodSelector); err != nil {
		errs = append(errs, fmt.Errorf("DRAIN_POD_SELECTOR_LABEL %q: %w", o.Drain.PodSelector, err))
	}
	switch o.Allocation {
	case "", nodestate.AllocationDevicePlugin, nodestate.AllocationDRA:
	default:
		errs = append(errs, fmt.Errorf("GPU_ALLOCATION %q: want %s or %s", o.Allocation, nodestate.AllocationDevicePlugin, nodestate.AllocationDRA))
	}
	errs = append(errs, o.Host.Validate(), o.Lease.validate())
	return errors.Join(errs...)
}

// Run does the node's work and writes one summary line to out. On failure it restores the node (see the package
// comment) and returns an error that says what is in the way. ctx is the pod's stop context: once it ends, any
// error is the stop's (context.Cause says why), and the node is left for the next driver pod. A run, from its first
// read of the node, holds the node's Lease; losing it stops the run like SIGTERM does. A node held for its pool's
// canary waits between two runs, without the Lease.
func (o *Options) Run(ctx context.Context, out io.Writer) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(out, nil))
	}
	if err := o.waitForOlderDriverPods(ctx, log); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("node %s: stopped (%w) while another driver pod was still on it; nothing changed", o.NodeName, context.Cause(ctx))
		}
		return err
	}
	return o.inTurns(ctx, log, out, false, (*manager).run)
}

// inTurns runs body on the node (onNode) under the node's Lease; a node that must wait for its turn (body ended
// with a heldError) waits on watches alone, holding no Lease (canary.go), and once the turn comes a fresh run under
// the Lease reads the node (and the host) again.
func (o *Options) inTurns(ctx context.Context, log *slog.Logger, out io.Writer, agent bool, body func(*manager, context.Context) (string, error)) error {
	turns := &turnWatches{outer: ctx}
	defer turns.drop()
	for {
		err := o.withLease(ctx, log, func(ctx context.Context, known bool) error {
			return o.onNode(ctx, log, out, agent, known, turns, body)
		})
		var held *heldError
		if !errors.As(err, &held) {
			return err
		}
		if err := held.m.waitTurn(ctx, true); err != nil {
			var untouched *untouchedError
			if errors.As(err, &untouched) {
				return untouched.err
			}
			return err
		}
	}
}

// onNode reads the node and runs body on it; it ends body's outcome as a run ends: a refusal or a kill as is, a
// stop (ctx ended) with nothing undone, a failure with the node restored (failed). A summary goes to out.
func (o *Options) onNode(ctx context.Context, log *slog.Logger, out io.Writer, agent, known bool, turns *turnWatches, body func(*manager, context.Context) (string, error)) error {
	m := &manager{o: o, log: log.With("node", o.NodeName), drainLog: log, out: out, agent: agent, known: known, turns: turns}
	gctx, cancel := context.WithTimeout(ctx, o.APITimeout)
	node, err := nodestate.Get(gctx, o.Client, o.NodeName)
	cancel()
	if err != nil {
		return err
	}
	m.node = node
	if err := m.restoreValidated(ctx); err != nil {
		return err // nothing changed yet
	}
	summary, err := body(m, ctx)
	var untouched *untouchedError
	if errors.As(err, &untouched) {
		return untouched.err
	}
	if err != nil && ctx.Err() != nil {
		return m.stopped(ctx, err)
	}
	if err != nil {
		return m.failed(ctx, err)
	}
	if summary != "" {
		fmt.Fprintln(out, summary)
	}
	return nil
}

type manager struct {
	o        *Options
	log      *slog.Logger
	drainLog *slog.Logger // gpudrain names the node itself
	out      io.Writer
	node     *corev1.Node
	// missing are the modules an unload removed and could not load back.
	missing []string
	// slotsFull: the last look found the pool's slots all held (canary.go), so the wait watches them.
	slotsFull bool
	// agent: the old driver pod's gate empties the node (replace.go); it has no host access, and the old driver
	// is loaded and serving.
	agent bool
	// known: a driver manager of this release ran on the node before (its Lease was there).
	known bool
	// turns carries the watches of the node's turn from one look to the next (canary.go).
	turns *turnWatches
}

// untouchedError is returned without restoring anything: a run stopped by AfterStep (what a kill leaves), or one
// that refused before it changed anything.
type untouchedError struct{ err error }

func (e *untouchedError) Error() string { return e.err.Error() }

// step ends a step; AfterStep may stop the run there, and so does the pod's stop (the next step may not heed
// ctx: unloading modules does not).
func (m *manager) step(ctx context.Context, name string) error {
	if m.o.AfterStep != nil {
		if err := m.o.AfterStep(name); err != nil {
			return &untouchedError{err}
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("after step %s: %w", name, context.Cause(ctx))
	}
	return nil
}

// stopped is Run's answer when its pod is stopping: nothing restored, no upgrade-failed written, so the next
// driver pod resumes from the state this run reached.
func (m *manager) stopped(ctx context.Context, err error) error {
	return fmt.Errorf("node %s: stopped (%w) in state %q; nothing undone: the next driver pod resumes from here (%v)",
		m.o.NodeName, context.Cause(ctx), m.node.Labels[nodestate.UpgradeStateLabel], err)
}

func (m *manager) run(ctx context.Context) (string, error) {
	h := m.o.Host
	mods, err := h.Loaded()
	if err != nil {
		return "", err
	}
	files, err := h.DriverPodFiles()
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		host, err := h.HostDriver(ctx)
		if err != nil {
			return "", err
		}
		if host.Present() {
			return m.preInstalled(ctx, host.Path)
		}
		if host.Path != "" {
			m.log.Info("the host's nvidia-smi does not run: no host driver", "found", host.String())
		}
	}
	recorded, _, err := h.RecordedDigest()
	if err != nil {
		return "", err
	}
	// Every path ends by restoring what the pause record names: a record nobody can read stops the run here,
	// before the cordon and the eviction, rather than half way with nothing to restore from.
	if _, err := nodestate.Resume(m.node); err != nil {
		return "", &untouchedError{err}
	}
	if err := m.step(ctx, "detect"); err != nil {
		return "", err
	}
	switching := m.switchesAllocation()
	switch {
	case len(mods) == 0:
		return m.notLoaded(ctx)
	case !m.o.ForceReinstall && !switching && m.o.Digest != "" && m.o.Digest == recorded:
		return m.keep(ctx)
	case !m.o.ForceReinstall && !switching && m.o.Digest != "" && foreignDriver(m.node, recorded):
		if why := m.adoptable(); why != "" {
			m.log.Info("driver loaded by another installer differs from this pod's: the driver change path takes over", "why", why)
		} else {
			return m.adopt(ctx)
		}
	}
	if err := m.heldBack(ctx, recorded); err != nil {
		return "", &untouchedError{err}
	}
	if err := m.waitTurn(ctx, false); err != nil { // canary.go: the pool's canary first, its failure threshold, a slot
		return "", err
	}
	if err := m.step(ctx, "claim"); err != nil {
		return "", err
	}
	m.log.Info("driver change: moving workloads off and unloading", "loaded", moduleNames(mods),
		"digest", nodestate.ShortDigest(m.o.Digest), "recordedDigest", nodestate.ShortDigest(recorded), "forceReinstall", m.o.ForceReinstall,
		"allocation", m.node.Labels[nodestate.AllocationLabel]+" -> "+m.o.Allocation)
	return m.upgrade(ctx)
}

// switchesAllocation: the node hands its GPUs out the other way than the pool now wants. A node without the label
// is new to the stack (or never had a GPU pod placed by it): it takes the pool's way without a switch.
func (m *manager) switchesAllocation() bool {
	current := m.node.Labels[nodestate.AllocationLabel]
	return m.o.Allocation != "" && current != "" && current != m.o.Allocation
}

// allocation is the change that labels the node with the pool's allocation mode (none without one).
func (m *manager) allocation() change {
	return func(n *corev1.Node) (nodestate.Patch, error) {
		if m.o.Allocation == "" {
			return nodestate.Patch{}, nil
		}
		return nodestate.SetAllocation(n, m.o.Allocation)
	}
}

// underWay: the node's driver change has started (the stack cordoned it, or it is past upgrade-required).
func underWay(n *corev1.Node) bool {
	switch nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) {
	case "", nodestate.UpgradeRequired, nodestate.UpgradeDone, nodestate.UpgradeFailed:
		return nodestate.CordonedByUs(n)
	}
	return true
}

func (m *manager) upgrade(ctx context.Context) (string, error) {
	drained, err := m.emptyNode(ctx)
	if err != nil {
		return "", err
	}
	unloaded, err := m.unload(ctx)
	var busy *kmod.BusyError
	if errors.As(err, &busy) && len(unloaded) == 0 && m.o.Drain.Enabled && !drained && ctx.Err() == nil {
		m.log.Info("driver busy; draining the node (auto-drain) and retrying", "err", err)
		if err := m.drain(ctx, err.Error()); err != nil {
			return "", err
		}
		unloaded, err = m.unload(ctx)
	}
	if err != nil {
		return "", fmt.Errorf("unload the driver: %w", err)
	}
	m.log.Info("driver unloaded", "modules", unloaded)
	if err := m.step(ctx, "unload"); err != nil {
		return "", err
	}
	cleared, err := m.clearStale()
	if err != nil {
		return "", err
	}
	if err := m.step(ctx, "unmount"); err != nil {
		return "", err
	}
	prepared, err := m.prepareInstall(ctx)
	if err != nil {
		return "", err
	}
	cleared += prepared
	// the new allocation mode goes on with the resume: the plugin of the new mode arrives, the old one stays away
	if err := m.apply(ctx, nodestate.Resume, m.state(nodestate.ValidationRequired, ""), fixed(nodestate.DriverInstalls(m.now())), m.allocation(), m.recordDigest()); err != nil {
		return "", err
	}
	cordon := ""
	if nodestate.CordonedByUs(m.node) {
		cordon = "; cordoned until the node's validation passes"
	}
	return fmt.Sprintf("unloaded %s%s; operands resumed; the new driver installs next%s",
		strings.Join(unloaded, ", "), cleared, cordon), nil
}

// clearStale unmounts what is left of a previous driver container's root and removes its pid file.
func (m *manager) clearStale() (string, error) {
	unmounted, err := m.o.Host.UnmountDriverRoot()
	if err != nil {
		return "", fmt.Errorf("unmount the stale driver root: %w", err)
	}
	removed, err := m.o.Host.RemovePidFile()
	if err != nil {
		return "", err
	}
	var done []string
	if len(unmounted) > 0 {
		done = append(done, fmt.Sprintf("unmounted %d stale driver root mounts", len(unmounted)))
	}
	if removed {
		done = append(done, "removed the stale pid file")
	}
	if len(done) == 0 {
		return "", nil
	}
	m.log.Info("cleared the previous driver's files", "unmounted", unmounted, "pidFile", removed)
	return "; " + strings.Join(done, ", "), nil
}

// failed restores the node after a failed run and says what to do.
func (m *manager) failed(ctx context.Context, cause error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	reason := oneLine(cause.Error())
	// a node without a working driver is never handed back to workloads: our cordon stays
	cordon, done := pure(nodestate.Uncordon), "our cordon lifted"
	if missing := m.driverMissing(); missing != "" {
		cordon, done = fixed(nodestate.Patch{}), "our cordon kept ("+missing+")"
		if len(m.missing) > 0 {
			reason = oneLine(cause.Error() + "; node kept cordoned: " + missing)
		}
	}
	if err := m.apply(ctx, nodestate.Resume, cordon, m.state(nodestate.UpgradeFailed, reason), pure(nodestate.EndMaintenanceLabel)); err != nil {
		return fmt.Errorf("%w (and restoring node %s failed: %v)", cause, m.o.NodeName, err)
	}
	if err := m.o.Maintenance.failed(ctx, m.o.Client, m.o.NodeName, m.o.APITimeout, reason); err != nil {
		return fmt.Errorf("%w (and %v)", cause, err)
	}
	return fmt.Errorf("node %s: %w; operands resumed, %s, node labelled %s=%s; fix the cause above, then restart this driver pod",
		m.o.NodeName, cause, done, nodestate.UpgradeStateLabel, nodestate.UpgradeFailed)
}

// A change computes a patch from the node as the API server has it now.
type change func(*corev1.Node) (nodestate.Patch, error)

// pure makes a change of a patch function that cannot fail.
func pure(f func(*corev1.Node) nodestate.Patch) change {
	return func(n *corev1.Node) (nodestate.Patch, error) { return f(n), nil }
}

// recordDigest records on the node the config digest of the driver it keeps or is about to install, for the node
// status exporter (kube_gpu_stack_node_driver_info).
func (m *manager) recordDigest() change {
	return pure(func(n *corev1.Node) nodestate.Patch { return nodestate.RecordDriverDigest(n, m.o.Digest) })
}

// fixed is a change whose patch does not depend on the node.
func fixed(p nodestate.Patch) change {
	return func(*corev1.Node) (nodestate.Patch, error) { return p, nil }
}

// apply computes the changes from the node as this run last read or wrote it and writes them as one patch with
// its resourceVersion; a node changed since (the server refuses: 409) is read afresh and the changes computed again
// (nodestate.UpdateFrom: transient errors retried within APITimeout). It keeps the node as written.
func (m *manager) apply(ctx context.Context, cs ...change) error {
	ctx, cancel := context.WithTimeout(ctx, m.o.APITimeout)
	defer cancel()
	node, err := nodestate.UpdateFrom(ctx, m.o.Client, m.o.NodeName, m.node, func(n *corev1.Node) (nodestate.Patch, error) {
		ps := make([]nodestate.Patch, 0, len(cs))
		for _, c := range cs {
			p, err := c(n)
			if err != nil {
				return nodestate.Patch{}, err
			}
			ps = append(ps, p)
		}
		return nodestate.Merge(ps...), nil
	})
	if err != nil {
		return err
	}
	m.node = node
	return nil
}

// state is the change that moves the node to state s.
func (m *manager) state(s nodestate.UpgradeState, reason string) change {
	return pure(func(n *corev1.Node) nodestate.Patch { return m.setState(n, s, reason) })
}

func (m *manager) setState(n *corev1.Node, s nodestate.UpgradeState, reason string) nodestate.Patch {
	return nodestate.SetUpgradeState(n, s, reason, m.now())
}

func (m *manager) now() string { return m.o.Now().UTC().Format(time.RFC3339) }

func waitingForValidation(node *corev1.Node) bool {
	s := nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel])
	return s == nodestate.ValidationRequired || s == nodestate.UncordonRequired
}

func moduleNames(mods []kmod.Module) []string {
	out := make([]string, 0, len(mods))
	for _, m := range mods {
		out = append(out, m.Name)
	}
	return out
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxReason {
		s = s[:maxReason-3] + "..."
	}
	return s
}
