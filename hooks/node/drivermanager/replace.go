package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// The driver DaemonSets are OnDelete: the DaemonSet controller never stops an old driver pod. The upstream driver
// container's stop (SIGTERM) stops nvidia-persistenced and the fabric manager before it even checks whether the
// GPUs are in use, so an old driver pod may only stop on an emptied node. The upgrade gate of the old pod (its
// `driver-upgrade-gate` sidecar, Replace set) is the node's agent for that: once its DaemonSet's template installs
// another driver than its pod does, it waits for the node's turn (the pool's canary, failure threshold and slots),
// cordons, evicts the GPU pods and pauses the GPU operands (emptyNode), and only then evicts its own pod. The new
// pod's driver manager finds the node emptied, evicts what arrived meanwhile, unloads and installs; its gate
// validates and uncordons.

// UpgradeRequestedAnnotation asks for the driver change of a node in a pool with autoUpgrade=false (the GPU
// Operator's key): its gate replaces its driver pod only once the annotation is "true". The gate removes it when it
// starts the change.
const UpgradeRequestedAnnotation = "nvidia.com/gpu-driver-upgrade-requested"

// templateEnv resolves the driver-manager init container's environment of the DaemonSet's template for pod, as the
// kubelet would for the next pod on this node: the new config's eviction settings apply to the emptying.
func templateEnv(pod *corev1.Pod, tmpl *corev1.PodTemplateSpec) func(string) string {
	vals := map[string]string{}
	if c := upgradeplan.ManagerContainer(tmpl.Spec.InitContainers); c != nil {
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				vals[e.Name] = e.Value
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
				vals[e.Name] = pod.Spec.NodeName
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
				vals[e.Name] = pod.Namespace
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
				vals[e.Name] = pod.Name
			}
		}
	}
	return func(name string) string { return vals[name] }
}

// replaceWhenOutdated is the gate's second job, after the node needs nothing more from its own driver change: it
// follows its pod's DaemonSet's template (templateWatch) and watches its node, and when the DaemonSet's template installs another driver (and, with
// OnRequest, the admin asked for it) it empties the node and evicts its own pod (replace). It returns when its pod
// stops, or with an error the container restarts on.
func (o *UncordonOptions) replaceWhenOutdated(ctx context.Context, base *slog.Logger, out io.Writer) error {
	log := base.With("node", o.NodeName)
	pod, err := o.ownPod(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		log.Info("the driver pod has no DaemonSet: nothing will replace it", "pod", pod.Name)
		<-ctx.Done()
		return nil
	}
	dss, err := watchTemplate(ctx, o.Client, pod.Namespace, owner.Name)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while it started: no failure
		}
		return err
	}
	nodes, err := kwatch.Start(ctx, kwatch.Node(o.Client, o.NodeName), &corev1.Node{})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch node %s: %w", o.NodeName, err)
	}
	shown := ""
	// calledOffAt is the DaemonSet generation at which a plan called the node off (errCalledOff), -1 for none: the
	// node stays in service until a plan marks it again or the template changes
	calledOffAt := int64(-1)
	for {
		ds, dsOK := dss.Get()
		node, nodeOK := nodes.Get("", o.NodeName)
		var why string
		switch {
		case !dsOK || ds.UID != owner.UID || !nodeOK:
			why = "" // the DaemonSet is going (an uninstall): its pod is deleted with it, nothing to replace
		case nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel]) == nodestate.UpgradeFailed:
			why = "" // `upgrade retry` or the admin moves it on
		case calledOffAt == ds.Generation && calledOff(node):
			why = "" // a rollback's plan called it off; its template changes back next
		default:
			if change := upgradeplan.PodChange(pod, &ds.Spec.Template); change != "" {
				why = change
				if o.OnRequest && node.Annotations[UpgradeRequestedAnnotation] != "true" {
					if shown != "request:"+change {
						log.Info("the driver DaemonSet installs another driver; autoUpgrade is off: waiting for the admin's request",
							"change", change, "annotation", UpgradeRequestedAnnotation+"=true")
						shown = "request:" + change
					}
					why = ""
				}
			}
		}
		if why != "" && calledOffAt == ds.Generation && o.stillCalledOff(ctx) {
			why = "" // the watch had not caught up with the call-off the last run read
		}
		if why != "" {
			err := o.replace(ctx, base, out, pod, ds, why, dss.Get, dss.Refresh)
			if err == nil || ctx.Err() != nil {
				<-ctx.Done()
				return nil
			}
			// a failed emptying restored the node and marked it upgrade-failed, or the admin held it back: the old
			// driver serves on
			if errors.Is(err, errCalledOff) {
				calledOffAt = ds.Generation
			}
			if errors.Is(err, errNoLongerOutdated) || errors.Is(err, errCalledOff) {
				log.Info("the driver DaemonSet changed back, or its plan called the node off, before the node was emptied; the old driver stays in service", "err", err)
			} else if errors.Is(err, errHeldMidChange) {
				log.Info("the node was held back while it was emptied; the old driver stays in service", "err", err)
			} else {
				log.Info("emptying the node for the new driver failed; the old driver stays in service", "err", err)
			}
			shown = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-dss.Changed():
		case <-nodes.Changed():
		}
		if err := errors.Join(dss.Err(), nodes.Err()); err != nil && kwatch.Permanent(err) {
			return err
		}
	}
}

