package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/statusfiles"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
)

// Defaults of UncordonOptions.
const (
	// DefaultValidatorComponent is the operator validator's app.kubernetes.io/component.
	DefaultValidatorComponent = "operator-validator"
	// DefaultValidationTimeout bounds the wait for the validator (the GPU Operator's 600 s).
	DefaultValidationTimeout = 10 * time.Minute
)

// UncordonOptions configure the last step of a driver change, `driver-manager uncordon-when-valid`: once the
// node's validator pod is Ready with the new driver, lift the cordon the driver manager made and mark the node
// upgrade-done. It runs in the driver pod next to the driver container (as a sidecar, Hold set), since the driver
// manager itself is an init container that exits before the new driver installs.
type UncordonOptions struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// NodeName is this node (NODE_NAME).
	NodeName string
	// Namespace is where the validator pod runs (OPERATOR_NAMESPACE).
	Namespace string
	// Component is the validator pods' app.kubernetes.io/component (default DefaultValidatorComponent; the
	// vGPU manager's pods use sandbox-validator).
	Component string
	// Timeout bounds the wait (default DefaultValidationTimeout). When it passes the node becomes
	// upgrade-failed and stays cordoned: a node returns to workloads only with a working driver.
	Timeout time.Duration
	// DriverStartup, when set with PodName, is the driver container's startup budget (its startup probe's
	// initialDelaySeconds + periodSeconds x failureThreshold: a first install or a reboot builds the driver then).
	// Timeout then counts from the moment the pod's other containers have started (their startup probes passed),
	// and a driver that has not started within DriverStartup fails the node as a validation would.
	DriverStartup time.Duration
	// Hold keeps Run from returning after success until ctx ends, so a sidecar container does not restart.
	Hold bool
	// ReadyFile, when set, is written once the node needs nothing more from this driver change; the sidecar's
	// startup probe waits for it, so the driver pod (and with it the DaemonSet's rolling update) only counts as
	// available once the node validated with the new driver. That keeps the nodes in flight within maxUnavailable.
	ReadyFile string
	// Replace makes the gate, once the node needs nothing more from its own driver change, the node's agent for the
	// next one (replace.go): when its DaemonSet's template installs another driver, it empties the node and then
	// evicts its own pod, so the old driver stops on a node without GPU pods. Implies Hold.
	Replace bool
	// StopFile, with Replace, is the file the driver container's preStop waits for: when the pod is deleted
	// (`kubectl delete pod`, a pool change), the gate empties the node first and then writes it (stopguard.go).
	StopFile string
	// OnRequest (a pool with autoUpgrade=false) makes Replace wait for the admin's UpgradeRequestedAnnotation.
	OnRequest bool
	// PodName is the gate's own pod (POD_NAME), which Replace compares with its DaemonSet.
	PodName string
	// Maintenance is the driver manager's (Options.Maintenance): a node failed here ends its Maintenance condition.
	Maintenance Maintenance
	// ManagerOptions reads the driver manager's settings from an environment (the CLI's OptionsFromEnv): Replace
	// empties the node under the new template's settings.
	ManagerOptions func(getenv func(string) string) (Options, error)
	// Log receives progress; nil logs to Run's writer.
	Log *slog.Logger
	// Now is the clock for nodestate.UpgradeSinceAnnotation (default time.Now).
	Now func() time.Time
}

// errToAgent ends the gate's own run on a node whose next change its pod's agent (Replace) carries: it was
// emptying the node when the container restarted, or an `upgrade retry` moved the node back to its start.
var errToAgent = errors.New("the node's next driver change is this pod's to carry")

