package drivermanager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// Two driver managers meet on one node when a pool's node selector changes (the old pool's pod is still stopping
// while the new pool's starts) or when a driver pod terminates slowly during a rollout (the DaemonSet's next pod
// is already in its init container). Each run therefore holds a coordination.k8s.io Lease named after the node
// (LeaseName) in the release namespace from before it reads the node until it ends: the second manager waits,
// then reads the node and the host afresh and sees what the first left. A normal end releases the Lease; a killed
// holder stops renewing it and the next manager takes over once it expires (Lease.Duration).

// Lease defaults: short, so a killed holder delays the next manager by seconds only.
const (
	DefaultLeaseDuration      = 15 * time.Second
	DefaultLeaseRenewDeadline = 10 * time.Second
	DefaultLeaseRetryPeriod   = 2 * time.Second
	// LeasePrefix starts every node's Lease name.
	LeasePrefix = "kube-gpu-stack-driver-"
)

// Lease configures the per-node Lease a run holds.
type Lease struct {
	// Identity names this manager in the Lease (POD_NAME; default the host name). A restarted init container of
	// the same pod has the same identity and takes its own Lease back at once.
	Identity string
	// Duration is how long an unrenewed Lease keeps others out (whole seconds; the Lease stores seconds);
	// RenewDeadline how long the holder keeps trying to renew before it gives up and stops; RetryPeriod the
	// interval of both the renewals and a waiting manager's tries.
	Duration, RenewDeadline, RetryPeriod time.Duration
}

func (l *Lease) complete() {
	if l.Identity == "" {
		l.Identity, _ = os.Hostname()
	}
	if l.Duration <= 0 {
		l.Duration = DefaultLeaseDuration
	}
	if l.RenewDeadline <= 0 {
		l.RenewDeadline = DefaultLeaseRenewDeadline
	}
	if l.RetryPeriod <= 0 {
		l.RetryPeriod = DefaultLeaseRetryPeriod
	}
}

func (l *Lease) validate() error {
	var errs []error
	if l.Identity == "" {
		errs = append(errs, errors.New("no lease identity: set POD_NAME (the pod's metadata.name)"))
	}
	if l.Duration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("lease duration %s: want whole seconds (a Lease stores seconds)", l.Duration))
	}
	if l.Duration <= l.RenewDeadline || float64(l.RenewDeadline) <= leaderelection.JitterFactor*float64(l.RetryPeriod) {
		errs = append(errs, fmt.Errorf("lease timing: want duration (%s) > renew deadline (%s) > %.1f x retry period (%s)",
			l.Duration, l.RenewDeadline, leaderelection.JitterFactor, l.RetryPeriod))
	}
	return errors.Join(errs...)
}

// LeaseName is the name of node's Lease: LeasePrefix and the node name, cut and suffixed with a hash when the
// whole would pass the 253 characters of an object name.
func LeaseName(node string) string {
	name := LeasePrefix + node
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return name[:253-17] + "-" + hex.EncodeToString(sum[:8])
}

// errLeaseLost is the stop cause of a run whose Lease another manager took (renewals failed for RenewDeadline).
var errLeaseLost = errors.New("lost the node's driver-manager lease")

// withLease runs body while holding the node's Lease. body's context ends when ctx does (the pod stops) or when
// the Lease is lost, with that cause: both are stops, never failures. Waiting for the Lease ends only with ctx.
// body learns whether the Lease was there before this run: a driver manager of the release ran on the node before
// (the pre-delete cleanup removes the Leases, a Node's deletion does not).
func (o *Options) withLease(ctx context.Context, log *slog.Logger, body func(ctx context.Context, known bool) error) error {
	l := o.Lease
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.Namespace, Name: LeaseName(o.NodeName)},
		Labels:     map[string]string{nodestate.DriverManagerLeaseLabel: "true"},
		Client:     o.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.Identity},
	}
	rec, _, err := lock.Get(ctx)
	known := err == nil
	if apierrors.IsForbidden(err) {
		// the elector would retry a refusal for ever: say at once what is missing
		return fmt.Errorf("node %s: may not read the driver-manager lease %s/%s (the chart's Role grants leases get, create and update in the release namespace); nothing changed: %w",
			o.NodeName, o.Namespace, lock.LeaseMeta.Name, err)
	}
	if err == nil && rec.HolderIdentity != "" && rec.HolderIdentity != l.Identity {
		log.Info("another driver manager holds the node's lease: waiting for it to end or expire",
			"lease", o.Namespace+"/"+lock.LeaseMeta.Name, "holder", rec.HolderIdentity, "duration", l.Duration)
	}
	lctx, release := context.WithCancel(ctx)
	defer release()
	// the callback runs in its own goroutine: started/abandoned settle whether body runs once Run has returned
	var mu sync.Mutex
	started, abandoned := false, false
	ended := make(chan struct{})
	le, lerr := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            lock.LeaseMeta.Name,
		LeaseDuration:   l.Duration,
		RenewDeadline:   l.RenewDeadline,
		RetryPeriod:     l.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(held context.Context) {
				mu.Lock()
				started = !abandoned
				mu.Unlock()
				if !started {
					return
				}
				defer close(ended)
				bctx, stop := context.WithCancelCause(ctx)
				unwatch := context.AfterFunc(held, func() {
					if ctx.Err() != nil {
						stop(context.Cause(ctx))
						return
					}
					stop(fmt.Errorf("%w %s/%s (renewals failed for %s)", errLeaseLost, o.Namespace, lock.LeaseMeta.Name, l.RenewDeadline))
				})
				err = body(bctx, known)
				unwatch()
				stop(nil)
				release() // ends the renewals; ReleaseOnCancel gives the Lease up
			},
			OnStoppedLeading: func() {},
		},
	})
	if lerr != nil {
		return lerr
	}
	le.Run(klog.NewContext(lctx, logr.FromSlogHandler(log.Handler())))
	mu.Lock()
	abandoned = !started
	mu.Unlock()
	if started {
		<-ended
		return err
	}
	return fmt.Errorf("node %s: stopped (%w) while waiting for the driver-manager lease %s/%s; nothing changed",
		o.NodeName, context.Cause(ctx), o.Namespace, lock.LeaseMeta.Name)
}
