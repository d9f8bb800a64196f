// Package node runs a real worker node beside the local control plane (internal/cluster): containerd and runc from
// Debian packages, the bridge CNI plugin, and a kubelet built from the pinned Kubernetes module (ci/build-node.sh).
// Pods run in real containers, from images built here and imported into containerd, never pulled. Stop puts the
// machine back as Start found it (mounts, cgroups, network namespaces and interfaces, sysctls, CNI results, pod
// logs), and the package's own test checks that it did.
//
// Network: the node's address is on an interface of its own that the harness creates (a bridge without ports), in 198.18.0.0/15 (the benchmarking
// range), so that no test traffic reaches the machine's own interfaces. The API server listens there on port 443,
// and the Service range is chosen so that the `kubernetes` Service's ClusterIP (the range's first address) IS that
// address: in-cluster clients (KUBERNETES_SERVICE_HOST:443) then reach the API server through the pod's default
// route with neither kube-proxy nor NAT rules, so there is no iptables state to put back.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

const (
	// Address is the node's IP and the API server's, on the interface Link.
	Address = "198.18.0.1"
	// ServiceRange puts the `kubernetes` Service's ClusterIP on Address (see the package comment).
	ServiceRange = "198.18.0.0/24"
	// PodRange is the bridge's subnet; the bridge takes its first address as the pods' gateway.
	PodRange = "198.18.1.0/24"
	// Link and Bridge are the interfaces the harness creates.
	Link   = "kgs-node0"
	Bridge = "kgs-cni0"
	// DevicePluginDir is fixed in the kubelet, whatever its root folder.
	DevicePluginDir = "/var/lib/kubelet/device-plugins"
)

// Packages are the Debian packages the node needs, by a file each provides.
var Packages = map[string]string{
	"containerd":                  "/usr/bin/containerd",
	"runc":                        "/usr/sbin/runc",
	"containernetworking-plugins": "/usr/lib/cni/bridge",
	"iproute2":                    "/usr/sbin/ip",
	// setpriv: containerd gets a parent-death signal under the loop that restarts it
	"util-linux": "/usr/bin/setpriv",
	// a static shell for the stand-in images (the upstream images run `sh -c` commands)
	"busybox-static": "/bin/busybox",
	// the fixture driver's nvidia-smi and libraries are C, dynamically linked against glibc as the real ones are
	"gcc":       "/usr/bin/gcc",
	"libc6-dev": "/usr/include/stdio.h",
}

// ErrMissing means a piece the node needs is not on this machine (not root, no kubelet built, ...).
var ErrMissing = errors.New("real node not available")

// Options configure a node.
type Options struct {
	// Name is the Node's name (default "kgs-node").
	Name string
	// Dir holds containerd's and the kubelet's folders (default /var/lib/kube-gpu-stack-test); it is removed on Stop.
	Dir string
	// KubeletDir holds the kubelet binary (default: what ci/build-node.sh prints, building it when needed).
	KubeletDir string
	// ModuleDir is this module's root (default: found from the working directory).
	ModuleDir string
	// Runtimes are extra containerd runtime handlers (handler -> binary runc is replaced by).
	Runtimes map[string]string
	// Labels are set on the Node when it registers.
	Labels map[string]string
	// Log receives the processes' output (default: discarded).
	Log io.Writer
	// ClusterOptions are passed on to cluster.Start (the API server address and flags are set by the node).
	ClusterOptions cluster.Options
}

// Complete fills defaults.
func (o *Options) Complete() error {
	if o.Name == "" {
		o.Name = "kgs-node"
	}
	if o.Dir == "" {
		o.Dir = "/var/lib/kube-gpu-stack-test"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.ModuleDir == "" {
		dir, err := moduleRoot()
		if err != nil {
			return err
		}
		o.ModuleDir = dir
	}
	return nil
}

// Validate says why a node cannot start here, wrapping ErrMissing.
func (o *Options) Validate() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (containerd, mounts, cgroups, interfaces)", ErrMissing)
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		return fmt.Errorf("%w: no /sys/fs/cgroup", ErrMissing)
	}
	return nil
}

// Node is a running node and the control plane it registered with.
type Node struct {
	Options
	Cluster *cluster.Cluster
	// Before is the host as Start found it; Stop restores it.
	Before HostState
	// Cleared is what Start put back after an earlier run that died without Stop (empty when none did).
	Cleared []string

	socket string
	// containerdLoop is the shell that keeps containerd running (see startContainerd)
	containerdLoop *proc
	lock           *HostLock
	procs          []*proc
	once           sync.Once
	errs           []error
}