// Complete fills defaults.
func (o *UncordonOptions) Complete() {
	if o.Component == "" {
		o.Component = DefaultValidatorComponent
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultValidationTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate rejects options Run cannot act on.
func (o *UncordonOptions) Validate() error {
	return errors.Join(scopeErrors(o.Client, o.NodeName, o.Namespace)...)
}

// Run finishes the node's driver change when it is in validation-required or uncordon-required, and does
// nothing in any other state. It writes one summary line to out. ctx is the pod's stop context: a wait it ends
// is no failure, and the node stays validation-required for the next driver pod's gate.
func (o *UncordonOptions) Run(ctx context.Context, out io.Writer) error {
	base := o.Log
	if base == nil {
		base = slog.New(slog.NewTextHandler(out, nil))
	}
	err := o.serve(ctx, base, out)
	if ctx.Err() != nil && o.Replace && o.StopFile != "" {
		// the pod stops: its driver container's preStop waits for this gate's word
		return errors.Join(err, o.letDriverStop(ctx, base, out))
	}
	return err
}

// serve is Run until the pod stops: the node's own change, then (Replace) the agent for the next one.
func (o *UncordonOptions) serve(ctx context.Context, base *slog.Logger, out io.Writer) error {
	summary, err := o.run(ctx, base.With("node", o.NodeName))
	if errors.Is(err, errToAgent) {
		return o.replaceWhenOutdated(ctx, base, out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, summary)
	if o.ReadyFile != "" {
		if err := statusfiles.Write(filepath.Dir(o.ReadyFile), filepath.Base(o.ReadyFile), []byte(summary+"\n")); err != nil {
			return fmt.Errorf("write ready file: %w", err)
		}
	}
	if o.Replace {
		return o.replaceWhenOutdated(ctx, base, out)
	}
	if o.Hold {
		<-ctx.Done()
	}
	return nil
}

func (o *UncordonOptions) run(ctx context.Context, log *slog.Logger) (string, error) {
	// Node reads and writes retry errors that may pass (apiretry), and each write is computed from a fresh read
	// and carries its resourceVersion (nodestate.Update).
	node, err := nodestate.Get(ctx, o.Client, o.NodeName)
	if err != nil {
		return "", err
	}
	now := func() string { return o.Now().UTC().Format(time.RFC3339) }
	setState := func(s nodestate.UpgradeState, reason string) func(*corev1.Node) (nodestate.Patch, error) {
		return func(n *corev1.Node) (nodestate.Patch, error) {
			return nodestate.SetUpgradeState(n, s, reason, now()), nil
		}
	}
	state := nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel])
	if state == nodestate.UpgradeFailed {
		// A failed node keeps this pod un-Ready, and so its slot in the pool's maxUnavailable: a Ready pod would let
		// the rolling update carry a driver that never validates to the next nodes (the kubelet restarts only this
		// container after its timeout). It waits for the node to leave upgrade-failed (`upgrade retry`, or the
		// admin), then finishes the change from the state it is given.
		log.Info("node is upgrade-failed: holding this driver pod un-Ready until the node is retried",
			"reason", node.Annotations[nodestate.UpgradeReasonAnnotation])
		if node, err = o.waitNotFailed(ctx); err != nil {
			return "", err
		}
		if forgotten(node, true) {
			// the Node was deleted and registered again while its driver was failed: the driver still loaded here
			// never validated, so it validates again before the node returns to workloads
			log.Info("the node was registered again and lost its upgrade-failed record: its driver validates again before workloads return")
			if node, err = nodestate.Update(ctx, o.Client, o.NodeName, func(n *corev1.Node) (nodestate.Patch, error) {
				if !forgotten(n, true) {
					return nodestate.Patch{}, nil
				}
				return nodestate.Merge(nodestate.Cordon(n, ReregisteredCordon), nodestate.SetUpgradeState(n, nodestate.ValidationRequired, "", now()), nodestate.DriverInstalls(registeredSince(n, o.Now()))), nil
			}); err != nil {
				return "", err
			}
		}
		state = nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel])
		if restarts(state) {
			// `upgrade retry`: the change starts over in the next driver pod (retry deletes this one). Turning
			// Ready in between would free the node's slot before that pod even started.
			return o.holdForNextPod(ctx, log, state, "node left upgrade-failed to start its change over")
		}
	}
	switch state {
	case nodestate.ValidationRequired:
		if o.beingReverted(ctx, node) {
			log.Info("the node is going back from this pod's driver to the one that last validated on it: waiting for this pod's stop",
				"label", nodestate.RevertLabel+"="+node.Labels[nodestate.RevertLabel])
			<-ctx.Done()
			return "", fmt.Errorf("node %s: stopped (%w) while going back to the driver that last validated on it", o.NodeName, context.Cause(ctx))
		}
		// Only a validator that turned Ready after the driver changed vouches for the new driver.
		since, err := nodestate.ValidationSince(node)
		if err != nil {
			return "", err
		}
		log.Info("waiting for the validator with the new driver", "component", o.Component, "since", since, "timeout", o.Timeout)
		pod, err := o.waitValidator(ctx, since)
		if err != nil && ctx.Err() != nil {
			// The pod is stopping: no failure. The node stays validation-required (and cordoned) for the next
			// driver pod's gate; only a wait that ran its full timeout fails the node.
			return "", fmt.Errorf("node %s: stopped (%w) while waiting for the validator; it stays %s for the next driver pod",
				o.NodeName, context.Cause(ctx), nodestate.ValidationRequired)
		}
		if err != nil {
			return o.failValidation(ctx, log, err, setState)
		}
		log.Info("validator ready", "pod", pod)
		if node, err = o.advance(ctx, nodestate.ValidationRequired, setState(nodestate.UncordonRequired, "")); err != nil {
			return "", err
		}
		if state = nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel]); state != nodestate.UncordonRequired {
			return o.notOurs(ctx, log, node, state)
		}
	case nodestate.UncordonRequired:
	default:
		return o.notOurs(ctx, log, node, state)
	}
	var ours bool
	node, err = o.advance(ctx, nodestate.UncordonRequired, func(n *corev1.Node) (nodestate.Patch, error) {
		ours = nodestate.CordonedByUs(n)
		return nodestate.Merge(nodestate.Uncordon(n), nodestate.SetUpgradeState(n, nodestate.UpgradeDone, "", now()),
			nodestate.SetValidated(n, n.Annotations[nodestate.DriverDigestAnnotation]), nodestate.EndMaintenanceLabel(n)), nil
	})
	if err != nil {
		return "", err
	}
	if state = nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel]); state != nodestate.UpgradeDone {
		return o.notOurs(ctx, log, node, state)
	}
	backInService(ctx, o.Client, o.Namespace, node, log)
	if ours {
		return fmt.Sprintf("node %s validated with the new driver: uncordoned, upgrade-done", o.NodeName), nil
	}
	return fmt.Sprintf("node %s validated with the new driver: upgrade-done (no cordon of ours to lift)", o.NodeName), nil
}

