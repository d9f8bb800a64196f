package rolloutbench

import (
	"slices"
	"testing"
	"time"
)

// With a canary the pool's slots go from one to maxUnavailable once the canary validated: the canary's give-back
// hands on one slot, the others taken at that moment were never given back by anyone, and each later give-back
// hands on to the next take. Pairing the k-th give-back with a fixed offset of takes made the canary run's
// hand-off -31 s.
func TestPairInOrderLeavesWideningTakesUnpaired(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(0, 0).Add(time.Duration(s * float64(time.Second))) }
	frees := []time.Time{at(35), at(70), at(71)}                                  // the canary, then two of the batch
	takes := []time.Time{at(0), at(35.5), at(35.6), at(35.7), at(70.4), at(71.3)} // the canary; the widening; two hand-ons
	got := pairInOrder(frees, takes)
	want := []time.Duration{500 * time.Millisecond, 400 * time.Millisecond, 300 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Errorf("pairInOrder = %v, want %v", got, want)
	}
	// without a canary: the first batch's takes pair with nothing, the rest in order
	got = pairInOrder([]time.Time{at(30), at(31)}, []time.Time{at(0), at(0.1), at(30.2), at(31.5)})
	if want := []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}; !slices.Equal(got, want) {
		t.Errorf("pairInOrder without a canary = %v, want %v", got, want)
	}
}