// Start takes the machine's node lock, installs missing packages, builds or reuses the kubelet, clears what a run
// that died without Stop left, snapshots the host and saves the snapshot beside Dir, creates the node's interface,
// starts the control plane, containerd and the kubelet, imports the pause image and waits for the Node to be
// Ready. On error everything started is stopped again.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if err := opts.Complete(); err != nil {
		return nil, err
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	// the lock first: a second run's apt-get, snapshot and clearing must wait for this one's node
	lock, err := LockHost(ctx, opts.Dir, os.Stdout)
	if err != nil {
		return nil, err
	}
	n, err := startLocked(ctx, opts, lock)
	if err != nil {
		lock.Release()
		return nil, err
	}
	return n, nil
}

func startLocked(ctx context.Context, opts Options, lock *HostLock) (*Node, error) {
	if err := EnsurePackages(ctx, opts.Log); err != nil {
		return nil, err
	}
	if opts.KubeletDir == "" {
		dir, err := BuildKubelet(ctx, opts.ModuleDir, opts.Log)
		if err != nil {
			return nil, err
		}
		opts.KubeletDir = dir
	}
	cleared, err := ClearStale(opts.Dir)
	if err != nil {
		return nil, err
	}
	before, err := Snapshot()
	if err != nil {
		return nil, err
	}
	if err := SaveBefore(opts.Dir, before); err != nil {
		return nil, err
	}
	n := &Node{Options: opts, Before: before, Cleared: cleared, lock: lock, socket: containerdSocket(opts.Dir)}
	if err := n.start(ctx); err != nil {
		n.Stop()
		return nil, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	// A bridge without ports serves as the dummy interface: some kernels (this machine's) have no dummy driver.
	for _, c := range [][]string{
		{"link", "add", Link, "type", "bridge"},
		{"addr", "add", Address + "/32", "dev", Link},
		{"link", "set", Link, "up"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", c...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	// A node's / is shared (systemd does it at boot): Bidirectional and HostToContainer volumes need it. This
	// machine's is private; Stop makes it private again.
	if err := syscall.Mount("", "/", "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make / rshared: %w", err)
	}
	// The driver pod mounts the host's /dev/log (the syslog socket, an untyped hostPath, so it must exist).
	if _, err := os.Lstat("/dev/log"); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile("/dev/log", nil, 0o666); err != nil {
			return err
		}
	}
	copts := n.ClusterOptions
	copts.Log = n.Log
	copts.APIServerAddress, copts.APIServerPort = Address, 443
	copts.APIServerArgs = map[string][]string{
		"service-cluster-ip-range": {ServiceRange},
		// pod logs and exec go to the node's InternalIP, not to a hostname this machine cannot resolve
		"kubelet-preferred-address-types": {"InternalIP,Hostname"},
		// real pods get their service account token mounted (envtest turns this admission plugin off)
		"disable-admission-plugins": nil,
	}
	var err error
	if n.Cluster, err = cluster.Start(ctx, copts); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	pause := GoImage{Ref: PauseImage, Package: "./tests/node/standin/pause", Binary: "/pause", User: "65535:65535"}
	img, err := pause.Build(ctx, n.ModuleDir)
	if err != nil {
		return err
	}
	archive := filepath.Join(n.Dir, "pause.tar")
	if err := WriteArchive(archive, map[string]v1.Image{PauseImage: img}); err != nil {
		return err
	}
	if err := n.Import(ctx, archive); err != nil {
		return err
	}
	if err := n.writeCNI(); err != nil {
		return err
	}
	start := time.Now()
	if err := n.startKubelet(); err != nil {
		return err
	}
	if err := n.waitReady(ctx); err != nil {
		return err
	}
	fmt.Fprintf(n.Log, "node %s Ready %s after the kubelet started\n", n.Name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	dir := filepath.Join(n.Dir, "containerd")
	for _, d := range []string{"root", "state", "opt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			return err
		}
	}
	if err := n.writeContainerdConfig(n.Runtimes); err != nil {
		return err
	}
	// Every registry request goes to a proxy on a closed loopback port: an image that was not imported fails at once,
	// and no request (not even a DNS lookup) leaves the machine.
	noRegistry := []string{"HTTPS_PROXY=http://127.0.0.1:9", "HTTP_PROXY=http://127.0.0.1:9", "NO_PROXY=", "https_proxy=", "http_proxy=", "no_proxy="}
	// containerd runs as systemd runs it on a node (containerd.service: Restart=always): started again whenever it
	// exits. The NVIDIA toolkit's installer "restarts" it by SIGHUP, which containerd does not handle, so it exits.
	// The loop is the process group Stop kills; the pause stands for systemd's RestartSec. containerd dies with the
	// loop (setpriv's parent-death signal), as the loop dies with the test binary: a killed run leaves no containerd.
	loop := `while :; do setpriv --pdeathsig KILL "$0" --config "$1"; echo "containerd exited ($?), starting it again" >&2; sleep 1; done`
	defaultSIGHUP()
	if err := n.spawnEnv(noRegistry, "/bin/sh", "-c", loop, Packages["containerd"], n.ContainerdConfig()); err != nil {
		return err
	}
	n.containerdLoop = n.procs[len(n.procs)-1]
	if err := n.waitContainerd(ctx); err != nil {
		return err
	}
	// the toolkit's restart of containerd is a SIGHUP: a containerd that ignores it would never load the runtime
	if ignored, err := ignoresSIGHUP(n.ContainerdPID()); err != nil || ignored {
		return fmt.Errorf("containerd must die on SIGHUP as under systemd (ignored: %v, %v)", ignored, err)
	}
	return nil
}

// defaultSIGHUP makes the processes this binary starts from now on die on SIGHUP, as containerd does under systemd.
// A test binary started under nohup (or by anything else that ignores SIGHUP) passes the ignored SIGHUP down through
// every exec, so containerd would shrug off the toolkit's SIGHUP and never load the nvidia runtime. Go resets in a
// child each signal it handles itself, so handling SIGHUP here (and dropping it: an ignored SIGHUP stays ignored for
// this binary) gives the children the default action back.
func defaultSIGHUP() {
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
}

// ignoresSIGHUP says whether the process pid ignores SIGHUP (bit 0 of SigIgn in its status).
func ignoresSIGHUP(pid int) (bool, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			if err != nil {
				return false, fmt.Errorf("/proc/%d/status: SigIgn %q: %w", pid, mask, err)
			}
			return bits&(1<<(uint(syscall.SIGHUP)-1)) != 0, nil
		}
	}
	return false, fmt.Errorf("/proc/%d/status has no SigIgn", pid)
}