// failValidation ends the gate's wait when no validator turned Ready in time (waitErr): the node goes back to the
// driver that last validated on it (the revert DaemonSet), or is upgrade-failed and stays cordoned, the reason
// naming what it waited for.
func (o *UncordonOptions) failValidation(ctx context.Context, log *slog.Logger, waitErr error,
	setState func(nodestate.UpgradeState, string) func(*corev1.Node) (nodestate.Patch, error)) (string, error) {
	after := "the driver change"
	if o.DriverStartup > 0 && o.PodName != "" {
		after = fmt.Sprintf("the driver container started (its build allowed %s)", o.DriverStartup)
	}
	reason := fmt.Sprintf("no %s pod on the node became Ready within %s after %s (%v)", o.Component, o.Timeout, after, waitErr)
	reverted, notReverted := o.revert(ctx, log, reason)
	if reverted {
		// the node leaves this DaemonSet for the revert DaemonSet: this pod is deleted, and its stop finds the
		// node emptied (letDriverStop)
		<-ctx.Done()
		return "", fmt.Errorf("node %s: %s: going back to the driver that last validated on it", o.NodeName, reason)
	}
	reason += "; the node stays cordoned: check the driver and validator pods' logs"
	if notReverted != "" {
		reason += " (not reverted: " + notReverted + ")"
	}
	failed := func(n *corev1.Node) (nodestate.Patch, error) {
		p, err := setState(nodestate.UpgradeFailed, reason)(n)
		return nodestate.Merge(p, nodestate.EndMaintenanceLabel(n)), err
	}
	if _, perr := nodestate.Update(context.WithoutCancel(ctx), o.Client, o.NodeName, failed); perr != nil {
		return "", fmt.Errorf("%s (and marking the node failed: %v)", reason, perr)
	}
	if perr := o.Maintenance.failed(context.WithoutCancel(ctx), o.Client, o.NodeName, apiretry.DefaultTimeout, reason); perr != nil {
		return "", fmt.Errorf("%s (and %v)", reason, perr)
	}
	return "", errors.New(reason)
}

