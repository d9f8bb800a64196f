package releasecheck

import (
	"fmt"
	"io"
	"maps"
	"time"
)

// DefaultProgressEvery is the gate's pace of progress lines. Helm copies the gate's log into the output of `helm
// install` and `helm upgrade`, and on a large cluster the counts change several times a second during a rollout:
// one line per change would bury the final table under thousands.
const DefaultProgressEvery = 10 * time.Second

// progress writes Run's progress lines: the counts when they change, at most one line per interval, except that a
// change in the failed count is written at once. A change held back by the interval is written when the interval
// is over, even if nothing changes after it, so a long quiet wait still shows where it stands.
type progress struct {
	out   io.Writer
	every time.Duration
	// written holds the counts of the last line (nil before the first), at the time it was written.
	written map[State]int
	at      time.Time
}

// see takes the report of a new snapshot at now. It writes a line or holds it back, and says how long after now
// a held-back line is due (0 when none is).
func (p *progress) see(r *Report, now time.Time) time.Duration {
	if p.written != nil && maps.Equal(p.written, r.Summary) {
		return 0
	}
	if since := now.Sub(p.at); p.written != nil && since < p.every && p.written[Failed] == r.Summary[Failed] {
		return p.every - since
	}
	fmt.Fprintf(p.out, "%s: %d ready, %d waiting, %d failed\n", r.Elapsed, r.Summary[Ready], r.Summary[Waiting], r.Summary[Failed])
	p.written, p.at = maps.Clone(r.Summary), now
	return 0
}