// ContainerdConfig is containerd's main config file.
func (n *Node) ContainerdConfig() string { return filepath.Join(n.Dir, "containerd", "config.toml") }

// ContainerdSocket is containerd's socket.
func (n *Node) ContainerdSocket() string { return n.socket }

// ContainerdPID is the pid of the containerd now running (0 when none is).
func (n *Node) ContainerdPID() int {
	loop := n.containerdLoop.cmd.Process.Pid
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", loop, loop))
	for _, f := range strings.Fields(string(raw)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == Packages["containerd"] {
				return pid
			}
		}
	}
	return 0
}

// ContainerdStarted is when the containerd now running started, and so read its config (zero when none runs). The
// kernel keeps a process's start in clock ticks since boot (USER_HZ, 100 a second on every Linux ABI); the boot's
// wall time comes from the boot clock, precise where /proc/stat's btime is whole seconds.
func (n *Node) ContainerdStarted() (time.Time, error) {
	pid := n.ContainerdPID()
	if pid == 0 {
		return time.Time{}, nil
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// the fields after the command's closing parenthesis start at the third (state); starttime is the 22nd
	_, rest, _ := strings.Cut(string(raw), ") ")
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(fields))
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("/proc/%d/stat starttime: %w", pid, err)
	}
	var sinceBoot unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &sinceBoot); err != nil {
		return time.Time{}, err
	}
	boot := now.Add(-time.Duration(sinceBoot.Nano()))
	return boot.Add(time.Duration(ticks) * 10 * time.Millisecond), nil
}

// RestartContainerd writes containerd's config with these extra runtime handlers (handler -> binary runc is
// replaced by; what else the file held is lost) and restarts containerd, as an admin's edit and `systemctl restart`
// would; it returns once the new containerd answers and the node is Ready again.
func (n *Node) RestartContainerd(ctx context.Context, runtimes map[string]string) error {
	if err := n.writeContainerdConfig(runtimes); err != nil {
		return err
	}
	if pid := n.ContainerdPID(); pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return err
		}
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return n.ContainerdPID() != pid, nil
		}); err != nil {
			return fmt.Errorf("containerd %d did not stop: %w", pid, err)
		}
	}
	if err := n.waitContainerd(ctx); err != nil {
		return err
	}
	return n.waitReady(ctx)
}

