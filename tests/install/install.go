// Package install installs and removes the chart on a live cluster through the helm v3 SDK, as `helm install
// --wait` and `helm uninstall --wait` do, and reads back where the operand pods run.
package install

import (
	"context"
	"fmt"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/placement"
)

// Target is where releases go: a kubeconfig, a release name and its namespace.
type Target struct {
	Kubeconfig, Release, Namespace string
	// Timeout bounds --wait.
	Timeout time.Duration
}

func (t Target) config() (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &t.Kubeconfig
	flags.Namespace = &t.Namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, t.Namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Install installs the chart from the repository with values files and --set overrides, waiting until every
// workload is ready. A failed install is uninstalled again, so it never blocks the next one.
func (t Target) Install(ctx context.Context, valueFiles []string, set ...string) (*release.Release, error) {
	cfg, err := t.config()
	if err != nil {
		return nil, err
	}
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		return nil, err
	}
	vals, err := chartrender.Values(valueFiles, set)
	if err != nil {
		return nil, err
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName, inst.Namespace, inst.CreateNamespace = t.Release, t.Namespace, true
	inst.Wait, inst.Timeout = true, t.Timeout
	rel, err := inst.RunWithContext(ctx, chrt, vals)
	if err != nil {
		_ = t.Uninstall()
		return nil, fmt.Errorf("helm install %v: %w", valueFiles, err)
	}
	return rel, nil
}

// Uninstall removes the release and waits for its objects to go.
func (t Target) Uninstall() error {
	cfg, err := t.config()
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.Wait, un.Timeout = true, t.Timeout
	if _, err := un.Run(t.Release); err != nil {
		return fmt.Errorf("helm uninstall %s: %w", t.Release, err)
	}
	return nil
}

// Running returns where the release's operand pods are Running now: node -> operand -> DaemonSet, with an
// entry for every given node.
func (t Target) Running(ctx context.Context, client kubernetes.Interface, nodes []string) (placement.Placement, error) {
	pods, err := client.CoreV1().Pods(t.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	p := placement.Placement{}
	for _, n := range nodes {
		p[n] = map[string]string{}
	}
	for _, pod := range pods.Items {
		operand := pod.Labels["app.kubernetes.io/component"]
		if operand == "" || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		ds := pod.Labels["app.kubernetes.io/name"]
		if strings.Contains(ds, "mps-control-daemon") {
			operand = "mps-control-daemon"
		}
		if p[pod.Spec.NodeName] == nil {
			p[pod.Spec.NodeName] = map[string]string{}
		}
		p[pod.Spec.NodeName][operand] = ds
	}
	return p, nil
}

// Expected is where the release's DaemonSets must run on the cluster's nodes as they are now, by the scheduler's
// own affinity and taint code.
func Expected(ctx context.Context, client kubernetes.Interface, rel *release.Release) (placement.Placement, error) {
	dss, err := placement.DaemonSets(rel.Manifest)
	if err != nil {
		return nil, err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var ptrs []*corev1.Node
	for i := range nodes.Items {
		ptrs = append(ptrs, &nodes.Items[i])
	}
	return placement.Place(dss, ptrs)
}
