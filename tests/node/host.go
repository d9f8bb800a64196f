package node

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// HostState is what a kubelet and containerd change on the machine outside their own folders, as the harness sees
// it before a node starts and after it stops: the two must be equal, or the run left something behind.
type HostState struct {
	// Mounts are mount points (from /proc/self/mountinfo).
	Mounts []string
	// Propagation is each mount point's propagation: "shared", "slave" or "private" (a node needs / shared for
	// Bidirectional and HostToContainer volumes, which the harness sets and puts back).
	Propagation map[string]string
	// Cgroups are the directories under /sys/fs/cgroup.
	Cgroups []string
	// Sysctls are the values of the kernel settings a kubelet or a CNI plugin writes.
	Sysctls map[string]string
	// Links are network interface names.
	Links []string
	// Paths are the entries of the fixed host folders the kubelet, containerd and CNI write into whatever their
	// configuration says (/run/netns, /var/log/containers, /var/log/pods, /var/lib/cni, /var/lib/kubelet,
	// /run/nvidia, /etc/cni, /opt/cni), one level deep.
	Paths []string
}

// CgroupRoot is the kubelet's cgroup root (in every controller): every pod and container cgroup lies below it.
const CgroupRoot = "kube-gpu-stack-test"

// watchedSysctls are the settings the kubelet (protectKernelDefaults=false, its defaults for a node) and the bridge
// CNI plugin (isGateway) write.
var watchedSysctls = []string{
	"kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"vm/overcommit_memory", "vm/panic_on_oom", "net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding",
	"net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-iptables", "net/ipv4/conf/all/route_localnet",
}

// watchedDirs are host folders a node writes into regardless of its own root folders.
var watchedDirs = []string{
	"/run/netns", "/var/run/netns", "/var/log/containers", "/var/log/pods", "/var/lib/cni", "/var/lib/cni/results",
	"/var/lib/cni/networks", "/var/lib/kubelet", "/run/nvidia", "/etc/cni", "/opt/cni", "/opt/containerd",
	"/run/containerd", "/var/lib/containerd", "/etc/kubernetes",
	// the chart's DirectoryOrCreate host paths, and /dev/log, which the driver pod mounts (Start creates it when the
	// machine has no syslog socket)
	"/run/nvidia-fabricmanager", "/run/nvidia-topologyd", "/run/mellanox", "/etc/containerd", "/var/run/cdi",
	"/run/cdi", "/usr/local/nvidia", "/dev/log",
}

// Snapshot reads the host state.
func Snapshot() (HostState, error) {
	var s HostState
	var err error
	if s.Mounts, s.Propagation, err = mountPoints(); err != nil {
		return s, err
	}
	if s.Cgroups, err = cgroupDirs(); err != nil {
		return s, err
	}
	s.Sysctls = map[string]string{}
	for _, k := range watchedSysctls {
		if v, err := os.ReadFile("/proc/sys/" + k); err == nil {
			s.Sysctls[k] = strings.TrimSpace(string(v))
		}
	}
	links, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return s, err
	}
	for _, l := range links {
		s.Links = append(s.Links, l.Name())
	}
	for _, d := range watchedDirs {
		if _, err := os.Lstat(d); err != nil {
			continue
		}
		s.Paths = append(s.Paths, d)
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			s.Paths = append(s.Paths, filepath.Join(d, e.Name()))
		}
	}
	sort.Strings(s.Paths)
	return s, nil
}

// Diff lists how after differs from s, one line per difference ("+" left behind, "-" gone, "~" changed).
func (s HostState) Diff(after HostState) []string {
	var out []string
	set := func(what string, before, now []string) {
		b, a := toSet(before), toSet(now)
		for _, x := range now {
			if !b[x] {
				out = append(out, fmt.Sprintf("+ %s %s", what, x))
			}
		}
		for _, x := range before {
			if !a[x] {
				out = append(out, fmt.Sprintf("- %s %s", what, x))
			}
		}
	}
	set("mount", s.Mounts, after.Mounts)
	set("cgroup", s.Cgroups, after.Cgroups)
	set("link", s.Links, after.Links)
	set("path", s.Paths, after.Paths)
	for _, m := range s.Mounts {
		if p, ok := after.Propagation[m]; ok && p != s.Propagation[m] {
			out = append(out, fmt.Sprintf("~ propagation %s %s -> %s", m, s.Propagation[m], p))
		}
	}
	for _, k := range watchedSysctls {
		if s.Sysctls[k] != after.Sysctls[k] {
			out = append(out, fmt.Sprintf("~ sysctl %s %q -> %q", k, s.Sysctls[k], after.Sysctls[k]))
		}
	}
	return out
}