func (n *Node) waitContainerd(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return exec.CommandContext(ctx, "ctr", "--address", n.socket, "version").Run() == nil, nil
	})
}

func (n *Node) writeContainerdConfig(handlers map[string]string) error {
	dir := filepath.Join(n.Dir, "containerd")
	var runtimes strings.Builder
	for handler, bin := range handlers {
		fmt.Fprintf(&runtimes, `
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s]
          runtime_type = "io.containerd.runc.v2"
          # the device plugin's CDI annotations reach the runtime, as the toolkit's installer configures its handlers
          # given the chart's NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES
          container_annotations = ["cdi.k8s.io/*"]
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[1]s.options]
            BinaryName = %q
            SystemdCgroup = false
`, handler, bin)
	}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = %q
  [plugins."io.containerd.grpc.v1.cri"]
    # never pulled: built locally and imported
    sandbox_image = %q
    # this VM has no AppArmor, and no CAP_SYS_RESOURCE to raise oom_score_adj beyond containerd's own
    disable_apparmor = true
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = %q
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            BinaryName = "/usr/sbin/runc"
            SystemdCgroup = false
%s`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.socket, n.socket+".ttrpc", filepath.Join(dir, "opt"),
		PauseImage, filepath.Join(n.Dir, "cni", "net.d"), runtimes.String())
	return os.WriteFile(n.ContainerdConfig(), []byte(cfg), 0o600)
}

// ImportImage builds g and imports it into containerd under g.Ref, through an archive in the node's folder, and
// returns the archive's size.
func (n *Node) ImportImage(ctx context.Context, g GoImage) (int64, error) {
	img, err := g.Build(ctx, n.ModuleDir)
	if err != nil {
		return 0, err
	}
	archive := filepath.Join(n.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(g.Ref)+".tar")
	if err := WriteArchive(archive, map[string]v1.Image{g.Ref: img}); err != nil {
		return 0, err
	}
	info, err := os.Stat(archive)
	if err != nil {
		return 0, err
	}
	return info.Size(), n.Import(ctx, archive)
}

// Import imports a docker-archive or OCI tarball into containerd's CRI namespace, where the kubelet finds it.
func (n *Node) Import(ctx context.Context, archive string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %v: %s", archive, err, out)
	}
	return nil
}

// Images lists the image references containerd holds in the CRI namespace.
func (n *Node) Images(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.socket, "-n", "k8s.io", "images", "list", "-q").Output()
	if err != nil {
		return nil, fmt.Errorf("ctr images list: %w", err)
	}
	return strings.Fields(string(out)), nil
}

func (n *Node) writeCNI() error {
	dir := filepath.Join(n.Dir, "cni", "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// No ipMasq: pods talk only to the node's own address, so no NAT rule is needed (or left behind).
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kube-gpu-stack-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    }
  ]
}
`, Bridge, PodRange, filepath.Join(n.Dir, "cni", "ipam"))
	return os.WriteFile(filepath.Join(dir, "10-kube-gpu-stack-test.conflist"), []byte(conf), 0o644)
}

// KubeletRoot is the kubelet's --root-dir.
// containerdSocket is where the containerd of a node with folder dir listens.
func containerdSocket(dir string) string { return filepath.Join(dir, "containerd", "containerd.sock") }

func (n *Node) KubeletRoot() string { return filepath.Join(n.Dir, "kubelet") }

