// Package syncbuffer is a text buffer that several goroutines or child processes may write to at once: the log of
// an agent a test runs in the background, or of a control plane's processes.
package syncbuffer

import (
	"strings"
	"sync"
)

// Buffer collects what is written to it; the zero value is empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
