package airgap

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/terminal"
)

// bar shows one image's transfer while it runs: on a terminal, a bar redrawn in place (at most every
// redrawEvery); elsewhere (a log, a pipe) nothing, so logs keep only each image's final line.
type bar struct {
	mu          sync.Mutex
	w           io.Writer
	label       string
	live        bool
	total, done int64
	drawn       time.Time
}

const (
	barWidth    = 24
	redrawEvery = 100 * time.Millisecond
)

func newBar(w io.Writer, label string) *bar {
	if w == nil {
		w = io.Discard
	}
	return &bar{w: w, label: label, live: terminal.Is(w)}
}

func (b *bar) setTotal(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total = n
	b.draw(true)
}

// add counts n more bytes transferred.
func (b *bar) add(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	b.draw(false)
}

// update takes one of go-containerregistry's progress updates (remote.WithProgress).
func (b *bar) update(u v1.Update) {
	if u.Error != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total, b.done = u.Total, u.Complete
	b.draw(false)
}

func (b *bar) draw(force bool) {
	if !b.live || b.total <= 0 || (!force && time.Since(b.drawn) < redrawEvery) {
		return
	}
	b.drawn = time.Now()
	done := min(b.done, b.total)
	filled, pct := 0, 0
	if b.total > 0 {
		filled, pct = int(done*barWidth/b.total), int(done*100/b.total)
	}
	fmt.Fprintf(b.w, "\r\x1b[K%s [%s%s] %3d%% %s/%s", b.label, strings.Repeat("=", filled),
		strings.Repeat(" ", barWidth-filled), pct, humanBytes(done), humanBytes(b.total))
}

// clear removes a drawn bar, so the caller's final line for the image takes its place.
func (b *bar) clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live && !b.drawn.IsZero() {
		fmt.Fprint(b.w, "\r\x1b[K")
	}
}

// humanBytes writes a size in decimal units (as registries and image tools report them).
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
