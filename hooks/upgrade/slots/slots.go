// Package slots bounds how many nodes of a driver pool are out of service at once, whatever replaces their driver
// pods. The DaemonSet's rolling update counts un-Ready new pods against maxUnavailable, but it replaces an old pod
// that is not Ready at once, outside the bound, and an admin or a tool may delete driver pods too: each such pod's
// driver manager would start one more node's change. So a driver manager takes one of its pool's slots before it
// cordons, and the upgrade gate gives it back once the node is upgrade-done.
//
// The slots of a pool are one coordination.k8s.io Lease in the release namespace (Name), labelled as the driver
// managers' node Leases are, so that the pre-delete cleanup removes it. HoldersAnnotation holds the holders as a
// JSON object, node name to the time it took the slot. Every write carries the Lease's resourceVersion, so claims
// are taken one after another: two managers racing for the last slot cannot both get it. A holder counts until it
// gives its slot back; when the pool is full, each holder is checked on its node (Out) and one that is no longer
// out of service (finished, deleted, its claim never followed by a cordon) is dropped, so a lost give-back never
// holds a pool for good.
package slots

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const (
	// Prefix starts the name of every pool's slots Lease.
	Prefix = "kube-gpu-stack-slots-"
	// HoldersAnnotation holds the pool's slot holders on its Lease.
	HoldersAnnotation = nodestate.AnnotationPrefix + "slot-holders"
	// ClaimGrace is how long a holder whose node shows no change yet (upgrade-required, not cordoned) still counts:
	// its manager took the slot and writes cordon-required next. Past it the claim is stale (the pod stopped in
	// between) and is dropped when the pool is full; the node's next driver pod claims again.
	ClaimGrace = 2 * time.Minute
)

// Name is the slots Lease of pool.
func Name(pool string) string {
	name := Prefix + strings.ToLower(pool)
	if len(name) <= 63 && validName(name) {
		return name
	}
	sum := sha256.Sum256([]byte(pool))
	return Prefix + hex.EncodeToString(sum[:8])
}

// validName: a DNS label of lower-case letters, digits and '-', as a Lease name must be (a pool name may be any
// string values allow).
func validName(s string) bool {
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return !strings.HasSuffix(s, "-")
}

// Pool names the slots a claim or give-back is about.
type Pool struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the pool's name (the plan's mark names it); Max its maxUnavailable as a number of nodes.
	Name string
	Max  int
}

// Claim is the outcome of Take.
type Claim struct {
	// Taken: the node holds a slot (it may have held it already: a restarted manager takes its own slot back).
	Taken bool
	// Holders are the pool's holders when the pool was full, sorted (Taken false).
	Holders []string
	// Lost: a slot was free, and another node's write landed between this one's read and its write (Taken false).
	// The node waits on the slots Lease as a node of a full pool does, and goes for a slot the Lease shows free
	// (TakeSeen), rather than reading and racing again at once: at a rollout's start every node of the pool goes
	// for the first slots together, and each loser racing again read and wrote once more for every slot taken.
	Lost bool
}

// Take gives node one of the pool's slots if one is free. A full pool's holders are first checked on their nodes
// (Out) and those no longer out dropped. A race for a free slot lost to another node's write takes nothing
// (Claim.Lost); a node's own slot, stamped again, is read and written again until it lands. now stamps the claim.
// An unreadable holders annotation is an error that names the Lease: nothing is taken.
func (p Pool) Take(ctx context.Context, node string, now time.Time) (Claim, error) {
	if p.Max < 1 {
		return Claim{}, fmt.Errorf("pool %s: maxUnavailable %d: want at least 1 node", p.Name, p.Max)
	}
	leases := p.Client.CoordinationV1().Leases(p.Namespace)
	var claim Claim
	err := retryConflicts(ctx, func(ctx context.Context) error {
		claim = Claim{}
		lease, holders, err := p.read(ctx)
		if err != nil {
			return err
		}
		if lease == nil {
			lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: Name(p.Name), Namespace: p.Namespace,
				Labels: map[string]string{nodestate.DriverManagerLeaseLabel: "true"}}}
			if err := write(lease, map[string]string{node: stamp(now)}); err != nil {
				return err
			}
			_, err := leases.Create(ctx, lease, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				claim.Lost = true // another node created it, taking the first slot
				return nil
			}
			claim.Taken = err == nil
			return err
		}
		if _, ok := holders[node]; ok {
			// its own slot (taken before a wait, or by its previous manager): the claim is stamped again, by an
			// update that conflicts with a concurrent drop of it as stale. Either this one wins and the claim is
			// fresh for the cordon that follows, or the drop does and the node takes a slot anew, or waits.
			holders[node] = stamp(now)
			if err := write(lease, holders); err != nil {
				return err
			}
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
			claim.Taken = err == nil
			return err
		}
		if len(holders) >= p.Max {
			if err := p.dropIdle(ctx, holders, now); err != nil {
				return err
			}
		}
		if len(holders) >= p.Max {
			claim.Holders = slices.Sorted(maps.Keys(holders))
			return nil
		}
		holders[node] = stamp(now)
		if err := write(lease, holders); err != nil {
			return err
		}
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{}) // carries the read's resourceVersion
		if apierrors.IsConflict(err) {
			claim.Lost = true
			return nil
		}
		claim.Taken = err == nil
		return err
	})
	if err != nil {
		return Claim{}, fmt.Errorf("pool %s: take a slot for node %s (lease %s/%s): %w", p.Name, node, p.Namespace, Name(p.Name), err)
	}
	return claim, nil
}

