package apiretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry/apiretrytest"
)

var nodes = schema.GroupResource{Resource: "nodes"}

// transientErrors are apiretrytest's kinds and the others a client may see: a 504 of its own timeout, throttling, a
// 502, a dropped stream, a network or client timeout.
func transientErrors() map[string]error {
	errs := apiretrytest.Transient()
	for name, err := range map[string]error{
		"504 timeout": apierrors.NewTimeoutError("request did not complete", 1),
		"429":         apierrors.NewTooManyRequests("slow down", 1),
		"502 generic": apierrors.NewGenericServerResponse(502, "patch", nodes, "gpu-1", "bad gateway", 0, true),
		"EOF":         &url.Error{Op: "Get", URL: "https://10.0.0.1/api", Err: io.EOF},
		"net timeout": &url.Error{Op: "Get", URL: "https://10.0.0.1/api", Err: timeoutErr{}},
		// net/http's own client timeout also matches context.DeadlineExceeded
		"client timeout": &url.Error{Op: "Get", URL: "https://10.0.0.1/api", Err: fmt.Errorf("awaiting headers: %w", context.DeadlineExceeded)},
	} {
		errs[name] = err
	}
	return errs
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestTransient(t *testing.T) {
	for name, err := range transientErrors() {
		if !Transient(err) {
			t.Errorf("%s (%v): not transient", name, err)
		}
		if !Transient(fmt.Errorf("patch node gpu-1: %w", err)) {
			t.Errorf("%s wrapped: not transient", name)
		}
	}
	for name, err := range map[string]error{
		"forbidden":    apierrors.NewForbidden(nodes, "gpu-1", errors.New("no")),
		"not found":    apierrors.NewNotFound(nodes, "gpu-1"),
		"invalid":      apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "gpu-1", nil),
		"conflict":     apierrors.NewConflict(nodes, "gpu-1", errors.New("changed")),
		"bad request":  apierrors.NewBadRequest("no"),
		"unauthorized": apierrors.NewUnauthorized("who"),
		"501":          apierrors.NewGenericServerResponse(501, "patch", nodes, "gpu-1", "", 0, false),
		// what client-go makes of the API server's plain 404 page for an API group it does not serve
		"404 page": apierrors.NewGenericServerResponse(404, "list", schema.GroupResource{Group: "monitoring.coreos.com", Resource: "servicemonitors"},
			"", "404 page not found", 0, true),
		"own cancel":       &url.Error{Op: "Get", URL: "https://10.0.0.1/api", Err: context.Canceled},
		"plain":            errors.New("something else"),
		"gave up, wrapped": &GaveUpError{Last: apierrors.NewServiceUnavailable("x"), Cause: context.DeadlineExceeded},
	} {
		if Transient(err) {
			t.Errorf("%s (%v): transient", name, err)
		}
	}
}

func TestDelayGrowsCappedWithJitter(t *testing.T) {
	for attempt, base := range []time.Duration{InitialDelay, 2 * InitialDelay, 4 * InitialDelay} {
		for range 20 {
			if d := Delay(attempt); d < base || d > base+base/2 {
				t.Fatalf("Delay(%d) = %s, want in [%s, %s]", attempt, d, base, base+base/2)
			}
		}
	}
	if d := Delay(100); d < MaxDelay || d > MaxDelay+MaxDelay/2 {
		t.Fatalf("Delay(100) = %s, want capped at %s (+jitter)", d, MaxDelay)
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[Delay(3)] = true
	}
	if len(seen) < 2 {
		t.Fatal("Delay has no jitter")
	}
}

// A conflict pauses briefly, growing by ConflictStep to MaxConflictDelay, never to Delay's seconds: the seventh
// conflict in a row would wait 6.4 s under Delay.
func TestConflictDelayStaysShortWithJitter(t *testing.T) {
	for attempt := range 30 {
		base := min(ConflictStep*time.Duration(attempt+1), MaxConflictDelay)
		for range 20 {
			if d := ConflictDelay(attempt); d < base/2 || d > base {
				t.Fatalf("ConflictDelay(%d) = %s, want in [%s, %s]", attempt, d, base/2, base)
			}
		}
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[ConflictDelay(5)] = true
	}
	if len(seen) < 2 {
		t.Fatal("ConflictDelay has no jitter")
	}
}

