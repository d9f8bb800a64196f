package node

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// toolkitTestImage is the reference the toolkit image built from source is imported under: a registry of this
// test's, so the source build is never taken for upstream's image; its contract row is upstream's.
const toolkitTestImage = "kube-gpu-stack.test/nvidia/k8s/container-toolkit:v1.20.0"

// The NVIDIA container toolkit's installer, built from its source at the chart's version (ci/build-toolkit.sh),
// deployed by the chart against the node's real containerd: with the chart's env and mounts it copies the runtime
// onto the host, writes the nvidia runtime handlers into the drop-in file the chart names and the import of it
// into containerd's main config, and restarts containerd (SIGHUP, which containerd does not handle: it exits and
// the harness starts it again, as systemd's Restart=always does); a pod of runtime class nvidia then runs through
// the installed runtime; helm uninstall stops the installer, which takes the handlers out again and restarts
// containerd. The harness's own nvidia handler is off meanwhile, so only the installer can provide one.
func TestToolkitConfiguresContainerd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	start := time.Now()
	dir, err := BuildToolkit(ctx, testNode.ModuleDir, testNode.Log)
	if errors.Is(err, ErrMissing) && os.Getenv("CI") != "true" {
		t.Skipf("SKIP: the container toolkit cannot be built here (CI=true makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	g, err := ToolkitImage(toolkitTestImage, dir, filepath.Join(testNode.Dir, "toolkit-fixtures"))
	if err != nil {
		t.Fatal(err)
	}
	size, err := testNode.ImportImage(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the toolkit built (or reused) and its image (%d files, %.1f MB) imported in %s", len(g.Files), float64(size)/1e6,
		time.Since(start).Round(100*time.Millisecond))

	// Only the installer may give containerd an nvidia handler here: the harness's goes for this test.
	withRuntimes(t, ctx, nil)
	root := filepath.Join(testNode.Dir, "host-toolkit")
	if err := HostTree(root, false); err != nil {
		t.Fatal(err)
	}
	unmount, err := MountKernelFS(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(); err != nil {
			t.Error(err)
		}
	})

	installDir := filepath.Join(testNode.Dir, "toolkit-install")
	dropIn := filepath.Join(testNode.Dir, "containerd", "conf.d", "99-nvidia.toml")
	runtimeBin := filepath.Join(installDir, "toolkit", "nvidia-container-runtime")
	mainBefore := readFile(t, testNode.ContainerdConfig())
	pid := testNode.ContainerdPID()
	target := install.Target{Kubeconfig: testNode.Cluster.Kubeconfig, Release: "kgs-toolkit", Namespace: namespace,
		Timeout: 5 * time.Minute}
	start = time.Now()
	if _, err := target.Install(ctx, []string{toolkitValues(t, root, installDir, dropIn)}); err != nil {
		describePods(t, ctx)
		t.Fatalf("install: %v", err)
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			if err := target.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}
	})

	// the handler in the drop-in, the import in the main config, and a containerd started after both were written:
	// one that read them. A new pid alone is not that: an installer that exits early (see below) takes its drop-in
	// out and restarts containerd, and the next one writes it again before its own restart.
	handler := `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]`
	importLine := filepath.Dir(dropIn) + "/*.toml"
	// The installer restarts containerd by SIGHUP, which containerd does not handle, so it exits and the harness (as
	// systemd) starts it again. On 7 December every make test run that was started under nohup failed here: the
	// ignored SIGHUP reached containerd through every exec (the harness now gives it back its default, and checks it).
	// Upstream's early exits are retried by the kubelet with its back-off, hence the long wait.
	var loaded string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		loaded = containerdLoaded(dropIn, handler, testNode.ContainerdConfig(), importLine)
		return loaded == "", nil
	})
	if err != nil {
		describePods(t, ctx)
		installerLog(t, ctx)
		t.Fatalf("the installer did not write the nvidia runtime into %s and restart containerd: %v (%s)", dropIn, err, loaded)
	}
	if testNode.ContainerdPID() == pid {
		t.Fatalf("containerd %d loaded the nvidia runtime without a restart", pid)
	}
	t.Logf("containerd restarted with the nvidia runtime in %s, %s after the install began",
		dropIn, time.Since(start).Round(100*time.Millisecond))
	if err := testNode.waitContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	drop := readFile(t, dropIn)
	t.Logf("%s:\n%s", dropIn, drop)
	if !strings.Contains(drop, fmt.Sprintf("BinaryName = %q", runtimeBin)) {
		t.Errorf("the drop-in's nvidia runtime does not run %s (the host path of the chart's toolkitInstallDir):\n%s", runtimeBin, drop)
	}
	// containerd 1.6 has no CDI of its own (enable_cdi does nothing): the device plugin's CDI annotations reach the
	// nvidia runtime only through the handler's container_annotations, and the runtime reads them only with the
	// prefix in its config (the chart's NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES)
	passes := `container_annotations = ["cdi.k8s.io/*"]`
	if !strings.Contains(tomlTable(drop, handler), passes) {
		t.Errorf("the drop-in's nvidia runtime does not pass the CDI annotations on (%s):\n%s", passes, drop)
	}
	runtimeConfig := readFile(t, filepath.Join(installDir, "toolkit", ".config", "nvidia-container-runtime", "config.toml"))
	for _, want := range []string{`mode = "cdi"`, `annotation-prefixes = ["cdi.k8s.io/"]`, `default-kind = "management.nvidia.com/gpu"`} {
		if !strings.Contains(runtimeConfig, want) {
			t.Errorf("the installed runtime config lacks %s:\n%s", want, runtimeConfig)
		}
	}
	mainAfter := readFile(t, testNode.ContainerdConfig())
	if !strings.Contains(mainAfter, importLine) {
		t.Errorf("containerd's main config does not import %s (RUNTIME_DROP_IN_CONFIG_HOST_PATH):\n%s", importLine, mainAfter)
	}
	// what the installer copied onto the host: the runtime wrappers and the programs they run
	for _, f := range []string{"nvidia-container-runtime", "nvidia-container-runtime.real", "nvidia-container-runtime.cdi",
		"nvidia-container-runtime.legacy", "nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime-hook",
		"nvidia-container-toolkit", ".config/nvidia-container-runtime/config.toml"} {
		if _, err := os.Stat(filepath.Join(installDir, "toolkit", f)); err != nil {
			t.Errorf("the installer did not install %s: %v", f, err)
		}
	}
	out, err := exec.CommandContext(ctx, runtimeBin+".real", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "1.20.0") {
		t.Errorf("the installed nvidia-container-runtime.real --version: %v: %s", err, out)
	}

	managementSpec(t, installDir)
	runOnNvidia(t, ctx, runtimeBin)
	// Upstream v1.20.0's installer signals containerd with SIGHUP to the pid it reads from the credentials of
	// containerd's first message on a fresh connection, but it turns SO_PASSCRED on only after connecting: when that
	// message was sent before, its credentials carry pid 0, and kill(0, SIGHUP) hits the installer's own process
	// group. About 6% of connections to this node's containerd do (a probe of the same calls, 2 x 200 tries: 13 and
	// 11). At install the installer then exits early ("Signal received, exiting early") with containerd not
	// restarted, and the kubelet starts it again; at its stop the drop-in goes but containerd keeps the handlers it
	// loaded until it restarts. For the reader, not a failure.
	pods, err := testNode.Cluster.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "nvidia-container-toolkit-ctr" {
				t.Logf("the installer's container restarted %d times", s.RestartCount)
			}
		}
	}

	// uninstall: the installer, stopped, takes its handlers out and signals containerd
	pid = testNode.ContainerdPID()
	start = time.Now()
	uninstalled = true
	if err := target.Uninstall(); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(dropIn)
		return errors.Is(err, os.ErrNotExist), nil
	})
	if err != nil {
		t.Fatalf("after helm uninstall the installer did not remove %s: %v", dropIn, err)
	}
	t.Logf("helm uninstall: drop-in removed after %s", time.Since(start).Round(100*time.Millisecond))
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		now := testNode.ContainerdPID()
		return now != 0 && now != pid, nil
	})
	if err != nil {
		t.Logf("containerd (pid %d) was not restarted after the drop-in went: upstream's SIGHUP went to its own process group (see above)", pid)
	} else {
		t.Logf("containerd restarted %s after the uninstall began", time.Since(start).Round(100*time.Millisecond))
	}
	if err := testNode.waitContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	// Upstream v1.20.0 drops the import again only from a main config that holds nothing else (version and
	// imports), and never removes its CDI spec; the pod's runtime-config-keeper, stopped after the installer, gives
	// the config its bytes back and removes the spec
	var mainEnd string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		mainEnd = readFile(t, testNode.ContainerdConfig())
		_, err := os.Stat(managementCDISpec)
		return mainEnd == mainBefore && errors.Is(err, os.ErrNotExist), nil
	})
	if mainEnd != mainBefore {
		t.Errorf("containerd's main config after uninstall is not its bytes from before the install (imports %s: %v):\n%s\nbefore:\n%s",
			importLine, strings.Contains(mainEnd, importLine), mainEnd, mainBefore)
	}
	if _, err := os.Stat(managementCDISpec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the installer's %s stays after uninstall: %v", managementCDISpec, err)
	}
	if err == nil {
		t.Logf("containerd's main config has its bytes from before the install, and the CDI spec is gone, %s after the uninstall began",
			time.Since(start).Round(100*time.Millisecond))
	}
	if _, err := os.Stat(runtimeBin); err == nil {
		t.Logf("the installed toolkit stays in %s after uninstall (upstream's installer removes only the runtime config)", installDir)
	}
}

