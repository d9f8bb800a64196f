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
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
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

// heldBack keeps a driver change from starting on a node the admin holds back or a failed change left behind.
// The old driver stays loaded and nothing is evicted: while the skip label is set the init container waits (so
// the new driver pod never starts over a loaded driver, and counts against maxUnavailable until the label goes);
// an upgrade-failed node is refused at once (the pod restarts with back-off) until `kube-gpu-stack upgrade retry`.
func (m *manager) heldBack(ctx context.Context, recorded string) error {
	if nodestate.UpgradeState(m.node.Labels[nodestate.UpgradeStateLabel]) == nodestate.UpgradeFailed && foreignState(m.node) {
		m.log.Info("upgrade-failed was written by another installer (the GPU Operator's upgrade controller, same label): not a failure of ours to hold the node for",
			"label", nodestate.UpgradeStateLabel)
	} else if nodestate.UpgradeState(m.node.Labels[nodestate.UpgradeStateLabel]) == nodestate.UpgradeFailed {
		return fmt.Errorf("node %s is %s (%s): its driver (config %s) stays loaded and nothing is evicted; fix the cause, then run `kube-gpu-stack upgrade retry %s`",
			m.o.NodeName, nodestate.UpgradeFailed, m.node.Annotations[nodestate.UpgradeReasonAnnotation], nodestate.ShortDigest(recorded), m.o.NodeName)
	}
	if m.node.Labels[nodestate.UpgradeSkipLabel] != "true" {
		return nil
	}
	if underWay(m.node) {
		// the old driver pod is gone: no old driver is left to keep in service, and holding would keep the node
		// out of service for as long as the label stays
		m.log.Info("node labelled to skip driver upgrades after its change started: the change finishes, the label holds the next one",
			"label", nodestate.UpgradeSkipLabel, "state", m.node.Labels[nodestate.UpgradeStateLabel])
		return nil
	}
	m.log.Info("node labelled to skip driver upgrades: the loaded driver stays; waiting for the label to go",
		"label", nodestate.UpgradeSkipLabel, "recordedDigest", nodestate.ShortDigest(recorded), "digest", nodestate.ShortDigest(m.o.Digest))
	wctx := ctx
	if m.o.SkipWait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, m.o.SkipWait)
		defer cancel()
	}
	nodes, err := kwatch.Start(wctx, kwatch.Node(m.o.Client, m.o.NodeName), &corev1.Node{})
	if err != nil {
		return fmt.Errorf("watch node %s: %w", m.o.NodeName, err)
	}
	err = kwatch.Until(wctx, nodes, func(ns []*corev1.Node) (bool, error) {
		if len(ns) == 1 && ns[0].Labels[nodestate.UpgradeSkipLabel] != "true" {
			m.node = ns[0]
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s is labelled %s=true: its driver (config %s) stays loaded and nothing is evicted; remove the label to let the new driver (config %s) in: %w",
			m.o.NodeName, nodestate.UpgradeSkipLabel, nodestate.ShortDigest(recorded), nodestate.ShortDigest(m.o.Digest), err)
	}
	m.log.Info("skip label removed: the driver change goes ahead")
	return nil
}

// preInstalled marks a host-driver node and then fails: the driver container of this pod must never start next to
// the host's driver. Once the mark is set the driver DaemonSet no longer selects the node and removes the pod; the
// hold keeps the pod from restarting in a tight loop meanwhile.
func (m *manager) preInstalled(ctx context.Context, smi string) (string, error) {
	// A host-driver node takes its pool's allocation mode once; this DaemonSet lets go of it, so it never switches
	// it later (an admin moves such a node by labelling it, after moving its GPU pods).
	firstAllocation := func(n *corev1.Node) (nodestate.Patch, error) {
		if n.Labels[nodestate.AllocationLabel] != "" {
			return nodestate.Patch{}, nil
		}
		return m.allocation()(n)
	}
	if err := m.apply(ctx, pure(nodestate.MarkPreInstalled), firstAllocation); err != nil {
		return "", err
	}
	m.log.Info("host driver found: node marked; holding this driver pod until its DaemonSet lets go of the node",
		"nvidiaSMI", smi, "label", nodestate.DriverDeployLabel+"="+nodestate.PreInstalled, "hold", m.o.HostDriverHold)
	select {
	case <-ctx.Done():
	case <-time.After(m.o.HostDriverHold):
	}
	return "", &untouchedError{fmt.Errorf("host driver found (%s) and no driver pod's files: node %s marked %s=%s; standing down: this driver container must not start on a host-driver node",
		smi, m.o.NodeName, nodestate.DriverDeployLabel, nodestate.PreInstalled)}
}

