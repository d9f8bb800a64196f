package node

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

const (
	namespace      = "gpu-operator"
	validationsDir = "/run/nvidia/validations"
)

// nodeValues is the profile for this node: host paths on the fixture, only the operands that can be played here
// (the driver with its driver-manager init container, the toolkit stand-in, the validator), the rest off.
func nodeValues(t *testing.T, hostRoot string) string {
	values := fmt.Sprintf(`global:
  # the image built and imported here; never pulled
  stackImage: {tag: %[4]q, pullPolicy: Never}
  # the toolkit image is built here, not upstream's: unpinned
  imageDigests: {"nvidia/k8s/container-toolkit:v1.20.0": ""}
  # the driver manager's module and mount operations act on the fixture host (rootFS), not this machine's kernel
  extraEnv: {DRIVER_MANAGER_KERNEL: fixture}
  hostPaths:
    rootFS: %[1]s
    kubeletRootDir: %[2]s
nfd: {mode: none}
devicePlugin: {enabled: false}
dcgmExporter: {enabled: false}
gfd: {enabled: false}
migManager: {enabled: false}
driver:
  os: [ubuntu22.04]
  startupProbe: {initialDelaySeconds: 2, periodSeconds: 2}
toolkit:
  # the stand-in never restarts containerd, the delay's reason (TestToolkitConfiguresContainerd keeps the default)
  startDelaySeconds: 0
  runtimeConfig:
    config: %[1]s/etc/containerd/config.toml
    dropInConfig: %[1]s/etc/containerd/conf.d/99-nvidia.toml
    socket: %[3]s
validator:
  cuda: {enabled: false}
  plugin: {enabled: false}
hooks:
  validation: {timeoutSeconds: 90, installTimeoutSeconds: 90}
`, hostRoot, testNode.KubeletRoot(), testNode.socket, projectTag)
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The chart on a real node, in real containers, on a new GPU node (no driver loaded) and on one whose loaded driver
// it replaces. The driver pod's driver-manager init container (as root) finds the node's driver and, on the second,
// unloads the old modules and unmounts the old driver root in the fixture (DRIVER_MANAGER_KERNEL=fixture); the
// driver stand-in installs; the validator's and toolkit's init containers pass; the validator writes driver-ready
// and toolkit-ready; the upgrade gate lets the node go; the post-install gate passes; no container is refused by
// RBAC; helm uninstall leaves the fixture host as the install left it.
func TestChartOnNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		loaded bool
		// what the install is meant to change on the host (/dev/char links stay, as nvidia-ctk's do: they point at
		// the driver's devices)
		changes []string
	}{
		{"new node", false, []string{"+ dev/char/195:0", "+ dev/char/195:255"}},
		{"driver change", true, []string{"~ proc/modules", "~ proc/self/mountinfo", "+ dev/char/195:0", "+ dev/char/195:255",
			"- sys/module/nvidia", "- sys/module/nvidia/refcnt", "- sys/module/nvidia/holders",
			"- sys/module/nvidia/holders/nvidia_modeset", "- sys/module/nvidia/holders/nvidia_uvm",
			"- sys/module/nvidia_uvm", "- sys/module/nvidia_uvm/refcnt", "- sys/module/nvidia_uvm/holders",
			"- sys/module/nvidia_modeset", "- sys/module/nvidia_modeset/refcnt", "- sys/module/nvidia_modeset/holders"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(testNode.Dir, "host-"+strings.ReplaceAll(tc.name, " ", "-"))
			if err := HostTree(root, tc.loaded); err != nil {
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
			chartOnNode(t, root, tc.loaded, tc.changes)
		})
	}
}

