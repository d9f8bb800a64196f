package node

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Diff names every kind of leftover the cleanup must undo, so CheckRestored cannot pass over one.
func TestHostStateDiff(t *testing.T) {
	before := HostState{
		Mounts: []string{"/", "/proc"}, Propagation: map[string]string{"/": "private", "/proc": "private"},
		Cgroups: []string{"/sys/fs/cgroup/memory"}, Sysctls: map[string]string{"net/ipv4/ip_forward": "0"},
		Links: []string{"lo"}, Paths: []string{"/run/netns"},
	}
	after := HostState{
		Mounts:      []string{"/", "/proc", "/run/netns/cni-1"},
		Propagation: map[string]string{"/": "shared", "/proc": "private", "/run/netns/cni-1": "shared"},
		Cgroups:     []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/" + CgroupRoot},
		Sysctls:     map[string]string{"net/ipv4/ip_forward": "1"},
		Links:       []string{"lo", "vethabc"}, Paths: []string{"/run/netns", "/run/netns/cni-1"},
	}
	got := strings.Join(before.Diff(after), "\n")
	for _, want := range []string{
		"+ mount /run/netns/cni-1", "~ propagation / private -> shared", "+ cgroup /sys/fs/cgroup/memory/" + CgroupRoot,
		`~ sysctl net/ipv4/ip_forward "0" -> "1"`, "+ link vethabc", "+ path /run/netns/cni-1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("diff lacks %q:\n%s", want, got)
		}
	}
	if d := before.Diff(before); len(d) != 0 {
		t.Errorf("a state differs from itself: %v", d)
	}
	if got := unescapeMount(`/a\040b`); got != "/a b" {
		t.Errorf("unescapeMount: %q", got)
	}
}

// The reader of SIGHUP's disposition tells nohup's child from a plain one, and after defaultSIGHUP no child of this
// binary ignores SIGHUP, however the binary was started.
func TestChildrenDieOnSIGHUP(t *testing.T) {
	defaultSIGHUP()
	for _, c := range []struct {
		argv    []string
		ignores bool
	}{{[]string{"sleep", "30"}, false}, {[]string{"nohup", "sleep", "30"}, true}} {
		cmd := exec.Command(c.argv[0], c.argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// nohup execs sleep in its place; wait until the pid runs sleep
		var got bool
		var err error
		for i := 0; i < 100; i++ {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); strings.HasSuffix(exe, "/sleep") {
				got, err = ignoresSIGHUP(cmd.Process.Pid)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if err != nil || got != c.ignores {
			t.Errorf("%v: ignores SIGHUP %v, want %v (%v)", c.argv, got, c.ignores, err)
		}
	}
}
