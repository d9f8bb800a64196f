package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/build"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// devicePluginImage is the reference the device plugin built from source is imported under: a registry of this
// test's, and the version it was built from (ci/build-device-plugin.sh), so it is never taken for the chart's.
const devicePluginImage = "kube-gpu-stack.test/nvidia/k8s-device-plugin:v0.18.0"

// simulatedGPUs are the node's two simulated H100s (tests/node/simnvml answers NVML for them).
var simulatedGPUs = config.Config{DriverVersion: "580.65.06", CUDAVersion: "13.0", GPUs: []config.GPU{
	{Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-5d1e3c2a-0000-4000-8000-000000000001", MemoryBytes: 85520809984,
		PCIBusID: "0000:3b:00.0", PCIDeviceID: 0x2330, Minor: 0, ComputeCapability: "9.0", MIGCapable: true},
	{Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-5d1e3c2a-0000-4000-8000-000000000002", MemoryBytes: 85520809984,
		PCIBusID: "0000:86:00.0", PCIDeviceID: 0x2330, Minor: 1, ComputeCapability: "9.0", MIGCapable: true},
}}

// The device plugin and GPU feature discovery, built from their source (k8s-device-plugin v0.18.0: the proxy does
// not serve the chart's v0.20.0), deployed by the chart with bundled NFD (built from source too) on the real node,
// whose GPUs are simulated: NVML is tests/node/simnvml, installed as a host driver's libnvidia-ml.so, with the
// GPUs' /dev/nvidia* character devices. The chain a cluster admin relies on runs for real:
//  1. nfd-worker publishes the node's NVIDIA PCI function, nfd-master applies the chart's NodeFeatureRule, and the
//     Node gets nvidia.com/gpu.present=true (the harness's preset labels are taken off first);
//  2. the device plugin's DaemonSet follows that label onto the node, the plugin loads NVML from the driver root
//     the driver's validation named, writes its CDI spec for both GPUs and registers with the real kubelet: the
//     Node's allocatable shows nvidia.com/gpu: 2;
//  3. GFD labels the Node with the GPUs' product, memory and count (through NFD's NodeFeature API);
//  4. two pods asking for one GPU each run, and each container has exactly one /dev/nvidia<N>, a different one,
//     though their image asks for all GPUs (NVIDIA_VISIBLE_DEVICES=all, as CUDA images do): upstream's
//     nvidia-container-runtime, in the CDI mode the chart's toolkit sets, injects the devices the plugin named in
//     the pod's cdi.k8s.io/ annotations from the plugin's CDI spec (containerd 1.6 has no CDI of its own), and the
//     plugin's and GFD's own containers get the driver's libraries from the management CDI spec; a third pod
//     stays Pending for want of a GPU.
//
// Fixtures, where this node cannot have the real thing: the GPUs (the simulated NVML and the device nodes, which
// nothing opens), the validator's driver-ready and toolkit-ready (the validator's own checks are proven by
// TestChartOnNode; here the host driver's files are what it would name), the runtime's setup (upstream's nvidia-ctk
// writes it, with the chart's keys, instead of the toolkit's installer, and the runtime runs without its wrapper's
// check for a loaded nvidia module: see upstreamRuntime), and NFD's sysfs (one NVIDIA PCI function).
func TestDevicePluginOnNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := testNode.Cluster.Client

	start := time.Now()
	nfdDir, err := BuildNFD(ctx, testNode.ModuleDir, testNode.Log)
	var dpDir, toolkitDir string
	if err == nil {
		dpDir, err = BuildDevicePlugin(ctx, testNode.ModuleDir, testNode.Log)
	}
	if err == nil {
		toolkitDir, err = BuildToolkit(ctx, testNode.ModuleDir, testNode.Log)
	}
	if errors.Is(err, ErrMissing) && os.Getenv("CI") != "true" {
		t.Skipf("SKIP: NFD, the device plugin or the toolkit cannot be built here (CI=true makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	lib, err := build.Build(ctx, testNode.ModuleDir, "")
	if errors.Is(err, build.ErrNoCgo) && os.Getenv("CI") != "true" {
		t.Skipf("SKIP: the simulated NVML cannot be built here (CI=true makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	nfd, err := NFDImage(nfdImage, nfdDir)
	if err != nil {
		t.Fatal(err)
	}
	dp, err := DevicePluginImage(devicePluginImage, dpDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []GoImage{nfd, dp} {
		if _, err := testNode.ImportImage(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("NFD, the device plugin and the simulated NVML built (or reused), their images imported in %s", time.Since(start).Round(100*time.Millisecond))

	// the node: a host driver's files and devices for two simulated GPUs, and NFD's sysfs with one NVIDIA function
	root := filepath.Join(testNode.Dir, "host-device-plugin")
	if err := HostTree(root, false); err != nil {
		t.Fatal(err)
	}
	if err := SimulatedGPUs(root, lib, simulatedGPUs); err != nil {
		t.Fatal(err)
	}
	sys := filepath.Join(testNode.Dir, "device-plugin-host", "sys")
	if err := PCIDevice(sys, NVIDIAGPU); err != nil {
		t.Fatal(err)
	}
	// the CDI hook, where the toolkit installs it (global.hostPaths.toolkitInstallDir): the plugin's CDI spec runs it
	// in every GPU container
	toolkitInstall := filepath.Join(testNode.Dir, "toolkit-device-plugin")
	if err := copyFile(filepath.Join(toolkitDir, "nvidia-cdi-hook"), filepath.Join(toolkitInstall, "toolkit", "nvidia-cdi-hook")); err != nil {
		t.Fatal(err)
	}
	seedValidations(t, root)
	runtimeLog := upstreamRuntime(t, ctx, toolkitDir, root, filepath.Join(toolkitInstall, "toolkit", "nvidia-cdi-hook"))
	restore := unlabelNode(t, ctx)
	t.Cleanup(restore)

	// after the uninstall (cleanups run last first): the NFD CRDs the chart keeps on uninstall belong to this
	// release, and another release could not install them again
	t.Cleanup(func() { deleteNFDCRDs(t) })
	target := install.Target{Kubeconfig: testNode.Cluster.Kubeconfig, Release: "kgs-dp", Namespace: namespace,
		Timeout: 5 * time.Minute, NoWait: true, PostRenderer: workerSysfs(sys)}
	start = time.Now()
	if _, err := target.Install(ctx, []string{devicePluginValues(t, root, toolkitInstall)}); err != nil {
		describePods(t, ctx)
		t.Fatalf("install: %v", err)
	}
	t.Cleanup(func() {
		if err := target.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})

	// 1-3: NFD's label, the plugin's registration, GFD's labels
	memoryMiB := fmt.Sprint(simulatedGPUs.GPUs[0].MemoryBytes / (1 << 20))
	var node *corev1.Node
	seen := map[string]time.Duration{}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, testNode.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		gpus := n.Status.Allocatable[gpuResource]
		for what, done := range map[string]bool{
			"gpu.present":       n.Labels[gpuPresent] == "true",
			"allocatable":       gpus.Value() == int64(len(simulatedGPUs.GPUs)),
			"GFD's count label": n.Labels["nvidia.com/gpu.count"] == fmt.Sprint(len(simulatedGPUs.GPUs)),
		} {
			if _, ok := seen[what]; done && !ok {
				seen[what] = time.Since(start).Round(100 * time.Millisecond)
			}
		}
		return len(seen) == 3, nil
	})
	if err != nil {
		describePods(t, ctx)
		operandLogs(t, ctx)
		t.Fatalf("the node was not set up for its GPUs (%v): seen %v; allocatable %v; labels %v", err, seen, node.Status.Allocatable, node.Labels)
	}
	t.Logf("after the install began: %v", seen)
	for label, want := range map[string]string{
		"nvidia.com/gpu.product":       strings.ReplaceAll(simulatedGPUs.GPUs[0].Name, " ", "-"),
		"nvidia.com/gpu.memory":        memoryMiB,
		"nvidia.com/gpu.family":        "hopper",
		"nvidia.com/gpu.compute.major": "9",
		"nvidia.com/cuda.driver.major": "580",
		"nvidia.com/mig.capable":       "true",
	} {
		if got := node.Labels[label]; got != want {
			t.Errorf("GFD's label %s = %q, want %q", label, got, want)
		}
	}

	// the plugin's CDI spec, written through the simulated NVML (containerd 1.6 does not read it); the chart's
	// uninstall leaves it, as upstream's plugin does
	const cdiSpec = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
	t.Cleanup(func() { os.Remove(cdiSpec) })
	spec, err := os.ReadFile(cdiSpec)
	if err != nil {
		t.Errorf("the device plugin wrote no CDI spec: %v", err)
	}
	for _, g := range simulatedGPUs.GPUs {
		if !strings.Contains(string(spec), g.UUID) {
			t.Errorf("the device plugin's CDI spec does not name %s:\n%s", g.UUID, spec)
		}
	}

	// 4: two pods get a GPU each, the third waits
	devices := map[string]string{}
	for i := range 3 {
		name := fmt.Sprintf("gpu-user-%d", i)
		gpuUser(t, ctx, name)
		if i == 2 {
			break
		}
		dev := podGPUDevices(t, ctx, name)
		if len(dev) != 1 {
			t.Fatalf("pod %s sees %v, want exactly one /dev/nvidia<N>", name, dev)
		}
		if other, ok := devices[dev[0]]; ok {
			t.Fatalf("pods %s and %s both got %s", other, name, dev[0])
		}
		devices[dev[0]] = name
	}
	t.Logf("GPU devices the pods see: %v", devices)
	// and it was upstream's runtime that put them there, from the plugin's CDI spec (the devices it injected are
	// named in its log), as it gave the plugin its NVML from the management spec
	log := readFile(t, runtimeLog)
	for _, g := range simulatedGPUs.GPUs {
		if !strings.Contains(log, "k8s.device-plugin.nvidia.com/gpu="+g.UUID) {
			t.Errorf("nvidia-container-runtime's log does not name the CDI device of %s:\n%s", g.UUID, log)
		}
	}
	if !strings.Contains(log, "management.nvidia.com/gpu=all") {
		t.Errorf("nvidia-container-runtime's log does not name the management device the plugin's containers ask for:\n%s", log)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(namespace).Get(ctx, "gpu-user-2", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, string(gpuResource))
		}), nil
	})
	if err != nil {
		p, _ := c.CoreV1().Pods(namespace).Get(ctx, "gpu-user-2", metav1.GetOptions{})
		t.Fatalf("a third pod asking for a GPU of a 2-GPU node was not held Pending for want of %s: %v; status %+v", gpuResource, err, p.Status)
	}
}

const gpuResource = corev1.ResourceName("nvidia.com/gpu")

// gpuUser starts a pod asking for one GPU that lists the GPU devices it sees, then sleeps; its deletion is a
// cleanup of t.
func gpuUser(t *testing.T, ctx context.Context, name string) {
	c := testNode.Cluster.Client
	zero := int64(0)
	class := "nvidia"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": testNode.Name}, RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &zero, RuntimeClassName: &class,
			Containers: []corev1.Container{{Name: "cuda", Image: devicePluginImage, ImagePullPolicy: corev1.PullNever,
				// the image says NVIDIA_VISIBLE_DEVICES=all, as CUDA images do: the runtime must take the plugin's
				// CDI annotations over it, or every pod would see every GPU
				Command:   []string{"sh", "-c", "echo devices: $(ls /dev | grep '^nvidia[0-9]'); sleep 600"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuResource: resource.MustParse("1")}}}},
		},
	}
	if _, err := c.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
}

