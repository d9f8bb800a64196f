package node

import (
	"strings"
	"testing"
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
