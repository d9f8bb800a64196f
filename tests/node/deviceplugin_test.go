package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
//     injected from the plugin's CDI spec by the CDI device names of its allocation; a third stays Pending for want
//     of a GPU.
//
// Fixtures, where this node cannot have the real thing: the GPUs (the simulated NVML and the device nodes, which
// nothing opens), the validator's driver-ready and toolkit-ready (the validator's own checks are proven by
// TestChartOnNode; here the host driver's files are what it would name), the nvidia runtime's library injection
// (the harness's runtime stand-in mounts the host driver's libnvidia-ml.so.1 into the plugin's and GFD's
// containers, as nvidia-container-runtime does), the CDI injection (containerd 1.6 has none: the stand-in applies the
// CDI devices of a container's annotations through the CDI project's library, as the real runtime's CDI mode does),
// and NFD's sysfs (one NVIDIA PCI function).
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
	injectHostDriver(t, root)
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
				Command: []string{"sh", "-c", "echo devices: $(ls /dev | grep '^nvidia[0-9]'); sleep 600"},
				// the image's NVIDIA_VISIBLE_DEVICES=all would have the runtime stand-in add the driver's own devices
				// too: only the CDI devices the plugin allocated may reach the container
				Env:       []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}},
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

// injectHostDriver points the harness's nvidia runtime stand-in at the fixture host's driver for the time of t:
// it mounts the host driver's libnvidia-ml.so.1 (the simulated NVML) into every container of runtime class nvidia
// that asks for GPUs, as nvidia-container-runtime mounts the driver's libraries; no device, since the plugin's
// containers ask for all of them and need none.
func injectHostDriver(t *testing.T, root string) {
	path := runtimeBin + ".json"
	saved, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(saved, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["driverRoot"] = root
	cfg["files"] = []string{"/" + driverLibDir + "/" + config.LibraryName}
	cfg["devices"] = []string{}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, saved, 0o644); err != nil {
			t.Error(err)
		}
	})
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