// prepareInstall readies the node for the NVIDIA driver about to install: nouveau out, the NVIDIA functions a
// vm-passthrough role left on vfio-pci released, and, with GPUDirect RDMA on a node with a Mellanox device, the
// MOFED driver up (the driver container builds nvidia_peermem against it). It returns what it did, for the summary.
func (m *manager) prepareInstall(ctx context.Context) (string, error) {
	h := m.o.Host
	var done []string
	nouveau, err := h.UnloadNouveau()
	if err != nil {
		return "", err
	}
	if nouveau {
		m.log.Info("unloaded nouveau")
		done = append(done, "unloaded nouveau")
	}
	released, err := h.UnbindVFIO()
	if err != nil {
		return "", fmt.Errorf("release the GPUs from vfio-pci: %w", err)
	}
	if len(released) > 0 {
		m.log.Info("released NVIDIA functions from vfio-pci", "functions", released)
		done = append(done, "released "+strings.Join(released, ", ")+" from vfio-pci")
	}
	if m.o.GPUDirectRDMA {
		waited, err := m.waitMOFED(ctx)
		if err != nil {
			return "", err
		}
		if waited != "" {
			done = append(done, waited)
		}
	}
	if len(done) == 0 {
		return "", nil
	}
	return "; " + strings.Join(done, "; "), nil
}

// waitMOFED polls, bounded by MOFEDTimeout, until the MOFED driver is ready; a node without a Mellanox device
// does not wait.
func (m *manager) waitMOFED(ctx context.Context) (string, error) {
	h := m.o.Host
	mellanox, err := h.HasPCIVendor(kmod.VendorMellanox)
	if err != nil {
		return "", err
	}
	if !mellanox {
		m.log.Info("GPUDirect RDMA is on but the node has no Mellanox device: not waiting for MOFED")
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.o.MOFEDTimeout)
	defer cancel()
	logged := false
	for {
		ok, what, err := h.MOFEDReady(m.o.HostMOFED)
		if err != nil {
			return "", fmt.Errorf("check MOFED (%s): %w", what, err)
		}
		if ok {
			return "MOFED ready (" + what + ")", nil
		}
		if !logged {
			m.log.Info("GPUDirect RDMA: waiting for the Mellanox OFED driver", "for", what, "timeout", m.o.MOFEDTimeout)
			logged = true
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("GPUDirect RDMA is on and the node has a Mellanox device, but MOFED is not ready after %s: no %s", m.o.MOFEDTimeout, what)
		case <-time.After(m.o.MOFEDInterval):
		}
	}
}

// keep is the fast path: the loaded driver has the new pod's config. Only leftovers of an interrupted run are
// undone. A node finishes here only when it is upgrade-done (or never had a driver change): anywhere else its
// driver may never have validated — the gate gave up on it, an admin retried, a change was interrupted — so the
// node waits for validation, our cordon kept, and the gate finishes it.
func (m *manager) keep(ctx context.Context) (string, error) {
	cleared, err := m.clearStale()
	if err != nil {
		return "", err
	}
	var pending string
	finish := func(n *corev1.Node) (nodestate.Patch, error) {
		pending = "; validation of the new driver still pending (state and cordon kept)"
		switch s := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]); {
		case waitingForValidation(n):
		case forgotten(n, m.known):
			pending = "; the Node object lost the stack's record of this driver (deleted and registered again): it validates before the node returns to workloads (cordoned)"
			return nodestate.Merge(nodestate.Cordon(n, ReregisteredCordon), m.setState(n, nodestate.ValidationRequired, ""), nodestate.DriverInstalls(registeredSince(n, m.o.Now()))), nil
		case s == "" || s == nodestate.UpgradeDone:
			pending = ""
			return nodestate.Merge(nodestate.Uncordon(n), m.setState(n, nodestate.UpgradeDone, ""), nodestate.SetValidated(n, m.o.Digest)), nil
		case n.Annotations[nodestate.ValidatedDigestAnnotation] == m.o.Digest:
			// the loaded driver is the one that last validated here (a rollback's template back before its plan
			// called the node off): nothing to validate
			pending = fmt.Sprintf("; the node was %s with the driver that last validated on it: back in service", s)
			return nodestate.Merge(nodestate.Uncordon(n), m.setState(n, nodestate.UpgradeDone, "")), nil
		default:
			// an interrupted change: the loaded driver may never have validated, so the node waits for it cordoned
			// (a cordon of ours is kept; one a killed run did not get to write yet is written now)
			pending = fmt.Sprintf("; the node was %s: the loaded driver validates before the node returns to workloads (cordoned)", s)
			return nodestate.Merge(nodestate.Cordon(n, UnvalidatedCordon), m.setState(n, nodestate.ValidationRequired, "")), nil
		}
		return nodestate.Patch{}, nil
	}
	if err := m.apply(ctx, nodestate.Resume, finish, m.allocation(), m.recordDigest()); err != nil {
		return "", err
	}
	if nodestate.UpgradeState(m.node.Labels[nodestate.UpgradeStateLabel]) == nodestate.UpgradeDone {
		// back in service without its gate: an emptying that kept the driver (a pool renamed, a pod deleted by hand)
		// took a slot, and nothing else gives it back before the claim grace runs out
		backInService(ctx, m.o.Client, m.o.Namespace, m.node, m.log)
	}
	return fmt.Sprintf("driver config unchanged (digest %s): kept the loaded driver, evicted nothing%s%s", nodestate.ShortDigest(m.o.Digest), cleared, pending), nil
}