// makeCgroupRoot creates CgroupRoot in every controller: the kubelet wants its cgroup root to exist. A new cpuset
// cgroup starts with no CPUs and memory nodes, so it gets its parent's.
func makeCgroupRoot() error {
	ctrls, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, c := range ctrls {
		dir := filepath.Join("/sys/fs/cgroup", c.Name(), CgroupRoot)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", c.Name(), f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("%s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

func (n *Node) startKubelet() error {
	if err := makeCgroupRoot(); err != nil {
		return err
	}
	root := n.KubeletRoot()
	if err := os.MkdirAll(root, 0o750); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 on this machine, managed by the kubelet itself (no systemd as PID 1)
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
failSwapOn: false
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzPort: 0
podLogsDir: %s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
# the imported images cannot be pulled again: never collect them, never evict for disk
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
registerNode: true
resolvConf: /etc/resolv.conf
serializeImagePulls: false
`, CgroupRoot, n.socket, Address, filepath.Join(n.Dir, "pod-logs"))
	path := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	var labels []string
	for k, v := range n.Labels {
		labels = append(labels, k+"="+v)
	}
	args := []string{
		"--config=" + path, "--kubeconfig=" + n.Cluster.Kubeconfig, "--root-dir=" + root,
		"--cert-dir=" + filepath.Join(n.Dir, "kubelet-pki"), "--hostname-override=" + n.Name,
		"--node-ip=" + Address, "--v=1",
	}
	if len(labels) > 0 {
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	return n.spawn(filepath.Join(n.KubeletDir, "kubelet"), args...)
}

func (n *Node) waitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		node, err := n.Cluster.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = c.Reason + ": " + c.Message
				if c.Status == corev1.ConditionTrue {
					for _, t := range node.Spec.Taints {
						if t.Key == corev1.TaintNodeNotReady {
							return false, nil
						}
					}
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s not Ready: %v (last: %s)", n.Name, err, last)
	}
	return nil
}

// proc is a started process; done closes when it has exited (err then says how).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (n *Node) spawn(path string, args ...string) error { return n.spawnEnv(nil, path, args...) }

func (n *Node) spawnEnv(env []string, path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = n.Log, n.Log
	// own process group; killed with the test binary if it dies first
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", filepath.Base(path), err)
	}
	p := &proc{name: filepath.Base(path), cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	n.procs = append(n.procs, p)
	return nil
}

// exited names a process of the node that has stopped, if any.
func (n *Node) exited() error {
	for _, p := range n.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v (its log is in E2E_LOG)", p.name, p.err)
		default:
		}
	}
	return nil
}

// StopOnSignal stops the node (and the machine's restore) when the process is interrupted, then exits.
func (n *Node) StopOnSignal() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		n.Stop()
		os.Exit(1)
	}()
}

// Stop stops the kubelet, every container and shim, containerd and the control plane, then restores the host to
// Before and removes Dir. It returns what could not be restored; it is safe to call more than once.
func (n *Node) Stop() error {
	n.once.Do(func() {
		// the kubelet first (children last-started first), so it does not restart what is being torn down
		for i := len(n.procs) - 1; i >= 0; i-- {
			stopProc(n.procs[i])
			if i == len(n.procs)-1 {
				n.killShims()
			}
		}
		if n.Cluster != nil {
			n.Cluster.Stop()
		}
		if err := restore(n.Before, ownedBy(n.Dir)); err != nil {
			n.errs = append(n.errs, err)
		}
		if err := os.RemoveAll(n.Dir); err != nil {
			n.errs = append(n.errs, err)
		}
		// the saved state stays when the host is not back, so the next run retries from it
		if len(n.errs) == 0 {
			if err := os.Remove(beforePath(n.Dir)); err != nil {
				n.errs = append(n.errs, err)
			}
		}
		if err := n.lock.Release(); err != nil {
			n.errs = append(n.errs, err)
		}
	})
	return errors.Join(n.errs...)
}

// killShims kills the containerd shims of this node's containerd (they outlive it by design) and the containers
// they run, which the cgroup cleanup would otherwise find still running.
func (n *Node) killShims() {
	for _, pid := range shimsServing(commandLines(), n.socket) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	cgroups, _ := cgroupDirs()
	for _, cg := range cgroups {
		if (owned{}).cgroupOK(cg) {
			killCgroup(cg)
		}
	}
}

func stopProc(p *proc) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// EnsurePackages installs the Debian packages the node needs when one is missing (apt-get update once).
func EnsurePackages(ctx context.Context, log io.Writer) error {
	var missing []string
	for pkg, file := range Packages {
		if _, err := os.Stat(file); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: packages %v missing and no apt-get", ErrMissing, missing)
	}
	start := time.Now()
	for _, args := range [][]string{
		{"update", "-qq"},
		append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...),
	} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v: %s", args[0], err, out)
		}
	}
	fmt.Fprintf(log, "installed %v in %s\n", missing, time.Since(start).Round(time.Second))
	return nil
}

// BuildKubelet runs ci/build-node.sh (which reuses a complete cache folder) and returns the folder it prints.
func BuildKubelet(ctx context.Context, moduleDir string, log io.Writer) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(moduleDir, "ci", "build-node.sh"))
	cmd.Stderr = log
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ci/build-node.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
