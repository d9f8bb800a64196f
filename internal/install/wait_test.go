package install

import (
	"context"
	"errors"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/cli-runtime/pkg/resource"
)

func infos(names ...string) kube.ResourceList {
	var out kube.ResourceList
	for _, n := range names {
		out = append(out, &resource.Info{Name: n})
	}
	return out
}

// TestWaitAsksOnlyWhatIsNotYetDone: while the last resource is not done, each poll asks for it alone, not for the
// ones before it again; the wait ends with one pass over all of them.
func TestWaitAsksOnlyWhatIsNotYetDone(t *testing.T) {
	rs := infos("a", "b", "c", "slow")
	asked := map[string]int{}
	err := pollUntilAllDone(rs, time.Minute, func(_ context.Context, r *resource.Info) (bool, error) {
		asked[r.Name]++
		return r.Name != "slow" || asked["slow"] >= 10, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// a, b, c once at first and once in the final pass; slow until it is done, then once more in the final pass
	want := map[string]int{"a": 2, "b": 2, "c": 2, "slow": 11}
	for n, w := range want {
		if asked[n] != w {
			t.Errorf("%s asked %d times, want %d (all: %v)", n, asked[n], w, asked)
		}
	}
}

// TestWaitNeedsAllDoneAtOnce: a resource seen done that is no longer done in the final pass keeps the wait going,
// as Helm's pass over every resource would.
func TestWaitNeedsAllDoneAtOnce(t *testing.T) {
	rs := infos("flaky", "slow")
	asked := map[string]int{}
	err := pollUntilAllDone(rs, time.Minute, func(_ context.Context, r *resource.Info) (bool, error) {
		asked[r.Name]++
		switch r.Name {
		case "flaky": // done at first, not done in the first final pass, done after
			return asked["flaky"] != 2, nil
		default:
			return asked["slow"] >= 3, nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// flaky: done, not done in the first final pass, done when asked again, done in the second final pass;
	// slow: 3 until done, then in both final passes and once more between them (it was pending again)
	if asked["flaky"] != 4 || asked["slow"] != 5 {
		t.Errorf("asked %v, want flaky 4 and slow 5 times", asked)
	}
}

// TestWaitEndsOnAnError: an error ends the wait with that error; the timeout ends one that never finishes.
func TestWaitEndsOnAnError(t *testing.T) {
	boom := errors.New("boom")
	err := pollUntilAllDone(infos("a", "b"), time.Minute, func(_ context.Context, r *resource.Info) (bool, error) {
		if r.Name == "b" {
			return false, boom
		}
		return true, nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want boom", err)
	}
	err = pollUntilAllDone(infos("never"), 300*time.Millisecond, func(context.Context, *resource.Info) (bool, error) { return false, nil })
	if err == nil {
		t.Error("a wait that never finishes ended without an error")
	}
}