// UnvalidatedCordon is the cordon's reason on a node whose interrupted change left a driver loaded that has not
// validated on it.
const UnvalidatedCordon = "its driver change was interrupted with a driver loaded that has not validated here: it validates before workloads return"

// ReregisteredCordon is the cordon's reason (nodestate.CordonedAnnotation) on a node whose Node object forgot its
// driver's record. Such a node takes no slot of its pool: no driver change took it out, its registration did.
const ReregisteredCordon = "its Node object was registered again and lost the record of its driver: it validates before workloads return"

// registeredSince is the time from which a validator vouches for the driver a node registered again kept loaded:
// the Node object's creation. A validator that turned Ready since ran against that driver (keep changes none),
// one Ready from before vouches for nothing; taking now instead would refuse a validator that passed in the seconds
// between the registration and this run, and the gate would wait for one that never comes. Without a creation time
// (or one ahead of now): now.
func registeredSince(n *corev1.Node, now time.Time) string {
	t := n.CreationTimestamp.Time
	if t.IsZero() || t.After(now) {
		t = now
	}
	return t.UTC().Format(time.RFC3339)
}

// forgotten: a driver manager of the release ran on the node before (known), yet the Node carries no driver record
// of ours and no state but the one a plan writes: the Node object was deleted and registered again (the kubelet
// re-registers it), so whether the loaded driver ever validated is lost with it, and a plan that ran since may have
// marked the bare node upgrade-required. It may be a driver that failed validation; treated as done, or as one in
// service, the node would return to workloads with it. A node the stack never saw (a first install over a loaded
// driver, a reinstall after the pre-delete cleanup) has no Lease yet and keeps its driver in service.
func forgotten(n *corev1.Node, known bool) bool {
	switch nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) {
	case "", nodestate.UpgradeRequired:
		return known && n.Annotations[nodestate.DriverDigestAnnotation] == ""
	}
	return false
}

