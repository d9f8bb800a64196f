package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validatorcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/syncbuffer"
)

// HealthRun is the Run component of the GPU health agent.
const HealthRun = "gpu-health"

// SetGPUMonitor makes the stand-in run the GPU health agent (`validator health`, the nvidia-gpu-health pods) of
// node in-process, from its pod's environment, with m for NVML: from when the node's driver is loaded (the pod's
// init container waits for the driver's validation) until the pod is deleted (paused with the GPU operands during
// a driver change, or uninstalled). Without a monitor a node's agent pod is only marked Ready.
func (k *Kubelet) SetGPUMonitor(node string, m gpuhealth.Monitor) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.monitors[node] = m
}

// DriverLoaded says whether node's fixture host has the NVIDIA modules loaded (true on a node without a fixture).
func (k *Kubelet) DriverLoaded(node string) bool { return k.driverLoaded(node) }

// healthAgent returns the agent container of pod and node's monitor, when the stand-in runs it.
func (k *Kubelet) healthAgent(pod *corev1.Pod) (*corev1.Container, gpuhealth.Monitor) {
	k.mu.Lock()
	m := k.monitors[pod.Spec.NodeName]
	k.mu.Unlock()
	for i, c := range pod.Spec.Containers {
		if len(c.Command) == 2 && c.Command[0] == "validator" && c.Command[1] == "health" && m != nil {
			return &pod.Spec.Containers[i], m
		}
	}
	return nil, nil
}

// runHealth runs the agent of pod until ctx ends (the pod's deletion).
func (k *Kubelet) runHealth(ctx context.Context, pod *corev1.Pod, c *corev1.Container, m gpuhealth.Monitor) {
	node := pod.Spec.NodeName
	run := Run{Pod: pod.Name, Component: HealthRun, Node: node, Args: c.Command, Started: time.Now()}
	var out syncbuffer.Buffer
	defer func() {
		run.Ended, run.Output = time.Now(), out.String()
		k.record(run)
	}()
	// the init container's wait for the driver
	if wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) { return k.driverLoaded(node), nil }) != nil {
		return
	}
	o, err := validatorcli.HealthOptionsFromEnv(envOf(pod, c))
	if err != nil {
		fmt.Fprintln(&out, "health:", err)
		return
	}
	// the image's NVML library, which the monitor stands for
	root, err := os.MkdirTemp("", "gpu-health-")
	if err != nil {
		fmt.Fprintln(&out, "health:", err)
		return
	}
	defer os.RemoveAll(root)
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu", gpuhealth.NVMLLibrary)
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err == nil {
		err = os.WriteFile(lib, nil, 0o644)
	}
	o.Client, o.Monitor, o.HostRoot, o.DriverInstallDir, o.Source = k.apiFor(HealthRun, node), m, root, root, gpuhealth.SourceNVML
	o.Complete()
	if err = o.Validate(); err == nil {
		err = o.Run(ctx, &out)
	}
	if err != nil && ctx.Err() == nil {
		run.ExitCode = 1
		fmt.Fprintln(&out, "health:", err)
	}
}