// advance writes compute's patch only while the node is still in state from (compute sees the fresh read, and the
// write carries its resourceVersion), and returns the node as it then is: a pre-upgrade plan may mark the node for a
// newer driver change while this pod finishes the last one, and that mark must not be overwritten.
func (o *UncordonOptions) advance(ctx context.Context, from nodestate.UpgradeState, compute func(*corev1.Node) (nodestate.Patch, error)) (*corev1.Node, error) {
	return nodestate.Update(ctx, o.Client, o.NodeName, func(n *corev1.Node) (nodestate.Patch, error) {
		if nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) != from {
			return nodestate.Patch{}, nil
		}
		return compute(n)
	})
}

// notOurs ends the run on a node that is in state, which this pod has nothing to finish in. A node cordoned by the
// upgrade with a change still to carry (a newer plan marked it while this pod finished the last one) is out of
// service: this pod stays un-Ready until the next driver pod replaces it, so that the node keeps its slot in the
// pool's maxUnavailable. Any other node is left as it is, and the pod turns Ready.
func (o *UncordonOptions) notOurs(ctx context.Context, log *slog.Logger, node *corev1.Node, state nodestate.UpgradeState) (string, error) {
	if restarts(state) && nodestate.CordonedByUs(node) {
		return o.holdForNextPod(ctx, log, state, "node was marked for a newer driver change while cordoned for the last one")
	}
	return fmt.Sprintf("node %s is %q, not waiting for validation: nothing to do", o.NodeName, state), nil
}

// holdForNextPod keeps this driver pod un-Ready until it stops (the rolling update replaces it, or `upgrade retry`
// deletes it): the next driver pod's manager carries the node's change on from state.
func (o *UncordonOptions) holdForNextPod(ctx context.Context, log *slog.Logger, state nodestate.UpgradeState, why string) (string, error) {
	if o.Replace {
		log.Info(why+": this pod's agent carries the change on", "state", state)
		return "", errToAgent
	}
	log.Info(why+": holding this driver pod un-Ready until it is replaced", "state", state)
	<-ctx.Done()
	return "", fmt.Errorf("node %s: stopped (%w) while it was %s; the next driver pod takes the change over", o.NodeName, context.Cause(ctx), state)
}

// restarts reports whether a node in state has a driver change still to start or in progress before validation,
// which only a new driver pod's driver manager carries on.
func restarts(state nodestate.UpgradeState) bool {
	switch state {
	case nodestate.UpgradeRequired, nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired:
		return true
	}
	return false
}