// managementCDISpec is where the installer writes its CDI spec for management containers (the chart's CDI root).
const managementCDISpec = "/var/run/cdi/management.nvidia.com-gpu.yaml"

// cdiEdits is the part of a CDI spec's container edits the checks read.
type cdiEdits struct {
	DeviceNodes []struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath"`
	} `json:"deviceNodes"`
	Mounts []struct {
		HostPath string `json:"hostPath"`
	} `json:"mounts"`
	Hooks []struct {
		Path string `json:"path"`
	} `json:"hooks"`
}

// managementSpec checks the CDI spec the installer generated for the stack's own containers
// (management.nvidia.com/gpu=all, the chart's NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND), as the host sees it:
// the device nodes under the host's /dev, the driver's libraries under the driver root on the host, found by the
// versioned names the driver stand-in installs, and the hooks run by the nvidia-cdi-hook in the install folder.
func managementSpec(t *testing.T, installDir string) {
	t.Helper()
	t.Cleanup(func() { os.Remove(managementCDISpec) })
	raw, err := os.ReadFile(managementCDISpec)
	if err != nil {
		t.Errorf("the installer wrote no CDI spec for management containers: %v", err)
		return
	}
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name           string   `json:"name"`
			ContainerEdits cdiEdits `json:"containerEdits"`
		} `json:"devices"`
		ContainerEdits cdiEdits `json:"containerEdits"`
	}
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		t.Fatalf("%s: %v", managementCDISpec, err)
	}
	t.Logf("%s:\n%s", managementCDISpec, raw)
	// a device's own edits and the common ones, as the host names their files
	var names, nodes, mounts, hooks []string
	edits := []cdiEdits{spec.ContainerEdits}
	for _, d := range spec.Devices {
		names = append(names, d.Name)
		edits = append(edits, d.ContainerEdits)
	}
	for _, e := range edits {
		for _, n := range e.DeviceNodes {
			nodes = append(nodes, cmp.Or(n.HostPath, n.Path))
		}
		for _, m := range e.Mounts {
			mounts = append(mounts, m.HostPath)
		}
		for _, h := range e.Hooks {
			hooks = append(hooks, h.Path)
		}
	}
	if spec.Kind != "management.nvidia.com/gpu" || !slices.Contains(names, "all") {
		t.Errorf("%s: kind %q with devices %v, want management.nvidia.com/gpu with device all", managementCDISpec, spec.Kind, names)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia0"} {
		if !slices.Contains(nodes, want) {
			t.Errorf("%s does not name the device node %s (nodes %v)", managementCDISpec, want, nodes)
		}
	}
	lib := "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + standInDriverVersion
	if !slices.Contains(mounts, lib) {
		t.Errorf("%s does not mount %s, the driver's NVML as the host names it (mounts %v)", managementCDISpec, lib, mounts)
	}
	hook := filepath.Join(installDir, "toolkit", "nvidia-cdi-hook")
	if len(hooks) == 0 || slices.ContainsFunc(hooks, func(p string) bool { return p != hook }) {
		t.Errorf("%s runs hooks %v, want each to be %s", managementCDISpec, hooks, hook)
	}
}