// notLoaded: a fresh node, a reboot, or a run killed after it unloaded. The new driver installs next; a cordon of
// ours stays until it validates (a failed node that rebooted is not uncordoned on the way).
func (m *manager) notLoaded(ctx context.Context) (string, error) {
	cleared, err := m.clearStale()
	if err != nil {
		return "", err
	}
	prepared, err := m.prepareInstall(ctx)
	if err != nil {
		return "", err
	}
	cleared += prepared
	if m.switchesAllocation() && m.o.Eviction.Enabled {
		// no driver, but pods may still hold the node's GPUs the old way (a reboot restarts them): they go first
		if err := m.evictGPUPods(ctx); err != nil {
			return "", fmt.Errorf("switch to %s: evict GPU pods: %w", m.o.Allocation, err)
		}
	}
	// a node registered again mid-change (its driver unloaded) is held as one that kept its driver is (keep)
	cordonForgotten := func(n *corev1.Node) (nodestate.Patch, error) {
		if !forgotten(n, m.known) {
			return nodestate.Patch{}, nil
		}
		return nodestate.Cordon(n, ReregisteredCordon), nil
	}
	if err := m.apply(ctx, nodestate.Resume, cordonForgotten, m.state(nodestate.ValidationRequired, ""), fixed(nodestate.DriverInstalls(m.now())), m.allocation(), m.recordDigest()); err != nil {
		return "", err
	}
	kept := ""
	if nodestate.CordonedByUs(m.node) {
		kept = "; our cordon stays until validation passes"
	}
	return "no NVIDIA driver loaded: the new driver installs next" + cleared + kept, nil
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

// emptyNode moves the node's workloads off and stops what uses its GPUs, short of the driver itself: cordon (as
// ours) and pause the GPU operands, evict the GPU pods (auto-drain on failure) while the operands' pods go, the DRA
// kubelet plugin last. The new driver pod's manager runs it before the unload; the old driver pod's upgrade gate runs it
// before that pod stops (replace.go), so that the old driver container's stop finds nothing on the GPUs. drained
// says whether the whole node was drained.
func (m *manager) emptyNode(ctx context.Context) (drained bool, err error) {
	moveOff := m.o.Eviction.Enabled || m.o.Drain.Enabled
	// the node says it is under maintenance before anything on it stops
	if err := m.o.Maintenance.begin(ctx, m.o.Client, m.o.NodeName, m.o.APITimeout); err != nil {
		return false, err
	}
	if err := m.apply(ctx, m.emptyingState(nodestate.CordonRequired), m.o.Maintenance.label()); err != nil {
		return false, err
	}
	// The operands pause with the cordon and leave while the GPU pods are evicted, as the reference driver manager
	// pauses them before it evicts: a running job keeps the GPUs it holds (it only loses their monitoring), no new
	// pod gets one, and the node is empty after the longer of the two waits, not their sum. (The DRA kubelet plugin
	// is not among them: it goes last, once no pod holds a claim.) A switch the admin sets meanwhile is kept:
	// Resume restores only what is still paused.
	pause := func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Pause(n, nodestate.PausableOperands) }
	cs := []change{m.emptyingState(nodestate.PodDeletionRequired), pause}
	if moveOff {
		cs = append(cs, pure(func(n *corev1.Node) nodestate.Patch { return nodestate.Cordon(n, cordonReason) }))
	}
	if err := m.apply(ctx, cs...); err != nil {
		return false, err
	}
	if err := m.step(ctx, "cordon"); err != nil {
		return false, err
	}
	paused := m.paused(nodestate.PausableOperands)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		drained, err = m.moveGPUPodsOff(gctx, "")
		return err
	})
	g.Go(func() error { return m.awaitOperandsGone(gctx, paused) })
	if err := g.Wait(); err != nil {
		return false, err
	}
	if len(paused) > 0 {
		m.log.Info("paused operands are gone", "operands", paused)
	}
	if err := m.step(ctx, "evict"); err != nil {
		return false, err
	}
	if err := m.apply(ctx, m.emptyingState(nodestate.PodRestartRequired)); err != nil {
		return false, err
	}
	if err := m.step(ctx, "pause"); err != nil {
		return false, err
	}
	// the DRA kubelet plugin goes last, within the operands step (a stop after "pause" finds it still running)
	if err := m.pauseDRAPlugin(ctx); err != nil {
		return false, err
	}
	// a GPU pod that landed during the eviction (it tolerates the cordon, or names the node) got its GPU from the
	// device plugin or the DRA plugin still running then: with both gone none can come, so one more pass empties the
	// node for good before the old driver stops
	if !drained {
		if drained, err = m.moveGPUPodsOff(ctx, " that arrived during the eviction"); err != nil {
			return false, err
		}
	}
	if err := m.step(ctx, "operands"); err != nil {
		return false, err
	}
	return drained, nil
}

// emptying is the order of the states a node goes through while emptyNode empties it.
var emptying = []nodestate.UpgradeState{nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired}

// emptyingState is the change to state s of the emptying, none on a node past it already: the new driver pod's
// manager goes over a node its old pod's gate emptied (for pods that arrived meanwhile) without taking its state
// back, and a run that resumes an emptying goes on from where the state says it stopped.
func (m *manager) emptyingState(s nodestate.UpgradeState) change {
	return pure(func(n *corev1.Node) nodestate.Patch {
		if slices.Index(emptying, nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])) >= slices.Index(emptying, s) {
			return nodestate.Patch{}
		}
		return m.setState(n, s, "")
	})
}

