package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

var testNode *Node

// hostRoot is a fixture GPU host whose devices the nvidia runtime stand-in injects; runtimeBin that runtime.
var hostRoot, runtimeBin string

const testDir = "/var/lib/kube-gpu-stack-test"

func TestMain(m *testing.M) {
	runtimeBin = filepath.Join(testDir, "bin", "nvidia-runtime")
	opts := Options{
		Dir:      testDir,
		Runtimes: map[string]string{"nvidia": runtimeBin},
		// a GPU node as NFD (off here) and the NodeFeatureRule would label it, on the OS the driver stand-in plays
		Labels: map[string]string{
			"nvidia.com/gpu.present":                                  "true",
			"feature.node.kubernetes.io/system-os_release.ID":         "ubuntu",
			"feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
		},
	}
	os.Exit(RunPackage(m, "tests/node", opts, func(n *Node) error {
		testNode = n
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		hostRoot = filepath.Join(n.Dir, "host")
		if err := HostTree(hostRoot, false); err != nil {
			return err
		}
		if err := buildRuntime(ctx, n); err != nil {
			return err
		}
		return importImages(ctx, n, runtimeBin)
	}))
}

// buildRuntime builds the nvidia runtime stand-in and its injection list: the driver root's nvidia-smi and
// NVIDIA libraries (never its glibc: the real runtime does not inject one either) and the fixture's devices.
func buildRuntime(ctx context.Context, n *Node) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", runtimeBin, "./tests/node/standin/nvidia-runtime")
	cmd.Dir, cmd.Env = n.ModuleDir, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the nvidia runtime stand-in: %v: %s", err, out)
	}
	cfg, err := json.Marshal(map[string]any{
		"runc":       "/usr/sbin/runc",
		"driverRoot": "/run/nvidia/driver",
		"files":      []string{"/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
		"devices":    []string{filepath.Join(hostRoot, "dev", "nvidia0"), filepath.Join(hostRoot, "dev", "nvidiactl")},
	})
	if err != nil {
		return err
	}
	return os.WriteFile(runtimeBin+".json", cfg, 0o644)
}

// A pod on the bridge network reaches the API server as in-cluster clients do, with the service account's token
// and the cluster CA, through the `kubernetes` Service's ClusterIP: no kube-proxy, no NAT.
func TestPodReachesAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := testNode.Cluster.Client
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "apiprobe", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:      testNode.Name,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "probe", Image: probeImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	got, err := waitPodDone(ctx, "default", pod.Name)
	logs, _ := c.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil || got.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("probe pod did not succeed (%v): %s\nstatus: %+v", err, logs, got.Status)
	}
	want := fmt.Sprintf("system:serviceaccount:default:default from uid 65532 through https://%s:443", Address)
	if !strings.Contains(string(logs), want) {
		t.Fatalf("probe said %q, want %q", logs, want)
	}
}

func waitPodDone(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	var got *corev1.Pod
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := testNode.Cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if got == nil {
		got = &corev1.Pod{}
	}
	return got, err
}

// The node registers with its address on the harness's own interface, never the machine's.
func TestNodeAddress(t *testing.T) {
	node, err := testNode.Cluster.Client.CoreV1().Nodes().Get(context.Background(), testNode.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && a.Address != Address {
			t.Errorf("InternalIP %s, want %s", a.Address, Address)
		}
	}
}

// An image that was not imported is never fetched from its registry: containerd sends the registry to a closed
// loopback port, so the pull fails at once and nothing leaves the machine.
func TestNoPull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testNode.Cluster.Client
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nopull", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: testNode.Name, Containers: []corev1.Container{{
			Name: "c", Image: "ghcr.io/kube-gpu-stack/not-imported:1", ImagePullPolicy: corev1.PullIfNotPresent,
		}}},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	var msg string
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false, nil
		}
		msg = p.Status.ContainerStatuses[0].State.Waiting.Message
		return msg != "", nil
	})
	if err != nil || !strings.Contains(msg, "127.0.0.1:9") {
		t.Fatalf("pull of a missing image: %v %q, want a refused connection to 127.0.0.1:9", err, msg)
	}
}

// withRuntimes restarts the node's containerd with these runtime handlers in place of the harness's for the time of
// t, and gives it the harness's back at t's end.
func withRuntimes(t *testing.T, ctx context.Context, runtimes map[string]string) {
	t.Helper()
	if err := testNode.RestartContainerd(ctx, runtimes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testNode.RestartContainerd(context.Background(), testNode.Runtimes); err != nil {
			t.Errorf("give containerd the harness's runtimes back: %v", err)
		}
	})
}
