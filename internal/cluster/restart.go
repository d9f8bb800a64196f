package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Restart stops kube-apiserver and etcd, waits down, and starts them again with the same command lines (same
// ports, certificates and etcd data dir), returning once the API server is ready. Clients, controllers, kwok and
// watches see what they see when a control plane node restarts: 429s (Retry-After) while the API server drains,
// refused connections, then a fresh server.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	var cmdlines [][]string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		pid, args, err := c.child(name)
		if err != nil {
			return err
		}
		began := time.Now()
		if err := stopPID(ctx, pid); err != nil {
			return fmt.Errorf("stop %s: %w", name, err)
		}
		fmt.Fprintf(c.log, "cluster: %s stopped in %s\n", name, time.Since(began))
		cmdlines = append([][]string{args}, cmdlines...) // etcd starts first
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	for _, args := range cmdlines {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = c.log, c.log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("restart %s: %w", filepath.Base(args[0]), err)
		}
		c.restarted = append([]*exec.Cmd{cmd}, c.restarted...) // stopped in reverse: the API server before etcd
	}
	// a fresh API server's post-start hooks took over a minute on two cores shared with three other test packages
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("the restarted API server is not ready: %w", err)
	}
	return nil
}

// child finds the process envtest started for name (kube-apiserver or etcd, a child of this process) of this
// control plane, and its command line.
func (c *Cluster) child(name string) (int, []string, error) {
	if len(c.restarted) > 0 {
		for _, cmd := range c.restarted {
			if filepath.Base(cmd.Path) == name {
				return cmd.Process.Pid, cmd.Args, nil
			}
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		fields := strings.Fields(s[close+1:])
		if s[open+1:close] != name || len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) || fields[0] == "Z" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			return 0, nil, err
		}
		// a process with several control planes (tests/e2e) is the parent of each one's; this one's name a file
		// in its folder (the API server its token file, etcd its data dir)
		if !strings.Contains(string(raw), c.dir+string(filepath.Separator)) {
			continue
		}
		return pid, strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), nil
	}
	return 0, nil, fmt.Errorf("no %s process of this control plane", name)
}

// stopPID sends SIGTERM and waits until the process is gone (its parent reaps it), SIGKILL after 5 s (the API
// server ends its open watches 2 s after its short requests, see harnessAPIServerArgs).
func stopPID(ctx context.Context, pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	gone := func(context.Context) (bool, error) {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return true, nil
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		return len(fields) > 0 && fields[0] == "Z", nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Second, true, gone); err == nil {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, gone)
}