var devicesLine = regexp.MustCompile(`devices:(.*)`)

// podGPUDevices waits for pod name's container to say which /dev/nvidia<N> it sees, and returns them.
func podGPUDevices(t *testing.T, ctx context.Context, name string) []string {
	c := testNode.Cluster.Client
	var got []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		logs, err := c.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		m := devicesLine.FindSubmatch(logs)
		if m == nil {
			return false, nil
		}
		got = strings.Fields(string(m[1]))
		return true, nil
	})
	if err != nil {
		p, _ := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		events, _ := c.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		for _, e := range events.Items {
			t.Logf("event: %s %s", e.Reason, e.Message)
		}
		t.Fatalf("pod %s never said which GPU devices it sees: %v; status %+v", name, err, p.Status)
	}
	return got
}

// devicePluginValues: bundled NFD and the device plugin and GFD built from source, over the fixture host root and
// the toolkit's install folder; the driver, toolkit, validator and the rest off (the fixture plays their part).
func devicePluginValues(t *testing.T, root, toolkitInstall string) string {
	image := func(ref string) string {
		registry, rest, _ := strings.Cut(ref, "/")
		repo, tag, _ := strings.Cut(rest, ":")
		return fmt.Sprintf("{registry: %s, repository: %s, tag: %s}", registry, repo, tag)
	}
	values := fmt.Sprintf(`global:
  stackImage: {tag: %q, pullPolicy: Never}
  hostPaths: {rootFS: %s, kubeletRootDir: %s, toolkitInstallDir: %s}
nfd:
  mode: bundled
  image: %s
devicePlugin:
  image: %s
gfd:
  image: %s
driver: {enabled: false}
toolkit: {enabled: false}
dcgmExporter: {enabled: false}
migManager: {enabled: false}
validator: {enabled: false}
hooks:
  validation: {enabled: false}
`, projectTag, root, testNode.KubeletRoot(), toolkitInstall, image(nfdImage), image(devicePluginImage), image(devicePluginImage))
	path := filepath.Join(t.TempDir(), "device-plugin.yaml")
	if err := os.WriteFile(path, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// seedValidations writes driver-ready and toolkit-ready as the validator does for a host driver at the fixture
// host root (root on the host, /host in the operands' containers, which mount global.hostPaths.rootFS there), and
// removes them when t ends.
func seedValidations(t *testing.T, root string) {
	if err := os.MkdirAll(validationsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"driver-ready":  fmt.Sprintf("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=%s\nDRIVER_ROOT_CTR_PATH=/host\nNVIDIA_DEV_ROOT=%s\nDEV_ROOT_CTR_PATH=/host\n", root, root),
		"toolkit-ready": "",
	}
	for name, data := range files {
		p := filepath.Join(validationsDir, name)
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s exists before the test: another test left it", p)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
}

// upstreamRuntime makes the node's nvidia runtime handler upstream's nvidia-container-runtime (built from source)
// for the time of t, set up as the chart's toolkit sets it up, by upstream's own tools: nvidia-ctk writes the
// runtime's config with the keys the chart's toolkit env sets (CDI mode, the management kind as the default, the
// device plugin's annotation prefix; TestToolkitConfiguresContainerd checks that the installer writes these) and
// generates the CDI spec for management containers from the fixture host's driver, as the installer does; the handler
// passes cdi.k8s.io/ annotations on, as the installer's handler does with that prefix. The one difference from the
// installed runtime: upstream's wrapper runs runc directly, untouched, unless an nvidia module is loaded
// (/proc/modules), which no module on this machine can be; the handler here is that wrapper less the check.
// It returns the runtime's log (debug level), where it names the CDI devices it injects.
func upstreamRuntime(t *testing.T, ctx context.Context, toolkitDir, root, cdiHook string) string {
	dir := filepath.Join(testNode.Dir, "nvidia-container-runtime")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctk := filepath.Join(toolkitDir, "nvidia-ctk")
	run := func(args ...string) {
		if out, err := exec.CommandContext(ctx, ctk, args...).CombinedOutput(); err != nil {
			t.Fatalf("nvidia-ctk %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	config := filepath.Join(dir, "config.toml")
	run("config", "default", "--output", config)
	run("config", "--config-file", config, "--in-place",
		"--set", "nvidia-container-runtime.mode=cdi",
		"--set", "nvidia-container-runtime.modes.cdi.default-kind=management.nvidia.com/gpu",
		"--set", "nvidia-container-runtime.modes.cdi.annotation-prefixes=cdi.k8s.io/",
		"--set", "nvidia-container-runtime.debug="+filepath.Join(dir, "runtime.log"),
		"--set", "nvidia-container-runtime.log-level=debug",
		"--set", "nvidia-ctk.path="+ctk)
	t.Cleanup(func() { os.Remove(managementCDISpec) })
	run("cdi", "generate", "--mode", "management", "--vendor", "management.nvidia.com", "--class", "gpu",
		"--driver-root", root, "--dev-root", root, "--nvidia-cdi-hook-path", cdiHook, "--output", managementCDISpec)
	wrapper := filepath.Join(dir, "nvidia-container-runtime")
	script := fmt.Sprintf("#!/bin/sh\nPATH=%s:$PATH NVIDIA_CTK_CONFIG_FILE_PATH=%s exec %s \"$@\"\n",
		toolkitDir, config, filepath.Join(toolkitDir, "nvidia-container-runtime"))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	withRuntimes(t, ctx, map[string]string{"nvidia": wrapper})
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(dir, "runtime.log")); err == nil {
				t.Logf("nvidia-container-runtime's log:\n%s", log)
			}
		}
	})
	return filepath.Join(dir, "runtime.log")
}

// operandLogs logs the device plugin's and GFD's containers' output, for a failure.
func operandLogs(t *testing.T, ctx context.Context) {
	c := testNode.Cluster.Client
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			if ctr.Name != "nvidia-device-plugin" && ctr.Name != "gpu-feature-discovery" {
				continue
			}
			logs, err := c.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name}).DoRaw(ctx)
			t.Logf("%s/%s (%v):\n%s", p.Name, ctr.Name, err, logs)
		}
	}
}

// copyFile copies the executable from to to, making to's folder.
func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// deleteNFDCRDs deletes the NFD CustomResourceDefinitions (and with them their objects), as an admin does after
// uninstalling a release whose bundled NFD they came with.
func deleteNFDCRDs(t *testing.T) {
	dyn, err := dynamic.NewForConfig(testNode.Cluster.Config)
	if err != nil {
		t.Error(err)
		return
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	list, err := crds.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Error(err)
		return
	}
	for _, crd := range list.Items {
		if group, _, _ := unstructured.NestedString(crd.Object, "spec", "group"); group == "nfd.k8s-sigs.io" {
			if err := crds.Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete CRD %s: %v", crd.GetName(), err)
			}
		}
	}
}