// TakeSeen is Take on the slots Lease as a watch showed it (seen), without reading it again: each waiting node
// that saw a slot freed goes for it with one write carrying the seen resourceVersion. A conflict (the Lease changed
// since: most often another waiter took the slot first) takes nothing and is no error; the watch shows the change
// next. Read afresh, every loser of each freed slot would read the Lease again only to find the pool full. A seen
// Lease with every slot held takes nothing either: Take drops the holders no longer out. Any other error is
// returned as is, and the claim may have landed: Take, reading afresh, finds it.
func (p Pool) TakeSeen(ctx context.Context, seen *coordinationv1.Lease, node string, now time.Time) (bool, error) {
	holders, err := Holders(seen)
	if err != nil {
		return false, err
	}
	if _, own := holders[node]; !own && len(holders) >= p.Max {
		return false, nil
	}
	lease := seen.DeepCopy()
	holders[node] = stamp(now)
	if err := write(lease, holders); err != nil {
		return false, err
	}
	_, err = p.Client.CoordinationV1().Leases(p.Namespace).Update(ctx, lease, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("pool %s: take a slot for node %s (lease %s/%s): %w", p.Name, node, p.Namespace, lease.Name, err)
	}
	return true, nil
}

// Give gives node's slot back (nothing when it holds none, or the pool has no slots Lease).
func (p Pool) Give(ctx context.Context, node string) error {
	_, err := p.GiveBack(ctx, node)
	return err
}

// GiveBack is Give that also says whether node held a slot of the pool.
func (p Pool) GiveBack(ctx context.Context, node string) (held bool, err error) {
	if held, err = give(ctx, p.Client, p.Namespace, Name(p.Name), node); err != nil {
		return false, fmt.Errorf("pool %s: give back node %s's slot (lease %s/%s): %w", p.Name, node, p.Namespace, Name(p.Name), err)
	}
	return held, nil
}

// GiveEverywhere gives back each slot node holds, in every pool of namespace: a node back in service holds none,
// whichever pool it took one of. Its plan mark names the pool it is in now, and a node that moved between pools, or
// lost its mark with its Node object, kept the claim it took under another until the claim grace ran out.
// It returns the names of the slots Leases it gave a claim back to.
func GiveEverywhere(ctx context.Context, client kubernetes.Interface, namespace, node string) ([]string, error) {
	list, err := apiretry.Value(ctx, func(ctx context.Context) (*coordinationv1.LeaseList, error) {
		return client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: nodestate.DriverManagerLeaseLabel + "=true"})
	})
	if err != nil {
		return nil, fmt.Errorf("list the pools' slots in %s to give back node %s's: %w", namespace, node, err)
	}
	var given []string
	var errs []error
	for i := range list.Items {
		l := &list.Items[i]
		if !strings.HasPrefix(l.Name, Prefix) {
			continue
		}
		if holders, err := Holders(l); err == nil {
			if _, ok := holders[node]; !ok {
				continue
			}
		}
		held, err := give(ctx, client, namespace, l.Name, node)
		if err != nil {
			errs = append(errs, fmt.Errorf("give back node %s's slot (lease %s/%s): %w", node, namespace, l.Name, err))
			continue
		}
		if held {
			given = append(given, l.Name)
		}
	}
	return given, errors.Join(errs...)
}