func chartOnNode(t *testing.T, hostRoot string, loaded bool, changes []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	before := treeSnapshot(t, hostRoot)
	target := install.Target{Kubeconfig: testNode.Cluster.Kubeconfig, Release: "kgs", Namespace: namespace,
		Timeout: 6 * time.Minute, NoWait: true, KeepFailed: true}
	start := time.Now()
	_, err := target.Install(ctx, []string{nodeValues(t, hostRoot)})
	t.Logf("helm install (post-install gate included) took %s", time.Since(start).Round(time.Second))
	if err != nil {
		t.Errorf("install: %v", err)
	}
	describePods(t, ctx)

	afterInstall := treeSnapshot(t, hostRoot)
	wantChanged := toSet(changes)
	for _, d := range diffTrees(before, afterInstall) {
		if !wantChanged[d] {
			t.Errorf("the install changed the fixture host unexpectedly: %s", d)
		}
		delete(wantChanged, d)
	}
	for d := range wantChanged {
		t.Errorf("the install did not change the fixture host as expected: %s missing", d)
	}
	for _, f := range []string{"driver-ready", "toolkit-ready"} {
		if _, err := os.Stat(filepath.Join(validationsDir, f)); err != nil {
			t.Errorf("the validator did not write %s: %v", f, err)
		}
	}
	if raw, err := os.ReadFile(filepath.Join(validationsDir, "driver-ready")); err == nil {
		t.Logf("driver-ready:\n%s", raw)
	}
	pods, err := testNode.Cluster.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			logs, _ := testNode.Cluster.Client.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name}).DoRaw(ctx)
			if strings.Contains(string(logs), "is forbidden") {
				t.Errorf("pod %s: container %s was refused by the API server (RBAC):\n%s", p.Name, c.Name, logs)
			}
			if c.Name == "driver-manager" {
				if c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil || *c.SecurityContext.RunAsUser != 0 {
					t.Errorf("pod %s: the driver manager does not run as root", p.Name)
				}
				if got := strings.Contains(string(logs), "no NVIDIA driver loaded"); got == loaded {
					t.Errorf("pod %s: the driver manager saw the node's driver wrong (loaded: %v):\n%s", p.Name, loaded, logs)
				}
			}
		}
		for _, s := range p.Status.InitContainerStatuses {
			i := slices.IndexFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == s.Name })
			if i >= 0 && p.Spec.InitContainers[i].RestartPolicy != nil && *p.Spec.InitContainers[i].RestartPolicy == corev1.ContainerRestartPolicyAlways {
				// a native sidecar runs for the pod's life
				if s.State.Running == nil || s.Started == nil || !*s.Started {
					t.Errorf("pod %s: sidecar %s is not running: %s", p.Name, s.Name, state(s))
				}
				continue
			}
			if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
				t.Errorf("pod %s: init container %s did not pass: %s", p.Name, s.Name, state(s))
			}
		}
		for _, s := range p.Status.ContainerStatuses {
			if p.Spec.RestartPolicy == corev1.RestartPolicyAlways && !s.Ready {
				t.Errorf("pod %s: container %s not ready: %s", p.Name, s.Name, state(s))
			}
		}
	}

	if !loaded {
		c := testNode.Cluster.Client
		t.Run("driver pod deleted by hand", func(t *testing.T) {
			driverStopsOnAnEmptiedNode(t, ctx, "", func(old *corev1.Pod) {
				if err := c.CoreV1().Pods(namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			})
		})
		t.Run("driver changed by helm upgrade", func(t *testing.T) {
			driverStopsOnAnEmptiedNode(t, ctx, nextDriverImage, func(*corev1.Pod) {
				// the post-upgrade gate waits for the change (a node of its own pool is its canary)
				if _, err := target.Upgrade(ctx, []string{nodeValues(t, hostRoot)}, "driver.image.tag="+nextDriverTag); err != nil {
					t.Errorf("helm upgrade: %v", err)
				}
			})
		})
		afterInstall = treeSnapshot(t, hostRoot) // what the uninstall must leave: the node as the takeovers left it
	}

	start = time.Now()
	if err := target.Uninstall(); err != nil {
		t.Errorf("uninstall: %v", err)
	}
	t.Logf("helm uninstall took %s", time.Since(start).Round(time.Second))
	if diff := diffTrees(afterInstall, treeSnapshot(t, hostRoot)); len(diff) > 0 {
		t.Errorf("helm uninstall left the fixture host changed:\n  %s", strings.Join(diff, "\n  "))
	}
}

func state(s corev1.ContainerStatus) string {
	switch {
	case s.State.Terminated != nil:
		return fmt.Sprintf("exit %d (%s) %s", s.State.Terminated.ExitCode, s.State.Terminated.Reason, s.State.Terminated.Message)
	case s.State.Waiting != nil:
		return fmt.Sprintf("waiting (%s) %s", s.State.Waiting.Reason, s.State.Waiting.Message)
	case s.State.Running != nil:
		return "running"
	}
	return "unknown"
}

// describePods logs every pod's containers with their state and last lines of output: what a failure needs.
func describePods(t *testing.T, ctx context.Context) {
	c := testNode.Cluster.Client
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Log(err)
		return
	}
	tail := int64(15)
	for _, p := range pods.Items {
		t.Logf("pod %s: %s", p.Name, p.Status.Phase)
		for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			logs, _ := c.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, TailLines: &tail}).DoRaw(ctx)
			t.Logf("  %s: %s\n    %s", s.Name, state(s), strings.ReplaceAll(strings.TrimSpace(string(logs)), "\n", "\n    "))
		}
	}
}

// treeSnapshot maps every path under root to its type, mode and content digest.
func treeSnapshot(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += fmt.Sprintf(" %x", sha256.Sum256(data))
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

func diffTrees(before, after map[string]string) []string {
	var out []string
	for p, v := range after {
		if b, ok := before[p]; !ok {
			out = append(out, "+ "+p)
		} else if b != v {
			out = append(out, "~ "+p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			out = append(out, "- "+p)
		}
	}
	sort.Strings(out)
	return out
}