// stillCalledOff reads the node afresh: a run that found it called off read it so, and the gate's watch of it may
// not show that yet. An unreadable node counts as not called off: the next run reads it again.
func (o *UncordonOptions) stillCalledOff(ctx context.Context) bool {
	node, err := nodestate.Get(ctx, o.Client, o.NodeName)
	return err == nil && calledOff(node)
}

// ownPod reads the gate's own pod (PodName).
func (o *UncordonOptions) ownPod(ctx context.Context) (*corev1.Pod, error) {
	if o.PodName == "" {
		return nil, errors.New("no pod name: set POD_NAME (the pod's metadata.name) to replace the driver pod when its driver changes")
	}
	pods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return o.Client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("metadata.name", o.PodName),
				fields.OneTermEqualSelector("spec.nodeName", o.NodeName)).String()})
	})
	if err != nil {
		return nil, fmt.Errorf("read the driver pod %s/%s: %w", o.Namespace, o.PodName, err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Name == o.PodName && p.Spec.NodeName == o.NodeName {
			return p, nil
		}
	}
	return nil, &podGoneError{fmt.Errorf("driver pod %s/%s not found on node %s", o.Namespace, o.PodName, o.NodeName)}
}

// replace empties the node under the new template's driver-manager settings, then evicts the gate's own pod.
// base is the gate's logger before it names the node (the driver manager's run names it, as in the init container).
// current is the DaemonSet as the gate's watch has it now; refresh reads it afresh into the watch.
func (o *UncordonOptions) replace(ctx context.Context, base *slog.Logger, out io.Writer, pod *corev1.Pod, ds *appsv1.DaemonSet, why string,
	current func() (*appsv1.DaemonSet, bool), refresh func(context.Context)) error {
	log := base.With("node", o.NodeName)
	if o.ManagerOptions == nil {
		return errors.New("no driver-manager settings reader: cannot empty the node")
	}
	mo, err := o.ManagerOptions(templateEnv(pod, &ds.Spec.Template))
	if err != nil {
		return fmt.Errorf("the driver DaemonSet %s's driver-manager settings: %w", ds.Name, err)
	}
	mo.Client, mo.Log, mo.Now, mo.Lease.Identity = o.Client, base, o.Now, pod.Name
	mo.NodeName, mo.Namespace = o.NodeName, o.Namespace // this node, whatever the template says
	mo.Complete()
	if err := errors.Join(append(scopeErrors(mo.Client, mo.NodeName, mo.Namespace), mo.Lease.validate())...); err != nil {
		return err
	}
	log.Info("the driver DaemonSet installs another driver: emptying the node before this driver pod stops", "change", why, "daemonSet", ds.Name)
	// the template may change back while the node waits for its turn (a rollback mid-rollout): each run under the
	// node's Lease looks again, before it marks the node and after its turn came
	outdated := func(ctx context.Context, confirm bool) string {
		if confirm {
			refresh(ctx) // unreadable: the watched copy judges
		}
		fresh, ok := current()
		if !ok || fresh.UID != ds.UID {
			return "" // the DaemonSet is going (an uninstall): nothing to replace
		}
		return upgradeplan.PodChange(pod, &fresh.Spec.Template)
	}
	if err := mo.empty(ctx, base, out, ds.Name, why, outdated); err != nil {
		return err
	}
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}
	err = apiretry.Do(ctx, func(ctx context.Context) error {
		err := o.Client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, ev)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s emptied, but evicting its old driver pod %s failed (delete it to let the new driver in): %w", o.NodeName, pod.Name, err)
	}
	fmt.Fprintf(out, "node %s emptied for the new driver (%s): old driver pod %s evicted; its DaemonSet starts the new one\n", o.NodeName, why, pod.Name)
	return nil
}

