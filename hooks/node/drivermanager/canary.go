package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/slots"
)

// waitTurn holds a planned driver change before it starts (before the cordon) until the node's turn under its
// plan's mark (package canary): a node that is not its pool's canary waits until the canary validated, and every
// node of a pool at its failure threshold holds until an admin acts. It waits on watches of the nodes its turn reads
// (watchTurn) and changes nothing on the node but the reason its state shows. A node without a mark (not in
// a plan: registered again, added to the pool after it) takes the latest mark of its DaemonSet's other nodes
// (inheritMark); with none (no plan ever ran for the pool) it goes at once. A node that already started its change
// (past upgrade-required, or cordoned by an earlier run) goes on: it is out of service already, and waiting would
// only keep it so; a node a newer plan called off (upgrade-done) whose pod changes its driver waits again.
// An unreadable mark refuses before anything changed: the node keeps its driver and its GPU pods.
//
// A node whose turn came takes one of its pool's slots (package slots; the mark's maxUnavailable) before it goes:
// a full pool holds it as the canary does, until a node of the pool gives its slot back. So the pool's nodes out of
// service never exceed its maxUnavailable, even when the DaemonSet replaces an un-Ready old driver pod outside its
// own bound.
//
// Under the node's Lease (block false) it only looks once: a node whose turn has not come shows why, hands the
// canary its turn, and returns errTurnHeld, so that Run waits (block true) without the Lease, whose renewals would
// be the one steady request stream of a waiting node, and starts over under the Lease when the turn comes. A node
// held by a full pool also watches the pool's slots Lease while it waits, and looks again after Options.SlotRecheck
// however full the Lease shows the pool, so that a holder whose give-back was lost is dropped (slots.Pool.Take).
func (m *manager) waitTurn(ctx context.Context, block bool) error {
	if underWay(m.node) {
		return nil // its change started (a later plan set it back to upgrade-required mid-change): it is out already
	}
	mark, err := canary.Read(m.node)
	if err != nil {
		return &untouchedError{fmt.Errorf("%w; nothing changed, the loaded driver stays: run the upgrade again to plan anew, or remove the annotation "+
			"(kubectl annotate node %s %s-) to let this node change without waiting for its pool's canary", err, m.o.NodeName, canary.MarkAnnotation)}
	}
	if mark == nil {
		if mark, err = m.inheritMark(ctx); err != nil {
			return &untouchedError{err}
		}
	}
	if mark == nil {
		m.log.Info("no plan mark on the node or its DaemonSet's other nodes: its driver change does not wait for a canary", "annotation", canary.MarkAnnotation)
		return nil
	}
	if nodestate.UpgradeState(m.node.Labels[nodestate.UpgradeStateLabel]) != nodestate.UpgradeRequired {
		// a newer plan called the node off (upgrade-done: it judged the node by the driver it runs), yet this pod
		// installs another driver: a change like any other, which waits for its turn and a slot
		why := "its driver pod installs another driver than the one the node runs: waiting for its turn"
		if err := m.apply(ctx, m.state(nodestate.UpgradeRequired, why)); err != nil {
			return &untouchedError{err}
		}
	}
	shown := m.node.Annotations[nodestate.UpgradeReasonAnnotation]
	lookedForMove := false
	left := false // a stopping pod's node left the DaemonSet it waits to be emptied for
	for {
		// the watches follow the mark's canary nodes: a new plan naming others starts them over
		watched := slices.Sorted(maps.Keys(mark.Canary))
		rctx, cancel := context.WithCancel(ctx)
		var stores []*kwatch.Store[*corev1.Node]
		stores, err = m.turns.start(watched, m.watchTurn)
		if err != nil {
			cancel()
			return &untouchedError{fmt.Errorf("node %s: watch the nodes of pool %s for its canary and failures: %w", m.o.NodeName, mark.Pool, err)}
		}
		var also []<-chan struct{}
		var slotsStore *kwatch.Store[*coordinationv1.Lease]
		var graceOver atomic.Bool // Options.SlotRecheck passed since the wait began
		if block && m.slotsFull && mark.MaxUnavailable > 0 {
			if slotsStore, err = kwatch.Start(rctx, kwatch.Lease(m.o.Client, m.o.Namespace, slots.Name(mark.SlotsName())), &coordinationv1.Lease{}); err != nil {
				cancel()
				return &untouchedError{fmt.Errorf("node %s: watch the slots of pool %s: %w", m.o.NodeName, mark.Pool, err)}
			}
			timer := make(chan struct{}, 1)
			recheck := time.AfterFunc(m.recheckAfter(), func() { graceOver.Store(true); timer <- struct{}{} })
			context.AfterFunc(rctx, func() { recheck.Stop() })
			also = []<-chan struct{}{slotsStore.Changed(), timer}
		}
		rewatch := false
		err = kwatch.UntilAllOr(rctx, stores, also, func(nodes []*corev1.Node) (bool, error) {
			// the node's own mark from the watch: a new plan meanwhile names a new canary
			if i := slices.IndexFunc(nodes, func(n *corev1.Node) bool { return n.Name == m.o.NodeName }); i >= 0 {
				self := nodes[i]
				if nodestate.UpgradeState(self.Labels[nodestate.UpgradeStateLabel]) != nodestate.UpgradeRequired {
					return true, nil // moved on by someone else: the upgrade path reads it afresh
				}
				if block && m.leftPoolDaemonSet(self) {
					left = true
					return true, nil // a fresh run under the Lease finds the DaemonSet that takes the node over now
				}
				switch fresh, err := canary.Read(self); {
				case err == nil && fresh == nil:
					return true, nil // the admin removed the mark: no canary to wait for
				case err == nil:
					mark = fresh
				}
				if !slices.Equal(watched, slices.Sorted(maps.Keys(mark.Canary))) {
					rewatch = true
					return true, nil
				}
			}
			turn := canary.Decide(m.o.NodeName, mark, nodes)
			if !turn.Go && len(turn.Pending) == 0 && !block && !lookedForMove {
				// held at a pool's failure threshold: the pool's, or one the node has left
				lookedForMove = true
				moved, err := m.movedPool(ctx, mark)
				if err != nil {
					return false, err
				}
				if moved != nil {
					mark, rewatch = moved, true
					return true, nil
				}
			}
			slotLooked := turn.Go && mark.MaxUnavailable > 0
			if slotLooked {
				var err error
				if turn, err = m.slotTurn(ctx, mark, block, slotsStore, graceOver.Load()); err != nil {
					return false, err
				}
			}
			if turn.Go {
				return true, nil
			}
			if turn.Waiting != shown {
				m.log.Info("driver change held", "why", turn.Waiting)
				if err := m.apply(ctx, func(n *corev1.Node) (nodestate.Patch, error) {
					if nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) != nodestate.UpgradeRequired {
						return nodestate.Patch{}, nil // moved on meanwhile: the next event ends the wait
					}
					return nodestate.SetUpgradeState(n, nodestate.UpgradeRequired, turn.Waiting, m.now()), nil
				}); err != nil {
					return false, err
				}
				shown = turn.Waiting
			}
			if !block {
				if !slotLooked && mark.MaxUnavailable > 0 {
					m.giveBackWhileHeld(ctx, mark)
				}
				return false, errTurnHeld
			}
			return false, nil
		})
		cancel()
		// the look under the Lease that holds the node hands its watches to the wait that follows, which would list
		// the same nodes again. Not the wait to the fresh run under the Lease when the turn comes: that run decides
		// from watches listed after its own writes (a kept watch may not show yet the upgrade-required it wrote, and
		// the node would look moved on by someone else)
		if !errors.Is(err, errTurnHeld) {
			m.turns.drop()
		}
		if err != nil || !rewatch {
			break
		}
	}
	if errors.Is(err, errTurnHeld) {
		return &untouchedError{&heldError{m: m}}
	}
	if err != nil {
		return &untouchedError{fmt.Errorf("node %s: stopped while its driver change was held (%w); nothing changed on the node, the loaded driver stays", m.o.NodeName, err)}
	}
	if block && left {
		m.log.Info("the node moved to another driver DaemonSet while it waited: looking again under the node's lease", "left", m.o.PoolDaemonSet.Name)
		return nil
	}
	if block {
		m.log.Info("the node's turn came: starting over under the node's lease", "pool", mark.Pool, "canary", mark.Canary)
		return nil
	}
	if !m.agent || m.o.Stopping {
		// the wait also ends when the node is no longer upgrade-required: a newer plan may have called it off
		// (upgrade-done) after this run read it, judging it by this pod's config while the host runs another
		// driver (or, for a driver pod being deleted, by the next pod waiting on the node). That is no turn: it
		// waits for one again, as a node found called off does. (The old pod's agent stands down instead: its
		// DaemonSet's template changed back, stillOutdated)
		fresh, err := nodestate.Get(ctx, m.o.Client, m.o.NodeName)
		if err != nil {
			return &untouchedError{err}
		}
		if st := nodestate.UpgradeState(fresh.Labels[nodestate.UpgradeStateLabel]); st == nodestate.UpgradeDone || st == "" {
			m.node = fresh
			// in service, it holds no slot while it waits: kept, a node called off at each turn would hold it for good
			giveSlotBack(ctx, m.o.Client, m.o.Namespace, fresh, m.log)
			m.log.Info("a newer plan called the node off while it waited, yet this pod installs another driver: waiting for its turn again")
			return m.waitTurn(ctx, block)
		}
	}
	m.log.Info("the pool's canary validated: the driver change goes ahead", "pool", mark.Pool, "canary", mark.Canary)
	return nil
}

