// Package terminal tells whether output goes to a terminal, where progress may redraw in place.
package terminal

import (
	"io"
	"os"
)

// Is reports whether w is a character device such as a terminal (so not a file or a pipe).
func Is(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
