package drivermanager

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

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