func toSet(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func mountPoints() ([]string, map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var out []string
	prop := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) <= 4 {
			continue
		}
		point := unescapeMount(fields[4])
		out = append(out, point)
		p := "private"
		for _, opt := range fields[6:] {
			if opt == "-" {
				break
			}
			switch {
			case strings.HasPrefix(opt, "shared:"):
				p = "shared"
			case strings.HasPrefix(opt, "master:") && p != "shared":
				p = "slave"
			}
		}
		prop[point] = p
	}
	return out, prop, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(byte(c))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupDirs lists every controller's top-level cgroups (where a kubelet would leave its own), and everything
// below CgroupRoot. Deeper cgroups elsewhere belong to the machine's other processes, which come and go.
func cgroupDirs() ([]string, error) {
	var out []string
	err := filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil // a cgroup removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel("/sys/fs/cgroup", p)
		depth := strings.Count(rel, "/") + 1
		if rel == "." {
			depth = 0
		}
		out = append(out, p)
		if depth >= 2 && !strings.Contains(p+"/", "/"+CgroupRoot+"/") {
			return filepath.SkipDir
		}
		return nil
	})
	return out, err
}

// owned says which changes the harness may undo: another process on the machine may create mounts, cgroups or
// interfaces at the same time, and those are not ours to remove.
type owned struct {
	// mountPrefixes are folders whose new mounts are the node's (its own folders, /run/netns, ...).
	mountPrefixes []string
	// links are interfaces the harness made; new veth* ones are the pods' (the bridge plugin names them so).
	links []string
}

func (o owned) cgroupOK(p string) bool {
	return strings.Contains(p+"/", "/"+CgroupRoot+"/")
}

func (o owned) mountOK(p string) bool {
	for _, pre := range o.mountPrefixes {
		if p == pre || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

func (o owned) linkOK(l string) bool {
	return strings.HasPrefix(l, "veth") || toSet(o.links)[l]
}

func filter(xs []string, ok func(string) bool) []string {
	var out []string
	for _, x := range xs {
		if ok(x) {
			out = append(out, x)
		}
	}
	return out
}

// restore puts the host back to before: it kills what runs in cgroups created since, unmounts mount points
// created since (deepest first), removes those cgroups, deletes interfaces created since, writes the sysctls back and
// removes entries created since in the watched host folders. Every step runs even when an earlier one failed; the
// errors are returned together.
func restore(before HostState, own owned) error {
	var errs []string
	fail := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }

	now, err := Snapshot()
	if err != nil {
		return err
	}
	newCgroups := filter(added(before.Cgroups, now.Cgroups), own.cgroupOK)
	for _, cg := range newCgroups {
		killCgroup(cg)
	}
	// Mounts: deepest first, detached, so a busy one still goes; repeat, as one unmount can reveal another.
	for round := 0; round < 3; round++ {
		now, _ = Snapshot()
		mounts := filter(added(before.Mounts, now.Mounts), own.mountOK)
		if len(mounts) == 0 {
			break
		}
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && round == 2 {
				fail("unmount %s: %v", m, err)
			}
		}
	}
	// Cgroups: children before parents; a cgroup is removed with rmdir once its processes are gone.
	sort.Slice(newCgroups, func(i, j int) bool { return len(newCgroups[i]) > len(newCgroups[j]) })
	for _, cg := range newCgroups {
		var err error
		for i := 0; i < 50; i++ {
			if err = syscall.Rmdir(cg); err == nil || os.IsNotExist(err) {
				err = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			fail("remove cgroup %s: %v", cg, err)
		}
	}
	// Propagation: mounts that were private before are made private again (the node made / rshared).
	now, _ = Snapshot()
	for _, m := range before.Mounts {
		if before.Propagation[m] == "private" && now.Propagation[m] != "" && now.Propagation[m] != "private" {
			if err := syscall.Mount("", m, "", syscall.MS_PRIVATE, ""); err != nil {
				fail("make %s private again: %v", m, err)
			}
		}
	}
	for _, l := range filter(added(before.Links, now.Links), own.linkOK) {
		if out, err := exec.Command("ip", "link", "delete", l).CombinedOutput(); err != nil {
			if _, statErr := os.Stat("/sys/class/net/" + l); statErr == nil { // a veth goes with its peer
				fail("delete link %s: %v: %s", l, err, out)
			}
		}
	}
	for k, v := range before.Sysctls {
		if cur, err := os.ReadFile("/proc/sys/" + k); err == nil && strings.TrimSpace(string(cur)) != v {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				fail("restore sysctl %s=%s: %v", k, v, err)
			}
		}
	}
	now, _ = Snapshot()
	paths := added(before.Paths, now.Paths)
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			fail("remove %s: %v", p, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("restore the host: %s", strings.Join(errs, "; "))
	}
	return nil
}

// added lists what is in now and not in before, in now's order.
func added(before, now []string) []string {
	b := toSet(before)
	var out []string
	for _, x := range now {
		if !b[x] {
			out = append(out, x)
		}
	}
	return out
}

// killCgroup SIGKILLs every process in a cgroup (v1 controllers and v2 alike list them in cgroup.procs).
func killCgroup(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
