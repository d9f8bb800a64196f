package validation

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostdriver"
)

// Command is a program run by a Runner.
type Command struct {
	// Root, when set and not "/", is the directory the program runs chrooted in (the host's or the driver's root,
	// so the program finds its own libraries); Path is then inside that root.
	Root string
	// Path is the program: an absolute path (inside Root when Root is set), or a name looked up in $PATH.
	Path string
	// Args follow the program name.
	Args []string
}

// String is the command as a log line shows it.
func (c Command) String() string {
	s := strings.Join(append([]string{c.Path}, c.Args...), " ")
	if c.Root != "" && c.Root != "/" {
		s += " (in " + c.Root + ")"
	}
	return s
}

// Runner runs a command to completion and returns its combined output.
type Runner interface {
	Run(ctx context.Context, c Command) ([]byte, error)
}

// ExecRunner runs commands as child processes, chrooted into Command.Root (the validator container is
// privileged), each bounded to a minute: nvidia-smi hangs when a GPU does.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, c Command) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	if c.Root != "" && c.Root != "/" {
		// the child chroots before it execs, so the absolute Path is the root's program
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: c.Root}
		cmd.Dir = "/"
	}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("no answer within a minute: %w", ctx.Err())
	}
	return buf.Bytes(), err
}

// describeRun turns a failed run into a reason: "exit 9: <first line of output>" or the start error.
func describeRun(out []byte, err error) string { return hostdriver.Describe(out, err) }

func firstLine(out []byte) string {
	for l := range strings.SplitSeq(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}