// OnConflict reads again after each conflict, and counts conflicts and transient errors apart: a transient error
// after many conflicts waits Delay(0), not Delay(many).
func TestOnConflictRetriesConflictsAndTransientErrorsEachOnItsOwnCount(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "slots", errors.New("changed"))
	var errs []error
	for range 12 {
		errs = append(errs, conflict)
	}
	errs = append(errs, apierrors.NewServiceUnavailable("restarting"))
	calls := 0
	start := time.Now()
	err := OnConflict(context.Background(), func(context.Context) error {
		if calls++; calls <= len(errs) {
			return errs[calls-1]
		}
		return nil
	})
	if err != nil || calls != len(errs)+1 {
		t.Fatalf("err=%v after %d calls; want success on call %d", err, calls, len(errs)+1)
	}
	// 12 conflicts wait at most 10+20+...+100+100+100 ms, the transient error at most Delay(0)'s 150 ms; Delay's
	// backoff for the 13th try would alone be 5 s or more (3 s spare for a busy machine)
	if took, most := time.Since(start), 950*time.Millisecond+InitialDelay*3/2+3*time.Second; took > most {
		t.Errorf("took %s, want under %s (conflicts back off to seconds?)", took, most)
	}
}

func TestOnConflictStopsAtOnceOnALastingError(t *testing.T) {
	calls := 0
	err := OnConflict(context.Background(), func(context.Context) error {
		calls++
		return apierrors.NewForbidden(nodes, "gpu-1", errors.New("cannot update"))
	})
	if calls != 1 || !apierrors.IsForbidden(err) {
		t.Fatalf("err=%v after %d calls; want the Forbidden at once", err, calls)
	}
}

func TestDoRetriesEachTransientKindThenSucceeds(t *testing.T) {
	for name, terr := range transientErrors() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := Do(context.Background(), func(context.Context) error {
				if calls++; calls <= 2 {
					return terr
				}
				return nil
			})
			if err != nil || calls != 3 {
				t.Fatalf("err=%v after %d calls; want success on the 3rd", err, calls)
			}
		})
	}
}

func TestDoStopsAtOnceOnALastingError(t *testing.T) {
	forbidden := apierrors.NewForbidden(nodes, "gpu-1", errors.New("cannot patch"))
	calls := 0
	err := Do(context.Background(), func(context.Context) error { calls++; return forbidden })
	if calls != 1 || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "cannot patch") {
		t.Fatalf("err=%v after %d calls; want the Forbidden at once", err, calls)
	}
}

// A call that fails because Do's own context ended is not retried, however its error reads.
func TestDoStopsWhenItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, func(ctx context.Context) error {
		calls++
		cancel()
		return apierrors.NewServiceUnavailable("restarting")
	})
	if calls != 1 || !errors.Is(err, context.Canceled) || !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("err = %v after %d calls; want the last error and the cancellation at once", err, calls)
	}
}

func TestDoGivesUpAtTheDeadlineWithTheLastError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	calls := 0
	start := time.Now()
	err := Do(ctx, func(context.Context) error {
		calls++
		return apierrors.NewInternalError(fmt.Errorf("etcdserver: request timed out (try %d)", calls))
	})
	if time.Since(start) > 2*time.Second {
		t.Fatalf("took %s: the deadline was not kept", time.Since(start))
	}
	if calls < 2 {
		t.Fatalf("%d calls; want retries", calls)
	}
	if !apierrors.IsInternalError(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the last server error, marked with the deadline", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "Internal error occurred: etcdserver: request timed out (try "+fmt.Sprint(calls)+")") {
		t.Fatalf("err = %q; want it to lead with the last error", msg)
	}
}
