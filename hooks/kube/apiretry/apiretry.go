// Package apiretry tells an API error that may pass (the API server or etcd restarting, throttling, a dropped
// connection) from one that will not (forbidden, not found, invalid), and retries the first kind with capped
// exponential backoff and jitter until the caller's deadline. The driver manager, the upgrade gate and the
// eviction go through it, so one `etcdserver: request timed out` costs a retry, not a node left upgrade-failed.
package apiretry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Defaults.
const (
	// DefaultTimeout bounds the retries of a call whose context has no deadline: long enough to ride out an API
	// server or etcd restart, short enough that a lasting outage still ends the step with its error.
	DefaultTimeout = 2 * time.Minute
	// InitialDelay is the first wait between tries; it doubles up to MaxDelay.
	InitialDelay = 100 * time.Millisecond
	// MaxDelay caps the wait between tries.
	MaxDelay = 5 * time.Second
	// ConflictStep is how much the pause after a conflict grows per conflict, up to MaxConflictDelay.
	ConflictStep = 10 * time.Millisecond
	// MaxConflictDelay caps the pause after a conflict.
	MaxConflictDelay = 100 * time.Millisecond
)

// Transient reports whether err may pass if the request is sent again: a server error (5xx, which is how etcd's
// "request timed out" and "leader changed" reach the client), throttling (429), a server or client timeout, or a
// connection refused, reset or cut short. API errors of any other status (Forbidden, NotFound, Invalid, Conflict)
// are not: sending the same request again gets the same answer. Neither is a cancellation, nor a call Do already
// gave up on. (A deadline reads as a timeout: whether it was the caller's own is for Do to tell, by its context.)
func Transient(err error) bool {
	var gaveUp *GaveUpError
	if err == nil || errors.Is(err, context.Canceled) || errors.As(err, &gaveUp) {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		if code == http.StatusNotImplemented {
			return false
		}
		if apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) {
			return true
		}
		// a response the client could not decode is transient from a server in trouble, not as a client error: a
		// 404 page for an API group the server does not serve carries that cause too
		if apierrors.IsUnexpectedServerError(err) && (code >= http.StatusInternalServerError || code == 0) {
			return true
		}
		return code >= http.StatusInternalServerError
	}
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		utilnet.IsHTTP2ConnectionLost(err) || utilnet.IsTimeout(err) || errors.Is(err, context.DeadlineExceeded)
}

// Delay is the wait before retry number attempt (0 for the first retry): InitialDelay doubled per attempt, capped
// at MaxDelay, plus up to half again as jitter so that many clients failing together do not retry together.
func Delay(attempt int) time.Duration {
	d := InitialDelay
	for i := 0; i < attempt && d < MaxDelay; i++ {
		d *= 2
	}
	d = min(d, MaxDelay)
	return d + rand.N(d/2+1)
}

// ConflictDelay is the pause before conflict number attempt (0 for the first) is read and decided again: up to
// ConflictStep per conflict so far, capped at MaxConflictDelay, at least half of it, the rest jitter. A conflict is
// not trouble that may pass with time: another writer changed the object a moment ago, and the fresh read decides.
// Many writers of one object (a pool's nodes on its slots Lease) conflict in turn as each one wins, so Delay's
// doubling would leave the losers seconds behind, with a slot free in the meantime.
func ConflictDelay(attempt int) time.Duration {
	d := min(ConflictStep*time.Duration(attempt+1), MaxConflictDelay)
	return d/2 + rand.N(d/2+1)
}

// OnConflict is Do for a read-modify-write: fn reads, decides and writes with the read's resourceVersion. A
// conflict calls fn again after ConflictDelay; a Transient error after Delay, counted apart from the conflicts.
func OnConflict(ctx context.Context, fn func(context.Context) error) error {
	conflicts, transients := 0, 0
	return retry(ctx, func(err error) (time.Duration, bool) {
		switch {
		case apierrors.IsConflict(err):
			conflicts++
			return ConflictDelay(conflicts - 1), true
		case Transient(err):
			transients++
			return Delay(transients - 1), true
		}
		return 0, false
	}, fn)
}

// Do calls fn until it succeeds or returns an error that is not Transient, waiting Delay between tries. It stops
// at ctx's deadline (DefaultTimeout when ctx has none) and then returns fn's last error, saying how long it
// retried: the error the caller sees is the API server's, not a bare "context deadline exceeded".
func Do(ctx context.Context, fn func(context.Context) error) error {
	return OnError(ctx, Transient, fn)
}

// OnError is Do with the caller's choice of which errors to retry (after Delay).
func OnError(ctx context.Context, retriable func(error) bool, fn func(context.Context) error) error {
	attempt := 0
	return retry(ctx, func(err error) (time.Duration, bool) {
		if !retriable(err) {
			return 0, false
		}
		attempt++
		return Delay(attempt - 1), true
	}, fn)
}

// retry calls fn until it succeeds, next says not to retry its error, or ctx ends (DefaultTimeout when ctx has no
// deadline); next also says how long to wait before the next call.
func retry(ctx context.Context, next func(error) (time.Duration, bool), fn func(context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	for tries := 1; ; tries++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		wait, again := next(err)
		if !again {
			return err
		}
		if ctx.Err() != nil {
			return &GaveUpError{Last: err, Tries: tries, After: time.Since(start), Cause: context.Cause(ctx)}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return &GaveUpError{Last: err, Tries: tries, After: time.Since(start), Cause: context.Cause(ctx)}
		case <-t.C:
		}
	}
}

// GaveUpError is a retried call whose errors outlasted its deadline.
type GaveUpError struct {
	// Last is the last error the call returned.
	Last error
	// Tries is how many times it was sent; After how long that took.
	Tries int
	After time.Duration
	// Cause is why the retries stopped (the context's cause).
	Cause error
}

// Error leads with the last error, then says how long it was retried.
func (e *GaveUpError) Error() string {
	return fmt.Sprintf("%v (still failing after %d tries over %s: %v)", e.Last, e.Tries, e.After.Round(time.Millisecond), e.Cause)
}

// Unwrap returns the last error and the cause, so errors.Is and apierrors' checks see both.
func (e *GaveUpError) Unwrap() []error { return []error{e.Last, e.Cause} }

// Value is Do for a call that returns what it read (a Get or a List).
func Value[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	var out T
	err := Do(ctx, func(ctx context.Context) error {
		var err error
		out, err = fn(ctx)
		return err
	})
	return out, err
}
