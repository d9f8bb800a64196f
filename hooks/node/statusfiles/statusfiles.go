// Package statusfiles implements the per-node ordering barrier: status files such as driver-ready and
// toolkit-ready in the validations directory (/run/nvidia/validations on the host). One operand's init container
// waits for a file another operand's check writes; a stopping validator removes the files it owns so nothing
// waits on a stale "ready".
package statusfiles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/atomicfile"
)

// DefaultDir is where the status files live inside operand containers.
const DefaultDir = "/run/nvidia/validations"

// WaitOptions configure Wait.
type WaitOptions struct {
	// Dir holds the status files.
	Dir string
	// Files are status file names; the wait ends when any one of them exists.
	Files []string
	// Interval between checks, and between "still waiting" log lines (every 12 checks).
	Interval time.Duration
	// Timeout bounds the wait; 0 waits until the context ends (an init container is restarted by the kubelet).
	Timeout time.Duration
}

// Complete fills defaults.
func (o *WaitOptions) Complete() {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
}

// Validate rejects options Wait cannot act on.
func (o *WaitOptions) Validate() error {
	if len(o.Files) == 0 {
		return errors.New("name at least one status file to wait for (e.g. toolkit-ready)")
	}
	return validNames(o.Files)
}

// Wait blocks until one of the files exists and returns its name, writing one line when it starts, one line
// every minute or so while waiting, and nothing else.
func Wait(ctx context.Context, o WaitOptions, out io.Writer) (string, error) {
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	fmt.Fprintf(out, "waiting for %s in %s\n", strings.Join(o.Files, " or "), o.Dir)
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for checks := 1; ; checks++ {
		for _, f := range o.Files {
			if _, err := os.Stat(filepath.Join(o.Dir, f)); err == nil {
				return f, nil
			} else if !errors.Is(err, os.ErrNotExist) {
				return "", fmt.Errorf("check %s: %w", f, err)
			}
		}
		if checks%12 == 0 {
			fmt.Fprintf(out, "still waiting for %s after %s\n", strings.Join(o.Files, " or "), time.Duration(checks)*o.Interval)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("gave up waiting for %s in %s: %w (the operand that writes it has not validated on this node)",
				strings.Join(o.Files, " or "), o.Dir, ctx.Err())
		case <-tick.C:
		}
	}
}

// Cleanup removes the named status files from dir; files already gone are fine. It returns how many it removed.
func Cleanup(dir string, files []string) (int, error) {
	if err := validNames(files); err != nil {
		return 0, err
	}
	removed := 0
	for _, f := range files {
		err := os.Remove(filepath.Join(dir, f))
		switch {
		case err == nil:
			removed++
		case !errors.Is(err, os.ErrNotExist):
			return removed, fmt.Errorf("remove %s: %w", f, err)
		}
	}
	return removed, nil
}

// Write puts a status file in dir atomically (a temporary file in the same directory, then a rename), so a reader
// never sees it half written: `sh` sourcing driver-ready reads all of it or nothing.
func Write(dir, name string, data []byte) error {
	if err := validNames([]string{name}); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, name), data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// validNames accepts bare file names only, so a status file can never point outside the validations directory.
func validNames(files []string) error {
	for _, f := range files {
		if f == "" || f == "." || f == ".." || strings.ContainsRune(f, filepath.Separator) {
			return fmt.Errorf("%q is not a status file name (a bare name such as driver-ready)", f)
		}
	}
	return nil
}