// waitNotFailed watches the node until it is no longer upgrade-failed and returns it; a stop of the pod ends the
// wait without failing anything.
func (o *UncordonOptions) waitNotFailed(ctx context.Context) (*corev1.Node, error) {
	nodes, err := kwatch.Start(ctx, kwatch.Node(o.Client, o.NodeName), &corev1.Node{})
	if err != nil {
		return nil, err
	}
	var node *corev1.Node
	err = kwatch.Until(ctx, nodes, func(ns []*corev1.Node) (bool, error) {
		for _, n := range ns {
			if n.Labels[nodestate.UpgradeStateLabel] != string(nodestate.UpgradeFailed) {
				node = n
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: stopped (%w) while it was %s; the next driver pod's gate holds it", o.NodeName, context.Cause(ctx), nodestate.UpgradeFailed)
	}
	return node.DeepCopy(), nil
}

// GateContainer is the upgrade gate's container in the driver pod (the chart's gpu-stack-lib.uncordonSidecar).
const GateContainer = "driver-upgrade-gate"

// waitValidator watches the node's validator pods until one has been Ready since `since` and returns its name.
// The wait is bounded by Timeout. With DriverStartup (and PodName) the validation clock starts only once the
// driver pod's other containers have started (the driver's build is its startup probe's to bound), and a driver
// that has not started within DriverStartup ends the wait as well.
func (o *UncordonOptions) waitValidator(ctx context.Context, since time.Time) (string, error) {
	watchDriver := o.DriverStartup > 0 && o.PodName != ""
	budget := o.Timeout
	if watchDriver {
		budget = o.DriverStartup + o.Timeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, budget, fmt.Errorf("%w (%s)", context.DeadlineExceeded, budget))
	defer cancel()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	pods, err := kwatch.Start(ctx, kwatch.NodePods(o.Client, o.Namespace, o.NodeName, ComponentLabel+"="+o.Component), &corev1.Pod{})
	if err != nil {
		return "", err
	}
	stores := []*kwatch.Store[*corev1.Pod]{pods}
	if watchDriver {
		own, err := kwatch.Start(ctx, kwatch.Pods(o.Client, o.Namespace, "metadata.name="+o.PodName, ""), &corev1.Pod{})
		if err != nil {
			return "", err
		}
		stores = append(stores, own)
	}
	var clock *time.Timer // Timeout from the driver's start
	defer func() {
		if clock != nil {
			clock.Stop()
		}
	}()
	var found string
	err = kwatch.UntilAll(ctx, stores, func(ps []*corev1.Pod) (bool, error) {
		for _, p := range ps {
			if watchDriver && p.Name == o.PodName {
				if clock == nil && driverStarted(p) {
					clock = time.AfterFunc(o.Timeout, func() {
						stop(fmt.Errorf("%w (%s after the driver container started)", context.DeadlineExceeded, o.Timeout))
					})
				}
				continue
			}
			if p.DeletionTimestamp != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.Time.Before(since) {
					found = p.Namespace + "/" + p.Name
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return found, err
}

// driverStarted: every container of the driver pod but the gate has started (its startup probe passed).
func driverStarted(p *corev1.Pod) bool {
	n := 0
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == GateContainer {
			continue
		}
		if cs.Started == nil || !*cs.Started {
			return false
		}
		n++
	}
	return n > 0
}

// backInService is what a node upgrade-done with a validated driver leaves behind, whichever run put it back (its
// gate, or its manager when the driver it keeps is the one that last validated there): its slot, given back, and what
// validated, kept on its Lease.
func backInService(ctx context.Context, client kubernetes.Interface, namespace string, node *corev1.Node, log *slog.Logger) {
	giveSlotBack(ctx, client, namespace, node, log)
	rememberValidated(ctx, client, namespace, node.Name, node.Annotations[nodestate.ValidatedDigestAnnotation], log)
}

// giveSlotBack gives back the node's slot (package slots): once the node is upgrade-done, before the pod turns Ready,
// or when the change stops short of its cordon. Its claim is where its plan mark names the pool, but for a node that
// moved between pools, was re-marked, or lost its mark with its Node object: when the mark's pool holds none of it,
// every pool's slots are looked through (one list of the namespace's Leases, kept off the common case, which is on
// the next node's path to its slot). A failed give-back only logs: the pool's next claim that finds it full drops a
// holder no longer out of service.
func giveSlotBack(ctx context.Context, client kubernetes.Interface, namespace string, node *corev1.Node, log *slog.Logger) {
	if mark, err := canary.Read(node); err == nil && mark != nil && mark.MaxUnavailable > 0 {
		pool := slots.Pool{Client: client, Namespace: namespace, Name: mark.SlotsName(), Max: mark.MaxUnavailable}
		held, err := pool.GiveBack(ctx, node.Name)
		if err != nil {
			log.Info("could not give the node's slot back; the pool's next claim drops it", "err", err)
		}
		if held || err != nil {
			return
		}
	}
	given, err := slots.GiveEverywhere(ctx, client, namespace, node.Name)
	if err != nil {
		log.Info("could not give the node's slot back; the pool's next claim drops it", "err", err)
	}
	if len(given) > 0 {
		log.Info("gave back the node's slot of another pool than the one its plan mark names", "leases", given)
	}
}