// slotTurn is the turn of a node its canary and threshold let go: under the Lease (block false) it takes one of the
// pool's slots, or says who holds them all; while it waits (block true) it takes a slot the slots Lease shows free
// and goes, or goes Options.SlotRecheck after the wait began, for a fresh run's Take to drop stale claims.
func (m *manager) slotTurn(ctx context.Context, mark *canary.Mark, block bool, store *kwatch.Store[*coordinationv1.Lease], graceOver bool) (canary.Turn, error) {
	pool := slots.Pool{Client: m.o.Client, Namespace: m.o.Namespace, Name: mark.SlotsName(), Max: mark.MaxUnavailable}
	// the reason names the pool's bound, not its holders: the holders change with every slot given back, and each
	// waiting node of the pool would write its reason again each time (the slots Lease names them)
	waiting := func() canary.Turn {
		return canary.Turn{Waiting: fmt.Sprintf("waiting for a slot of pool %s: %d of its nodes, its maxUnavailable, are out of service (the holders: kubectl get lease -n %s %s)",
			mark.Pool, mark.MaxUnavailable, m.o.Namespace, slots.Name(mark.SlotsName()))}
	}
	if !block {
		claim, err := pool.Take(ctx, m.o.NodeName, m.o.Now())
		if err != nil {
			return canary.Turn{}, &untouchedError{fmt.Errorf("%w; nothing changed, the loaded driver stays", err)}
		}
		m.slotsFull = !claim.Taken
		switch {
		case claim.Lost:
			m.log.Info("another node took the free slot first: waiting on the pool's slots", "pool", mark.Pool)
			return waiting(), nil
		case !claim.Taken:
			m.log.Info("the pool's slots are all held", "pool", mark.Pool, "holders", strings.Join(claim.Holders, ", "))
			return waiting(), nil
		}
		m.log.Info("took a slot of the pool", "pool", mark.Pool, "maxUnavailable", mark.MaxUnavailable)
		return canary.Turn{Go: true}, nil
	}
	if store == nil || graceOver {
		return canary.Turn{Go: true}, nil
	}
	look := func() (*coordinationv1.Lease, bool) {
		lease, ok := store.Get(m.o.Namespace, slots.Name(mark.SlotsName()))
		if !ok {
			return nil, true // the pool's slots were reset
		}
		holders, err := slots.Holders(lease)
		return lease, err != nil || len(holders) < mark.MaxUnavailable // a fresh run's Take says what is wrong, or takes the free slot
	}
	lease, free := look()
	if free && m.o.SlotJitter > 0 {
		// the pool's other waiters saw the slot freed too: one of them may take it first (the watch shows it)
		select {
		case <-ctx.Done():
			return canary.Turn{}, ctx.Err()
		case <-time.After(rand.N(m.o.SlotJitter)):
		}
		lease, free = look()
	}
	if !free {
		return waiting(), nil
	}
	if lease == nil {
		return canary.Turn{Go: true}, nil // no Lease: a fresh run's Take creates it
	}
	// the waiting node takes the slot itself, holding no node Lease, on the Lease as its watch shows it: of the
	// pool's waiters that saw the slot freed, the ones that lose the race spend one refused write each, where each
	// went for its node's Lease, read its node and watched again to find it taken (a slot freed wakes every waiter
	// of the pool). The winner's fresh run under the Lease finds the slot its own, or gives it back when its turn
	// has gone meanwhile (waitTurn).
	taken, err := pool.TakeSeen(ctx, lease, m.o.NodeName, m.o.Now())
	switch {
	case ctx.Err() != nil:
		return canary.Turn{}, ctx.Err()
	case err != nil || taken:
		return canary.Turn{Go: true}, nil // on an error, a fresh run's Take says what is wrong
	}
	return waiting(), nil // lost the race: the watch shows the winner next
}

