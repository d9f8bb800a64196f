// Package recovery proves that a real-node run killed without Stop does not break the next: the next run clears
// what it left (its processes, mounts, cgroups, interfaces, sysctls, folders), and two live runs on one machine take
// turns. It uses the same lock as tests/node, so the two packages never overlap.
package recovery

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node"
)

// dir is tests/node's folder: its lock is the machine's node lock.
const dir = "/var/lib/kube-gpu-stack-test"

// roleEnv makes the test binary play a part in a child process instead of running tests.
const roleEnv = "KGS_RECOVERY_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "idle": // a leftover process: its arguments are all that matter
		select {}
	case "dying-run", "dying-run-unsaved":
		if err := dyingRun(os.Getenv(roleEnv) == "dying-run"); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		select {}
	case "second-run":
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := node.LockHost(ctx, dir, os.Stdout); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// lockNode takes the machine's node lock as a run does, waiting while tests/node holds it. It needs root.
func lockNode(t *testing.T) *node.HostLock {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the recovery tests need root (mounts, cgroups, interfaces), as tests/node does")
		}
		t.Skip("needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	lock, err := node.LockHost(ctx, dir, os.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	return lock
}

// A run SIGKILLed with its node up leaves its API server and etcd (envtest starts them without a parent-death
// signal), a pod's process in the node's cgroups, a mount below its folder, its interface and address, / made
// rshared, ip_forward on and a pod log folder. The next run clears all of it from the state the dead run saved.
// A run from before saved states left none: then what is the node's by name still goes.
func TestTheNextRunClearsAKilledRun(t *testing.T) {
	lock := lockNode(t)
	defer lock.Release()
	// whatever an earlier killed run left goes first; then there is nothing to clear
	if _, err := node.ClearStale(dir); err != nil {
		t.Fatal(err)
	}
	if cleared, err := node.ClearStale(dir); err != nil || len(cleared) > 0 {
		t.Fatalf("ClearStale on a clean machine = %v, %v; want nothing", cleared, err)
	}
	for _, role := range []string{"dying-run", "dying-run-unsaved"} {
		t.Run(role, func(t *testing.T) {
			before, err := node.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			leftovers := killMidRun(t, role)
			now, _ := node.Snapshot()
			if len(before.Diff(now)) == 0 {
				t.Fatal("the killed run left nothing: the test would prove nothing")
			}
			cleared, err := node.ClearStale(dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("cleared:\n  %s", strings.Join(cleared, "\n  "))
			for _, want := range []string{"+ link " + node.Link, "+ path " + dir, "killed pid"} {
				if !strings.Contains(strings.Join(cleared, "\n"), want) {
					t.Errorf("ClearStale's report lacks %q", want)
				}
			}
			after, err := node.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if diff := before.Diff(after); len(diff) > 0 {
				t.Errorf("the machine is not back as it was:\n  %s", strings.Join(diff, "\n  "))
			}
			for _, pid := range leftovers {
				if alive(pid) {
					t.Errorf("the killed run's process %d still runs", pid)
				}
			}
			for _, p := range []string{dir, dir + ".before.json"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s is still there", p)
				}
			}
		})
	}
}

// While a live run holds the node, a second waits, and gives up at its deadline naming the holder.
func TestASecondRunWaitsForTheFirst(t *testing.T) {
	lock := lockNode(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=second-run")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a second run took the node lock while this one held it:\n%s", out)
	}
	for _, want := range []string{"waiting for " + dir + ".lock", "held by pid " + strconv.Itoa(os.Getpid())} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the second run's output lacks %q:\n%s", want, out)
		}
	}
	if err := lock.Release(); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=second-run")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a run could not take the released lock: %v\n%s", err, out)
	}
}

// killMidRun starts a child that plays a node run up to the point where it is killed, SIGKILLs it, and returns the
// processes it left running.
func killMidRun(t *testing.T, role string) []int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		if pid, ok := strings.CutPrefix(line, "leftover "); ok {
			n, _ := strconv.Atoi(pid)
			pids = append(pids, n)
			continue
		}
		if line != "ready" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the dying run: %s", line)
		}
		break
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if len(pids) != 3 {
		t.Fatalf("the dying run left %d processes, want 3 (API server, etcd, a pod)", len(pids))
	}
	return pids
}

// dyingRun makes the changes a node run makes (saving the host state first when save is set, as Start does), as
// root, and leaves processes that outlive it.
func dyingRun(save bool) error {
	if save {
		before, err := node.Snapshot()
		if err != nil {
			return err
		}
		if err := node.SaveBefore(dir, before); err != nil {
			return err
		}
	}
	run := func(name string, args ...string) error {
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("ip", "link", "add", node.Link, "type", "bridge"); err != nil {
		return err
	}
	if err := run("ip", "addr", "add", node.Address+"/32", "dev", node.Link); err != nil {
		return err
	}
	mnt := filepath.Join(dir, "kubelet", "pods", "p", "volumes")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		return fmt.Errorf("mount %s: %w", mnt, err)
	}
	// leftovers: an API server on the node's address and its etcd, as envtest runs them, and a pod in a cgroup
	apiserver, err := leave("--bind-address="+node.Address, "--secure-port=443", "--etcd-servers=http://127.0.0.1:2379")
	if err != nil {
		return err
	}
	etcd, err := leave("--listen-client-urls=http://127.0.0.1:2379")
	if err != nil {
		return err
	}
	pod, err := leave()
	if err != nil {
		return err
	}
	if err := intoCgroups(pod, filepath.Join(node.CgroupRoot, "pod")); err != nil {
		return err
	}
	fmt.Printf("leftover %d\nleftover %d\nleftover %d\n", apiserver, etcd, pod)
	if !save {
		return nil // what only a saved state can put back is not changed
	}
	if err := syscall.Mount("", "/", "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return err
	}
	return os.MkdirAll("/var/log/pods/kube-system_stale_0", 0o755)
}

// leave starts this binary idle with args, in a session of its own, so it outlives the dying run.
func leave(args ...string) (int, error) {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), roleEnv+"=idle")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

// intoCgroups creates cgroup rel in every controller a process can join without setup (not cpuset, whose new
// cgroups have no CPUs) and moves pid into it.
func intoCgroups(pid int, rel string) error {
	roots := []string{"/sys/fs/cgroup"}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil { // v1: one hierarchy per controller
		roots = nil
		entries, _ := os.ReadDir("/sys/fs/cgroup")
		for _, e := range entries {
			if e.IsDir() && !strings.Contains(e.Name(), "cpuset") {
				roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
			}
		}
	}
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			continue
		}
		cg := filepath.Join(root, rel)
		if err := os.MkdirAll(cg, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move %d into %s: %w", pid, cg, err)
		}
	}
	return nil
}

// alive says whether pid runs (a zombie, reaped by nobody here, counts as gone).
func alive(pid int) bool {
	for i := 0; i < 50; i++ {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