// empty is the old driver pod's half of a driver change: the node's turn (canary, failure threshold, slot), then
// emptyNode, all under the node's Lease as a driver manager's run; it leaves the node pod-restart-required, cordoned,
// its operands paused and its slot held, for the new pod's manager. A node no plan marked (the pre-upgrade hook did
// not run) is marked here, alone in a pool of its DaemonSet with one slot: without the plan, one node per DaemonSet
// at a time. A failure restores the node (failed) and marks it upgrade-failed; a stop leaves it as it is.
// outdated says how the pod's DaemonSet now changes its driver ("" when it no longer does); confirm asks it to read
// the DaemonSet afresh rather than trust a watch that may lag.
func (o *Options) empty(ctx context.Context, log *slog.Logger, out io.Writer, daemonSet, why string, outdated func(ctx context.Context, confirm bool) string) error {
	return o.inTurns(ctx, log, out, true, func(m *manager, ctx context.Context) (string, error) {
		return "", m.emptyForReplacement(ctx, daemonSet, why, outdated)
	})
}

// errNoLongerOutdated: the DaemonSet's template changed back to the pod's driver before the node was emptied.
var errNoLongerOutdated = errors.New("the driver DaemonSet no longer installs another driver")

// calledOff: the node is done with its driver changes (upgrade-done, or no state) and in service.
func calledOff(n *corev1.Node) bool {
	st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
	return (st == nodestate.UpgradeDone || st == "") && !underWay(n)
}

// errCalledOff: a plan judged the node's pod already at the release's driver (a rollback's plan runs before Helm
// changes the template back) while the gate waited for its turn.
var errCalledOff = errors.New("a newer plan called the node off: its pod already runs the driver that release goes to")

// stillOutdated stands the emptying down when the pod's DaemonSet no longer changes its driver. A node whose change
// has started goes on (the new pod's manager finds the driver it keeps); one that holds a slot gives it back. After
// the turn (tookSlot), a node a plan called off meanwhile (upgrade-done, not cordoned) stands down too: the rollback
// that called it off changes the template back only after its plan, and a node its plan left in service must stay
// so, outside the pool's slots.
func (m *manager) stillOutdated(ctx context.Context, outdated func(context.Context, bool) string, tookSlot bool) error {
	if tookSlot && m.agent && !m.o.Stopping && !underWay(m.node) {
		// (a driver pod being deleted empties its node whatever a plan says: its driver stops next)
		fresh, err := nodestate.Get(ctx, m.o.Client, m.o.NodeName)
		if err != nil {
			return &untouchedError{err}
		}
		if calledOff(fresh) {
			m.node = fresh
			giveSlotBack(ctx, m.o.Client, m.o.Namespace, fresh, m.log)
			m.log.Info("a newer plan called the node off while it waited for its turn: nothing to empty")
			return &untouchedError{fmt.Errorf("node %s: %w", m.o.NodeName, errCalledOff)}
		}
	}
	if underWay(m.node) {
		return nil
	}
	// a node a plan called off is put back to wait for its turn only on a fresh read of the template: the rollback
	// whose plan called it off changes the template back right after, and the gate's watch may not show that yet
	if outdated(ctx, calledOff(m.node) && m.agent && !m.o.Stopping) != "" {
		return nil
	}
	// before its turn too: a waiting node takes a freed slot from its watch before this run (slotTurn), and the
	// template may have changed back in between
	giveSlotBack(ctx, m.o.Client, m.o.Namespace, m.node, m.log)
	if m.o.Stopping {
		m.log.Info("the node moved to another driver DaemonSet before its turn: nothing to empty for the one it left")
	} else {
		m.log.Info("the driver DaemonSet changed back to this pod's driver before the node's turn: nothing to empty")
	}
	return &untouchedError{fmt.Errorf("node %s: %w", m.o.NodeName, errNoLongerOutdated)}
}