// runOnNvidia runs a pod of runtime class nvidia and checks that containerd ran its container through runtimeBin.
func runOnNvidia(t *testing.T, ctx context.Context, runtimeBin string) {
	c := testNode.Cluster.Client
	class := "nvidia"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-runtime-probe", Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeName: testNode.Name, RuntimeClassName: &class, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "probe", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := c.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		zero := int64(0)
		_ = c.CoreV1().Pods(namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}()
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil || got.Status.Phase != corev1.PodRunning {
		events, _ := c.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
		for _, e := range events.Items {
			t.Logf("event: %s %s", e.Reason, e.Message)
		}
		t.Fatalf("a pod of runtime class nvidia did not run: %v (status %+v)", err, got.Status)
	}
	id := strings.TrimPrefix(got.Status.ContainerStatuses[0].ContainerID, "containerd://")
	info, err := exec.CommandContext(ctx, "ctr", "--address", testNode.ContainerdSocket(), "-n", "k8s.io", "containers", "info", id).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr containers info %s: %v: %s", id, err, info)
	}
	// the container's runtime options, as containerd stored them: runc's Options message, whose BinaryName is
	// the binary the shim runs in runc's place
	var ctr struct {
		Runtime struct {
			Name    string
			Options struct {
				TypeURL string `json:"type_url"`
				Value   []byte
			}
		}
	}
	if err := json.Unmarshal(info, &ctr); err != nil {
		t.Fatalf("ctr containers info %s: %v", id, err)
	}
	if !bytes.Contains(ctr.Runtime.Options.Value, []byte(runtimeBin)) {
		t.Errorf("containerd did not run the pod's container through %s: its runtime %s, options %s %q", runtimeBin,
			ctr.Runtime.Name, ctr.Runtime.Options.TypeURL, ctr.Runtime.Options.Value)
	}
	// The installed nvidia-container-runtime is upstream's wrapper script: without an nvidia module in /proc/modules
	// (none on this machine) it execs runc itself and never starts nvidia-container-runtime.real.
	if modules, _ := os.ReadFile("/proc/modules"); !strings.Contains("\n"+string(modules), "\nnvidia ") {
		t.Logf("no nvidia module is loaded here: the wrapper %s ran runc directly", runtimeBin)
	}
}