// give removes node from the holders of the slots Lease name, and says whether it was one (false when it was not,
// or there is no such Lease).
func give(ctx context.Context, client kubernetes.Interface, namespace, name, node string) (held bool, err error) {
	leases := client.CoordinationV1().Leases(namespace)
	err = retryConflicts(ctx, func(ctx context.Context) error {
		held = false
		lease, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		holders, err := Holders(lease)
		if err != nil {
			return err
		}
		if _, ok := holders[node]; !ok {
			return nil
		}
		delete(holders, node)
		if err := write(lease, holders); err != nil {
			return err
		}
		if _, err = leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			return err
		}
		held = true
		return nil
	})
	return held, err
}

// read is the pool's slots Lease and its holders; no Lease (nil, and no error) when the pool has none yet.
func (p Pool) read(ctx context.Context) (*coordinationv1.Lease, map[string]string, error) {
	lease, err := p.Client.CoordinationV1().Leases(p.Namespace).Get(ctx, Name(p.Name), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	}
	holders, err := Holders(lease)
	return lease, holders, err
}

// dropIdle removes from holders each one whose node is no longer out of service (Out), reading each node. A claim
// younger than ClaimGrace counts without a read: its node is about to change, or changing, or (a give-back lost)
// done a moment ago; the read would only free that slot up to ClaimGrace early, at a read of every holder's node
// for each waiting node that looks.
func (p Pool) dropIdle(ctx context.Context, holders map[string]string, now time.Time) error {
	for _, name := range slices.Sorted(maps.Keys(holders)) {
		if t, err := time.Parse(time.RFC3339, holders[name]); err == nil && now.Sub(t) < ClaimGrace {
			continue
		}
		n, err := p.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			delete(holders, name)
		case err != nil:
			return err
		case !Out(n, holders[name], now):
			delete(holders, name)
		}
	}
	return nil
}

// Out says whether a holder's node is out of service for its driver change: in one of the change's states
// (cordon-required to uncordon-required), upgrade-failed, or cordoned by the upgrade; or it took its slot (at
// claimed) less than ClaimGrace ago and its manager is about to write cordon-required (its node upgrade-required, or
// upgrade-done when a new plan called it off meanwhile). An unreadable claim time
// counts as a fresh claim: damage never frees a slot early.
func Out(n *corev1.Node, claimed string, now time.Time) bool {
	if nodestate.CordonedByUs(n) {
		return true
	}
	switch nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel]) {
	case nodestate.CordonRequired, nodestate.PodDeletionRequired, nodestate.DrainRequired, nodestate.PodRestartRequired,
		nodestate.ValidationRequired, nodestate.UncordonRequired, nodestate.UpgradeFailed:
		return true
	case nodestate.UpgradeRequired, nodestate.UpgradeDone:
		// a fresh claim whose cordon is not written yet counts, whatever the state says meanwhile: a new plan calls a
		// waiting node off (upgrade-done) even right after its manager took the slot, and that manager cordons next
		t, err := time.Parse(time.RFC3339, claimed)
		return err != nil || now.Sub(t) < ClaimGrace
	}
	return false
}

// Holders reads a slots Lease's holders (node name to claim time).
func Holders(lease *coordinationv1.Lease) (map[string]string, error) {
	holders := map[string]string{}
	raw, ok := lease.Annotations[HoldersAnnotation]
	if !ok || raw == "" {
		return holders, nil
	}
	if err := json.Unmarshal([]byte(raw), &holders); err != nil {
		return nil, fmt.Errorf("lease %s/%s: annotation %s=%q is not a JSON object of node names to times: %w; "+
			"delete the Lease to reset the pool's slots (the DaemonSet's maxUnavailable still bounds its rollout)",
			lease.Namespace, lease.Name, HoldersAnnotation, raw, err)
	}
	return holders, nil
}

func write(lease *coordinationv1.Lease, holders map[string]string) error {
	b, err := json.Marshal(holders) // sorted keys: the same holders write the same bytes
	if err != nil {
		return err
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[HoldersAnnotation] = string(b)
	return nil
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// retryConflicts runs f until it succeeds, fails for good, or ctx ends: a conflict (another manager wrote the Lease
// since f read it) reads and decides again after a short pause, and errors that may pass wait apiretry's backoff.
func retryConflicts(ctx context.Context, f func(context.Context) error) error {
	return apiretry.OnConflict(ctx, f)
}