func (m *manager) emptyForReplacement(ctx context.Context, daemonSet, why string, outdated func(context.Context, bool) string) error {
	if _, err := nodestate.Resume(m.node); err != nil {
		return &untouchedError{err}
	}
	if err := m.stillOutdated(ctx, outdated, false); err != nil {
		return err
	}
	if err := m.followNewPool(ctx); err != nil {
		return &untouchedError{err}
	}
	if _, marked := m.node.Annotations[canary.MarkAnnotation]; !marked && !underWay(m.node) {
		// no plan marked the node (registered again, added after the plan, no plan hook): it follows its pool's
		// plan as the other nodes of its DaemonSet carry it, and without one goes bounded by a pool of its own
		// DaemonSet with one slot. A marked node the plan called off (upgrade-done) waits again in waitTurn.
		mark, _, err := m.siblingMark(ctx)
		if err != nil {
			return &untouchedError{err}
		}
		reason := "its driver pod is out of date (" + why + ") and no upgrade plan marked it: it follows its pool's plan"
		if mark == nil {
			mark = &canary.Mark{Pool: daemonSet, Plan: m.o.Now().UTC().Format(time.RFC3339Nano), Canary: map[string]string{}, MaxUnavailable: 1}
			reason = "its driver pod is out of date (" + why + ") and no upgrade plan marked it: one node of " + daemonSet + " at a time"
		}
		if err := m.remark(ctx, mark, reason); err != nil {
			return &untouchedError{err}
		}
	}
	if err := m.heldBack(ctx, m.node.Annotations[nodestate.DriverDigestAnnotation]); err != nil {
		return &untouchedError{err}
	}
	if err := m.waitTurn(ctx, false); err != nil {
		return err
	}
	if err := m.podStillThere(ctx); err != nil {
		return err
	}
	if err := m.stillOutdated(ctx, outdated, true); err != nil {
		return err
	}
	if err := m.step(ctx, "claim"); err != nil {
		return err
	}
	// the request is served: a later change of an autoUpgrade=false pool needs a new one
	if err := m.apply(ctx, pure(func(n *corev1.Node) nodestate.Patch {
		if _, ok := n.Annotations[UpgradeRequestedAnnotation]; !ok {
			return nodestate.Patch{}
		}
		return nodestate.Patch{Annotations: map[string]*string{UpgradeRequestedAnnotation: nil}}
	})); err != nil {
		return err
	}
	if _, err := m.emptyNode(ctx); err != nil {
		return err
	}
	if err := m.putBackIfHeld(ctx); err != nil {
		return err
	}
	m.log.Info("node emptied: the old driver pod may stop", "state", m.node.Labels[nodestate.UpgradeStateLabel])
	return nil
}

// errPodGone: the stopping driver pod was removed with no grace while its gate waited for the node's turn.
var errPodGone = errors.New("its driver pod is gone")

// podStillThere stands a stopping pod's emptying down, its slot given back, when the pod was removed meanwhile with
// no grace (the pod garbage collector, for a Node deleted and registered again): its containers went with it, its
// driver stopped already, and a newer pod's manager may have taken the node over since.
func (m *manager) podStillThere(ctx context.Context) error {
	if !m.o.Stopping {
		return nil
	}
	_, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.Pod, error) {
		return m.o.Client.CoreV1().Pods(m.o.Namespace).Get(ctx, m.o.Lease.Identity, metav1.GetOptions{})
	})
	if !apierrors.IsNotFound(err) {
		return nil // there, or unreadable: the emptying goes on, as before its turn
	}
	giveSlotBack(ctx, m.o.Client, m.o.Namespace, m.node, m.log)
	m.log.Info("the driver pod was removed with no grace while the node waited for its turn: nothing to empty", "pod", m.o.Lease.Identity)
	return &untouchedError{fmt.Errorf("node %s: %w (%s)", m.o.NodeName, errPodGone, m.o.Lease.Identity)}
}

// errHeldMidChange: the admin labelled the node to skip driver changes while it was emptied.
var errHeldMidChange = errors.New("held back mid-change")

// putBackIfHeld is the last look before the old driver pod stops: a node the admin labelled to skip driver changes
// meanwhile still has its old driver loaded and serving, so it goes back into service with it (operands resumed,
// our cordon lifted, its slot given back, upgrade-required). The gate then waits for the label to go and starts the
// change over.
func (m *manager) putBackIfHeld(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, m.o.APITimeout)
	node, err := nodestate.Get(gctx, m.o.Client, m.o.NodeName)
	cancel()
	if err != nil {
		return err
	}
	if node.Labels[nodestate.UpgradeSkipLabel] != "true" {
		return nil
	}
	reason := fmt.Sprintf("held back (%s=true set during its change): its old driver is back in service; the change starts over once the label is removed",
		nodestate.UpgradeSkipLabel)
	if err := m.apply(ctx, nodestate.Resume, pure(nodestate.Uncordon), m.state(nodestate.UpgradeRequired, reason)); err != nil {
		return err
	}
	giveSlotBack(ctx, m.o.Client, m.o.Namespace, m.node, m.log)
	m.log.Info("node labelled to skip driver changes while it was emptied: back in service with its old driver", "label", nodestate.UpgradeSkipLabel)
	return &untouchedError{fmt.Errorf("node %s: %w: %s", m.o.NodeName, errHeldMidChange, reason)}
}
