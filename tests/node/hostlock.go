package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// One node runs on a machine at a time: its interface, address, port 443 and cgroup root are fixed. Two test runs
// on one machine (a developer's and CI's) take turns through a lock file beside Dir, and a run that died without
// Stop (SIGKILL, a machine-wide kill) is cleared by the next one from the host state it saved before changing
// anything, instead of failing every later run.

// HostLock is the machine's node lock, held from Start to Stop.
type HostLock struct {
	f    *os.File
	path string
}

func lockPath(dir string) string   { return filepath.Clean(dir) + ".lock" }
func beforePath(dir string) string { return filepath.Clean(dir) + ".before.json" }

// LockHost takes the node lock of dir, waiting while another live process holds it (the kernel drops a flock when
// its holder dies, so a dead run never blocks). It says once on log whom it waits for.
func LockHost(ctx context.Context, dir string, log io.Writer) (*HostLock, error) {
	path := lockPath(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := lockHolder(path)
		if !said {
			fmt.Fprintf(log, "waiting for %s, held by %s (another run's node on this machine)\n", path, holder)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%s is held by %s (another run's node on this machine): %w", path, holder, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &HostLock{f: f, path: path}, nil
}

// lockHolder names the process a lock file says holds it.
func lockHolder(path string) string {
	data, _ := os.ReadFile(path)
	pid := strings.TrimSpace(string(data))
	if pid == "" {
		return "an unknown process"
	}
	cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	if name, _, _ := bytes.Cut(cmd, []byte{0}); len(name) > 0 {
		return fmt.Sprintf("pid %s (%s)", pid, filepath.Base(string(name)))
	}
	return "pid " + pid
}

// Release drops the lock; the file stays (removing it would let a waiter lock an unlinked file).
func (l *HostLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close()
	l.f = nil
	return err
}

// SaveBefore records the host as a run found it, before the run changes anything, for ClearStale.
func SaveBefore(dir string, s HostState) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := beforePath(dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, beforePath(dir))
}

// ClearStale puts the machine back as an earlier run that died without Stop found it, and returns what it changed
// (nothing when no run died). It must be called with the lock held. It kills the dead run's leftover processes
// (envtest's API server and etcd and the containerd shims, which outlive their parent), then restores the host from
// the state that run saved. A run from before saved states existed left none: then only what is the node's by name
// goes (its interfaces, cgroup root, folder and the mounts below it); a mount propagation or sysctl it changed stays.
func ClearStale(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	before, saved, err := loadBefore(dir)
	if err != nil {
		return nil, err
	}
	now, err := Snapshot()
	if err != nil {
		return nil, err
	}
	_, dirErr := os.Lstat(dir)
	if !saved {
		before = withoutNodeOwned(now, dir)
	}
	cleared := before.Diff(now)
	if !saved && dirErr != nil && len(cleared) == 0 {
		return nil, nil // no run died here
	}
	var killed []string
	for _, p := range staleProcesses(dir) {
		if err := syscall.Kill(p.pid, syscall.SIGKILL); err == nil {
			killed = append(killed, fmt.Sprintf("killed pid %d (%s)", p.pid, p.name))
		}
	}
	if err := restore(before, ownedBy(dir)); err != nil {
		return nil, fmt.Errorf("clear what an earlier run left: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Remove(beforePath(dir)); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if dirErr == nil {
		cleared = append(cleared, "+ path "+dir)
	}
	return append(killed, cleared...), nil
}

// loadBefore reads the state SaveBefore wrote; saved is false when there is none.
func loadBefore(dir string) (s HostState, saved bool, err error) {
	data, err := os.ReadFile(beforePath(dir))
	if os.IsNotExist(err) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, false, fmt.Errorf("%s is not a saved host state (%v): remove it, and clear by hand what the run that wrote it left", beforePath(dir), err)
	}
	return s, true, nil
}

// withoutNodeOwned is s without what is the node's by name: the state to restore when no run saved one.
func withoutNodeOwned(s HostState, dir string) HostState {
	own := ownedBy(dir)
	out := s
	out.Mounts = filter(s.Mounts, func(m string) bool { return !(m == dir || strings.HasPrefix(m, dir+"/")) })
	out.Cgroups = filter(s.Cgroups, func(c string) bool { return !own.cgroupOK(c) })
	out.Links = filter(s.Links, func(l string) bool { return !toSet(own.links)[l] })
	return out
}

// ownedBy is what a node with folder dir may undo.
func ownedBy(dir string) owned {
	return owned{
		mountPrefixes: []string{dir, "/run/netns", "/var/run/netns", "/var/lib/kubelet", "/run/nvidia"},
		links:         []string{Link, Bridge},
	}
}

type staleProcess struct {
	pid  int
	name string
}

// staleProcesses finds what a dead node run leaves running: the API server listening on Address and its etcd
// (envtest starts them without a parent-death signal), and the containerd shims of the node's containerd.
func staleProcesses(dir string) []staleProcess {
	cmdlines := commandLines()
	flag := func(args []string, name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	var pids []int
	etcds := map[string]bool{}
	for pid, args := range cmdlines {
		if flag(args, "bind-address") == Address {
			pids = append(pids, pid)
			if e := flag(args, "etcd-servers"); e != "" {
				etcds[e] = true
			}
		}
	}
	for pid, args := range cmdlines {
		if etcds[flag(args, "listen-client-urls")] {
			pids = append(pids, pid)
		}
	}
	pids = append(pids, shimsServing(cmdlines, containerdSocket(dir))...)
	slices.Sort(pids)
	out := make([]staleProcess, 0, len(pids))
	for _, pid := range pids {
		out = append(out, staleProcess{pid, filepath.Base(cmdlines[pid][0])})
	}
	return out
}

// commandLines are the arguments of every process but this one, by pid.
func commandLines() map[int][]string {
	out := map[int][]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		out[pid] = strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
	}
	return out
}

// shimsServing are the containerd shims of the containerd at socket: they outlive it by design.
func shimsServing(cmdlines map[int][]string, socket string) []int {
	var out []int
	for pid, args := range cmdlines {
		if strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") && slices.Contains(args, socket) {
			out = append(out, pid)
		}
	}
	return out
}