// recheckAfter is how long a node held by a full pool waits on the slots Lease alone before it looks again:
// Options.SlotRecheck, plus a random part of up to half of it. Every waiting node of a pool began to wait at the
// rollout's start; without the spread they would all look again at once, every SlotRecheck, each taking its node
// Lease and reading its node and the slots Lease in the same second.
func (m *manager) recheckAfter() time.Duration {
	d := m.o.SlotRecheck
	if spread := d / 2; spread > 0 {
		d += rand.N(spread)
	}
	return d
}

// giveBackWhileHeld gives back a slot of the mark's pool that the node holds while its turn has not come: it took
// it while it waited (slotTurn), and its turn went meanwhile (its pool reached its failure threshold, a new plan
// named another canary), or a run that took it stopped before its cordon. A waiting node is in service: kept, the
// claim held one of the pool's slots from nodes whose turn it is until the claim grace ran out. Best effort: a
// give-back that fails leaves the claim to that grace.
func (m *manager) giveBackWhileHeld(ctx context.Context, mark *canary.Mark) {
	pool := slots.Pool{Client: m.o.Client, Namespace: m.o.Namespace, Name: mark.SlotsName(), Max: mark.MaxUnavailable}
	held, err := pool.GiveBack(ctx, m.o.NodeName)
	switch {
	case err != nil:
		m.log.Info("could not give back the slot of a node whose turn has not come: it counts until the claim grace ends", "err", err, "grace", slots.ClaimGrace)
	case held:
		m.log.Info("gave back the node's slot: its turn has not come", "pool", mark.Pool)
	}
}