// moveGPUPodsOff evicts the node's GPU pods (when eviction is on), or drains the node when that fails and
// auto-drain is on; drained says it drained. which qualifies the pods in the error.
func (m *manager) moveGPUPodsOff(ctx context.Context, which string) (drained bool, err error) {
	if !m.o.Eviction.Enabled {
		return false, nil
	}
	err = m.evictGPUPods(ctx)
	if err == nil {
		return false, nil
	}
	if !m.o.Drain.Enabled || ctx.Err() != nil {
		return false, fmt.Errorf("evict GPU pods%s: %w", which, err)
	}
	m.log.Info("evicting GPU pods failed; draining the node (auto-drain)", "err", err)
	if err := m.drain(ctx, err.Error()); err != nil {
		return false, err
	}
	return true, nil
}

// unload removes the driver's modules: all of them, or, when one is in use, none (kmod.Host.Unload). A module
// in use names the pods of the processes that hold it. An unload that failed midway and could not load back what
// it removed is remembered, so that failed keeps the node cordoned.
func (m *manager) unload(ctx context.Context) ([]string, error) {
	unloaded, err := m.o.Host.Unload()
	var partial *kmod.PartialUnloadError
	if errors.As(err, &partial) {
		m.missing = partial.Missing
	}
	var busy *kmod.BusyError
	if errors.As(err, &busy) {
		m.namePods(ctx, busy.Processes)
	}
	return unloaded, err
}

// namePods fills in the namespace/name of the pods the processes run in, from the pods on the node (best effort:
// a process whose pod is not found keeps its pod UID).
func (m *manager) namePods(ctx context.Context, procs []kmod.Process) {
	if !slices.ContainsFunc(procs, func(p kmod.Process) bool { return p.PodUID != "" }) {
		return
	}
	pods, err := m.o.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + m.o.NodeName})
	if err != nil {
		m.log.Info("cannot name the pods holding the GPUs", "err", err)
		return
	}
	for i := range procs {
		for _, p := range pods.Items {
			if procs[i].PodUID != "" && string(p.UID) == procs[i].PodUID {
				procs[i].Pod = p.Namespace + "/" + p.Name
			}
		}
	}
}

// driverMissing says why the node has no working NVIDIA driver ("" when it has one): an unload that could not
// load back what it removed, or no nvidia module loaded (unloaded for the new driver, or never installed).
func (m *manager) driverMissing() string {
	if m.agent {
		return ""
	}
	if len(m.missing) > 0 {
		return "kernel modules " + strings.Join(m.missing, ", ") + " were removed and not loaded back"
	}
	mods, err := m.o.Host.Loaded()
	if err != nil {
		return fmt.Sprintf("its loaded kernel modules cannot be read (%v)", err)
	}
	if !slices.ContainsFunc(mods, func(mod kmod.Module) bool { return mod.Name == "nvidia" }) {
		return "no NVIDIA driver is loaded"
	}
	return ""
}

func (m *manager) evictGPUPods(ctx context.Context) error {
	d := gpudrain.Options{
		Client: m.o.Client, Node: m.o.NodeName, GPUOnly: true, Log: m.drainLog,
		Force: m.o.Eviction.Force, DeleteEmptyDirData: m.o.Eviction.DeleteEmptyDirData, Timeout: m.o.Eviction.Timeout,
	}
	d.Complete()
	if err := d.Validate(); err != nil {
		return err
	}
	res, err := d.Run(ctx, m.out)
	if err == nil && len(res.Pods) > 0 {
		m.log.Info("GPU pods evicted", "pods", res.Pods)
	}
	return err
}

func (m *manager) drain(ctx context.Context, why string) error {
	if err := m.apply(ctx, m.state(nodestate.DrainRequired, why)); err != nil {
		return err
	}
	d := gpudrain.Options{
		Client: m.o.Client, Node: m.o.NodeName, PodSelector: m.o.Drain.PodSelector, Log: m.drainLog,
		Force: m.o.Drain.Force, DeleteEmptyDirData: m.o.Drain.DeleteEmptyDirData, Timeout: m.o.Drain.Timeout,
	}
	d.Complete()
	if err := d.Validate(); err != nil {
		return err
	}
	res, err := d.Run(ctx, m.out)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	m.log.Info("node drained", "pods", res.Pods)
	return nil
}