// toolkitValues: the driver stand-in on a fixture host (it makes the driver root the toolkit needs) and its
// validator (the chart wants it beside a driver), the toolkit image built here with the node's real containerd
// files, the install dir in the node's folder, and nothing else.
func toolkitValues(t *testing.T, hostRoot, installDir, dropIn string) string {
	registry, rest, _ := strings.Cut(toolkitTestImage, "/")
	repo, tag, _ := strings.Cut(rest, ":")
	values := fmt.Sprintf(`global:
  stackImage: {tag: %[1]q, pullPolicy: Never}
  # the toolkit image is built here, not upstream's: unpinned
  imageDigests: {"nvidia/k8s/container-toolkit:v1.20.0": ""}
  extraEnv: {DRIVER_MANAGER_KERNEL: fixture}
  hostPaths:
    rootFS: %[2]s
    kubeletRootDir: %[3]s
    toolkitInstallDir: %[4]s
nfd: {mode: none}
devicePlugin: {enabled: false}
dcgmExporter: {enabled: false}
gfd: {enabled: false}
migManager: {enabled: false}
driver:
  os: [ubuntu22.04]
  startupProbe: {initialDelaySeconds: 2, periodSeconds: 2}
toolkit:
  image: {registry: %[5]s, repository: %[6]s, tag: %[7]s}
  # The installer makes no control device nodes here: it reads their numbers from the kernel's /proc/devices, where
  # no NVIDIA driver registered on this machine (the fixture host has its own /dev/nvidiactl). containerd's CDI
  # switch stays on, as the chart's CDI_ENABLED=true has it.
  extraEnv: {CREATE_DEVICE_NODES: none, RUNTIME_ENABLE_CDI: "true"}
  runtimeConfig:
    config: %[8]s
    dropInConfig: %[9]s
    socket: %[10]s
validator:
  cuda: {enabled: false}
  plugin: {enabled: false}
hooks:
  validation: {enabled: false}
`, projectTag, hostRoot, testNode.KubeletRoot(), installDir, registry, repo, tag, testNode.ContainerdConfig(), dropIn,
		testNode.ContainerdSocket())
	path := filepath.Join(t.TempDir(), "toolkit.yaml")
	if err := os.WriteFile(path, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// tomlTable is the body of the table whose header line is header in a TOML file, up to the next header.
func tomlTable(file, header string) string {
	_, body, _ := strings.Cut(file, header+"\n")
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "[") {
			break
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// containerdLoaded says what is missing before the containerd now running holds the handler ("" when nothing is):
// the drop-in must hold it, the main config must import the drop-in's folder, and containerd must have started
// (and so read both) after both were last written.
func containerdLoaded(dropIn, handler, mainConfig, importLine string) string {
	started, err := testNode.ContainerdStarted()
	if err != nil || started.IsZero() {
		return fmt.Sprintf("no containerd runs (%v)", err)
	}
	for _, f := range []struct{ path, holds string }{{dropIn, handler}, {mainConfig, importLine}} {
		info, err := os.Stat(f.path)
		if err != nil {
			return err.Error()
		}
		if raw, err := os.ReadFile(f.path); err != nil || !strings.Contains(string(raw), f.holds) {
			return fmt.Sprintf("%s does not hold %s", f.path, f.holds)
		}
		if !started.After(info.ModTime()) {
			return fmt.Sprintf("containerd (started %s) has not read %s (written %s)",
				started.Format(time.StampMilli), f.path, info.ModTime().Format(time.StampMilli))
		}
	}
	return ""
}

// installerLog logs the toolkit container's output (its last run's where it restarted), all of it: what a failure
// of the installer needs.
func installerLog(t *testing.T, ctx context.Context) {
	c := testNode.Cluster.Client
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Log(err)
		return
	}
	for _, p := range pods.Items {
		if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "nvidia-container-toolkit-ctr" }) {
			continue
		}
		for _, previous := range []bool{true, false} {
			logs, err := c.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: "nvidia-container-toolkit-ctr", Previous: previous}).DoRaw(ctx)
			if err == nil {
				t.Logf("%s (previous: %v):\n%s", p.Name, previous, logs)
			}
		}
	}
}