// leftPoolDaemonSet: a stopping driver pod's run empties its node for the DaemonSet that takes it over
// (Options.PoolDaemonSet), and that DaemonSet no longer selects the node (an admin moved it to another pool again).
func (m *manager) leftPoolDaemonSet(self *corev1.Node) bool {
	if !m.o.Stopping || m.o.PoolDaemonSet == nil {
		return false
	}
	fits, err := schedule.FitsDaemonSet(&m.o.PoolDaemonSet.Spec.Template.Spec, self)
	return err == nil && !fits
}

// errTurnHeld ends waitTurn's look under the Lease at a node whose turn has not come.
var errTurnHeld = errors.New("driver change held until its turn")

// heldError is Run's signal from a run under the Lease that its node must wait for its turn: Run waits with m
// outside the Lease, then starts a fresh run.
type heldError struct{ m *manager }

func (e *heldError) Error() string { return errTurnHeld.Error() }

// turnWatches are the watches of a node's turn (watchTurn), kept from the look under the node's Lease that finds
// the node held to the wait without the Lease that follows it. They run under Run's context, not the look's, and
// end with drop (at the end of the wait, or a new plan naming other canaries) or when inTurns returns.
type turnWatches struct {
	outer    context.Context
	canaries []string
	stores   []*kwatch.Store[*corev1.Node]
	stop     context.CancelFunc
}

// start returns the kept watches when they follow the same canaries, else starts new ones (and keeps them).
func (t *turnWatches) start(canaries []string, watch func(context.Context, []string) ([]*kwatch.Store[*corev1.Node], error)) ([]*kwatch.Store[*corev1.Node], error) {
	if t.stores != nil && slices.Equal(t.canaries, canaries) && !t.failed() {
		return t.stores, nil
	}
	t.drop()
	ctx, stop := context.WithCancel(t.outer)
	stores, err := watch(ctx, canaries)
	if err != nil {
		stop()
		return nil, err
	}
	t.canaries, t.stores, t.stop = slices.Clone(canaries), stores, stop
	return stores, nil
}

// failed: a kept watch ended with an error retrying cannot fix; new ones say what it is.
func (t *turnWatches) failed() bool {
	for _, s := range t.stores {
		if s.Err() != nil {
			return true
		}
	}
	return false
}

func (t *turnWatches) drop() {
	if t.stop != nil {
		t.stop()
	}
	t.canaries, t.stores, t.stop = nil, nil, nil
}

// watchTurn watches just the nodes Decide reads, each selected by the API server, so that a wait costs the same in
// a pool of ten nodes or a thousand: the nodes in upgrade-failed (of every pool: Decide counts its own pool's),
// the nodes under a revert DaemonSet (a reverted change failed too), this node (its mark, and whether someone moved it
// on), and each of the canary nodes.
func (m *manager) watchTurn(ctx context.Context, canaries []string) ([]*kwatch.Store[*corev1.Node], error) {
	srcs := []*kwatch.Source{
		kwatch.Nodes(m.o.Client, nodestate.UpgradeStateLabel+"="+string(nodestate.UpgradeFailed)),
		kwatch.Nodes(m.o.Client, nodestate.RevertLabel), // reverted nodes failed too (canary.Decide)
		kwatch.Node(m.o.Client, m.o.NodeName),
	}
	for _, name := range canaries {
		if name != m.o.NodeName {
			srcs = append(srcs, kwatch.Node(m.o.Client, name))
		}
	}
	stores := make([]*kwatch.Store[*corev1.Node], 0, len(srcs))
	for _, src := range srcs {
		s, err := kwatch.Start(ctx, src, &corev1.Node{})
		if err != nil {
			return nil, err
		}
		stores = append(stores, s)
	}
	return stores, nil
}
