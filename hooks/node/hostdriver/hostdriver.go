// Package hostdriver decides whether a node runs a driver installed on the host itself (not by a driver pod): the
// one lookup the driver manager (which then stands the driver pod down) and the validator (which then validates
// that driver) share. A host driver is an nvidia-smi in one of the places a host install puts it that runs: a
// leftover nvidia-smi of an uninstalled driver, which fails without its modules, is not one. The reference does
// the same by running `chroot /host nvidia-smi`.
package hostdriver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// Dirs are where a host install puts nvidia-smi, relative to the host's root: the usual bin and sbin directories,
// WSL's, and /opt/bin of read-only-/usr distributions such as Flatcar.
var Dirs = hostfs.BinDirs

// RunFunc runs the program at path, a path inside root, with args, and returns its combined output.
type RunFunc func(ctx context.Context, root hostfs.Root, path string, args []string) ([]byte, error)

// Result is what Lookup found under a root.
type Result struct {
	// Root is the root looked in.
	Root hostfs.Root
	// Dir is nvidia-smi's directory relative to Root, Path its path in this container; both "" when there is none.
	Dir, Path string
	// Output is what the run printed; Err why it failed (nil: it answered).
	Output []byte
	Err    error
}

// Present reports a host driver: an nvidia-smi that ran.
func (r Result) Present() bool { return r.Path != "" && r.Err == nil }

// String says what was found, for logs and reasons.
func (r Result) String() string {
	switch {
	case r.Path == "":
		return fmt.Sprintf("no nvidia-smi under %s in %s", r.Root, strings.Join(Dirs, ", "))
	case r.Err == nil:
		return fmt.Sprintf("nvidia-smi under %s answers", strings.TrimSuffix(r.Path, "/nvidia-smi"))
	}
	return fmt.Sprintf("nvidia-smi under %s failed: %s (a leftover of an uninstalled driver, or a driver whose modules are not loaded: not a host driver)",
		strings.TrimSuffix(r.Path, "/nvidia-smi"), Describe(r.Output, r.Err))
}

// Lookup finds root's nvidia-smi in Dirs and runs it with args through run; only an error finding it is an error.
func Lookup(ctx context.Context, root hostfs.Root, run RunFunc, args ...string) (Result, error) {
	r := Result{Root: root}
	dir, path, err := root.FindExecutable("nvidia-smi", Dirs)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("look for a host driver: %w", err)
	}
	r.Dir, r.Path = dir, path
	r.Output, r.Err = run(ctx, root, "/"+dir+"/nvidia-smi", args)
	return r, nil
}

// Timeout bounds one run: nvidia-smi hangs when a GPU does.
const Timeout = time.Minute

// Interpreted runs a program of root without chrooting into it: a dynamically linked one through root's own ELF
// interpreter, with root's library directories as its library path (the host's program with the host's loader,
// libc and libnvidia-ml, from a static image that has none of them); a static one or a script directly. It is the
// driver manager's RunFunc, and works as well against a fixture tree in tests.
func Interpreted(ctx context.Context, root hostfs.Root, path string, args []string) ([]byte, error) {
	name, argv, err := Command(root, path)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, append(argv, args...)...).CombinedOutput()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("no answer within %s: %w", Timeout, ctx.Err())
	}
	return out, err
}

// Command returns how to run root's program at path (inside root) from this container: the program itself, or
// root's loader with the arguments that make it run the program against root's libraries.
func Command(root hostfs.Root, path string) (string, []string, error) {
	prog, err := root.Path(path)
	if err != nil {
		return "", nil, err
	}
	interp, err := hostfs.Interpreter(prog)
	if err != nil {
		return "", nil, fmt.Errorf("%s is not a readable program: %w", prog, err)
	}
	if interp == "" {
		return prog, nil, nil
	}
	loader, err := root.Path(interp)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(loader); err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a file", loader)
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("%s needs the loader %s, not found under %s: %w", path, interp, root, err)
	}
	var libs []string
	for _, d := range hostfs.LibDirs {
		if p, err := root.Path(d); err == nil {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				libs = append(libs, p)
			}
		}
	}
	return loader, []string{"--library-path", strings.Join(libs, ":"), prog}, nil
}

// Describe turns a failed run into a reason: "exit 9: <first line of output>", or the start error.
func Describe(out []byte, err error) string {
	line := ""
	for l := range strings.SplitSeq(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			line = l
			break
		}
	}
	var exit interface{ ExitCode() int } // *exec.ExitError, or a test's fake
	switch {
	case errors.As(err, &exit) && line == "":
		return fmt.Sprintf("exit %d", exit.ExitCode())
	case errors.As(err, &exit):
		return fmt.Sprintf("exit %d: %s", exit.ExitCode(), line)
	case line != "":
		return fmt.Sprintf("%v: %s", err, line)
	}
	return err.Error()
}
