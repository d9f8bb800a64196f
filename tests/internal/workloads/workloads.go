// Package workloads puts the workloads a driver rollout test watches on simulated GPU nodes: per node, a GPU
// Deployment ("train", one nvidia.com/gpu) and a CPU Deployment ("web"), each pinned to its node, so a test can
// tell which pods a driver change evicted and whether they came back.
package workloads

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// GPUApp and CPUApp are the workloads' app labels; NodeLabel names the node a workload is pinned to.
const (
	GPUApp    = "train"
	CPUApp    = "web"
	NodeLabel = "node"
)

// Deploy creates namespace and, for each node, a GPU and a CPU Deployment of one replica pinned to it.
func Deploy(ctx context.Context, client kubernetes.Interface, namespace string, nodes []string) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, n := range nodes {
		for _, app := range []string{GPUApp, CPUApp} {
			res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
			if app == GPUApp {
				res["nvidia.com/gpu"] = resource.MustParse("1")
			}
			labels := map[string]string{"app": app, NodeLabel: n}
			one := int32(1)
			d := &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: app + "-" + n, Namespace: namespace},
				Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
						NodeSelector: map[string]string{"kubernetes.io/hostname": n},
						Containers:   []corev1.Container{{Name: app, Image: "registry.example/" + app, Resources: corev1.ResourceRequirements{Requests: res, Limits: res}}},
					}}},
			}
			if _, err := client.AppsV1().Deployments(namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("workload %s: %w", d.Name, err)
			}
		}
	}
	return nil
}

// RunningGPU says on which nodes the GPU workload's pod is running (not terminating, on the node it is pinned to).
func RunningGPU(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]bool, error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + GPUApp})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == p.Labels[NodeLabel] {
			out[p.Spec.NodeName] = true
		}
	}
	return out, nil
}