// paused are those of ops whose switch is paused on the node.
func (m *manager) paused(ops []string) []string {
	var paused []string
	for _, op := range ops {
		if m.node.Labels[nodestate.DeployLabelPrefix+op] == nodestate.Paused {
			paused = append(paused, op)
		}
	}
	return paused
}

// pauseDRAPlugin stops the DRA kubelet plugin on a DRA node, after everything else, as the reference driver
// manager (k8s-driver-manager v0.12.0) does: the plugin unprepares the claims of pods as they leave, so it goes
// only once no pod holds a gpu.nvidia.com claim. The other operands paused with the cordon, as the reference
// pauses them before it evicts; by now the eviction is over and the claim holders are gone. One still there (eviction off, a PDB that refused it, a DaemonSet pod, which the eviction
// skips) fails the run, the plugin untouched: the restore resumes the other operands and no claim is stranded.
func (m *manager) pauseDRAPlugin(ctx context.Context) error {
	op := m.o.DRAPlugin
	if op == "" {
		return nil
	}
	running, err := m.operandPods(ctx, op)
	if err != nil {
		return err
	}
	// a run stopped after this pause finds the plugin gone and its switch paused: it is a DRA node all the same
	if len(running) == 0 && len(m.paused([]string{op})) == 0 {
		return nil
	}
	var holders []string
	err = apiretry.Do(ctx, func(ctx context.Context) error {
		holders, err = gpupods.ClaimHolders(ctx, m.o.Client, m.o.NodeName)
		return err
	})
	if err != nil {
		return err
	}
	if len(holders) > 0 {
		return fmt.Errorf("cannot stop the DRA kubelet plugin (%s%s): pods still hold %s claims: %s (evict them, or let ENABLE_GPU_POD_EVICTION do it)",
			nodestate.DeployLabelPrefix, op, gpupods.DRADriver, strings.Join(holders, ", "))
	}
	pause := func(n *corev1.Node) (nodestate.Patch, error) { return nodestate.Pause(n, []string{op}) }
	if err := m.apply(ctx, pause); err != nil {
		return err
	}
	m.log.Info("no pod holds a GPU claim: DRA kubelet plugin paused", "switch", nodestate.DeployLabelPrefix+op)
	return m.waitOperandsGone(ctx, m.paused([]string{op}))
}

// operandPods lists the pods of an operand on the node.
func (m *manager) operandPods(ctx context.Context, op string) ([]corev1.Pod, error) {
	var pods *corev1.PodList
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		pods, err = m.o.Client.CoreV1().Pods(m.o.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: ComponentLabel + "=" + op, FieldSelector: "spec.nodeName=" + m.o.NodeName})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the %s pods on the node: %w", op, err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName == m.o.NodeName {
			out = append(out, p)
		}
	}
	return out, nil
}

// waitOperandsGone watches until no pod of the paused operands is left on the node.
func (m *manager) waitOperandsGone(ctx context.Context, paused []string) error {
	if err := m.awaitOperandsGone(ctx, paused); err != nil || len(paused) == 0 {
		return err
	}
	m.log.Info("paused operands are gone", "operands", paused)
	return nil
}

// awaitOperandsGone is waitOperandsGone without the log line: it runs beside the eviction, which writes to the
// same output.
func (m *manager) awaitOperandsGone(ctx context.Context, paused []string) error {
	if len(paused) == 0 {
		return nil
	}
	req, err := labels.NewRequirement(ComponentLabel, selection.In, paused)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.o.OperandTimeout)
	defer cancel()
	pods, err := kwatch.Start(ctx, kwatch.NodePods(m.o.Client, m.o.Namespace, m.o.NodeName, req.String()), &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watch operand pods: %w", err)
	}
	err = kwatch.Until(ctx, pods, func(ps []*corev1.Pod) (bool, error) { return len(ps) == 0, nil })
	if err != nil {
		var left []string
		for _, p := range pods.List() {
			left = append(left, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, p.Labels[ComponentLabel]))
		}
		return fmt.Errorf("paused operands' pods still on the node after %s: %s (is their DaemonSet's node affinity honouring the %s* switches?): %w",
			m.o.OperandTimeout, strings.Join(left, ", "), nodestate.DeployLabelPrefix, err)
	}
	return nil
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
