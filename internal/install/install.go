// Package install installs and removes the chart on a live cluster through the helm v3 SDK, as `helm install
// --wait` and `helm uninstall --wait` do (their waits polled faster, see quickClient), and reads back where the
// operand pods run.
package install

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/kube"
	"helm.sh/helm/v3/pkg/postrender"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// Target is where releases go: a kubeconfig, a release name and its namespace.
type Target struct {
	Kubeconfig, Release, Namespace string
	// Timeout bounds --wait.
	Timeout time.Duration
	// NoWait installs as `helm install` without --wait: the post-install gate is then the only wait, and it says
	// why a workload is not ready (Helm's own wait runs before the hooks and only says "timed out").
	NoWait bool
	// ChartVersion, when set, stamps the chart's version and appVersion (tests pin both to one value; a release
	// bumps both).
	ChartVersion string
	// Released installs the repository's chart with the versions its Chart.yaml files give (the chart's and each
	// subchart's), as `helm install charts/kube-gpu-stack` from a clone does, instead of the tests' pinned
	// chartrender.ChartVersion: a release the user upgrades from the clone afterwards then changes no pod's labels.
	Released bool
	// KeepFailed leaves a failed release installed (for inspection); by default it is uninstalled again.
	KeepFailed bool
	// Chart, when set, is what `helm install CHART` gets instead of the repository's chart: a chart archive or an
	// oci:// reference (pulled with ChartVersion, over plain HTTP: the tests' registries are loopback ones).
	Chart string
	// PostRenderer, when set, edits the rendered manifests before Helm applies them, as `helm install
	// --post-renderer` does (a test pointing a host path at its fixture, say).
	PostRenderer postrender.PostRenderer
}

func (t Target) config() (*action.Configuration, error) {
	cfg := new(action.Configuration)
	if err := cfg.Init(newClientGetter(t.Kubeconfig, t.Namespace), t.Namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, err
	}
	if c, ok := cfg.KubeClient.(*kube.Client); ok {
		cfg.KubeClient = quickClient{c}
	}
	return cfg, nil
}

// prepare loads the Helm configuration, the chart from the repository (stamped with ChartVersion when set) and
// the values.
func (t Target) prepare(valueFiles, set []string) (*action.Configuration, *chart.Chart, map[string]any, error) {
	cfg, err := t.config()
	if err != nil {
		return nil, nil, nil, err
	}
	if t.Chart != "" {
		chrt, err := t.locate(cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		vals, err := chartrender.Values(valueFiles, set)
		return cfg, chrt, vals, err
	}
	load := chartrender.Load
	if t.Released {
		load = chartrender.LoadReleased
	}
	chrt, err := load(chartrender.ChartDir())
	if err != nil {
		return nil, nil, nil, err
	}
	if t.ChartVersion != "" {
		chrt.Metadata.Version, chrt.Metadata.AppVersion = t.ChartVersion, t.ChartVersion
	}
	vals, err := chartrender.Values(valueFiles, set)
	return cfg, chrt, vals, err
}

// locate fetches Chart as `helm install` does (an oci:// chart through Helm's registry client) and loads it.
func (t Target) locate(cfg *action.Configuration) (*chart.Chart, error) {
	client, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard))
	if err != nil {
		return nil, err
	}
	cfg.RegistryClient = client
	inst := action.NewInstall(cfg)
	inst.ChartPathOptions.Version, inst.ChartPathOptions.PlainHTTP = t.ChartVersion, true
	settings := cli.New()
	cache, err := os.MkdirTemp("", "helm-cache-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(cache)
	settings.RepositoryCache, settings.RepositoryConfig = cache, filepath.Join(cache, "repositories.yaml")
	path, err := inst.LocateChart(t.Chart, settings)
	if err != nil {
		return nil, fmt.Errorf("locate chart %s: %w", t.Chart, err)
	}
	return loader.Load(path)
}

// Install installs the chart from the repository with values files and --set overrides, waiting until every
// workload is ready and the hooks have run. A failed install is uninstalled again (unless KeepFailed), so it never
// blocks the next one.
func (t Target) Install(ctx context.Context, valueFiles []string, set ...string) (*release.Release, error) {
	cfg, chrt, vals, err := t.prepare(valueFiles, set)
	if err != nil {
		return nil, err
	}
	inst := action.NewInstall(cfg)
	inst.ReleaseName, inst.Namespace, inst.CreateNamespace = t.Release, t.Namespace, true
	inst.Wait, inst.Timeout, inst.PostRenderer = !t.NoWait, t.Timeout, t.PostRenderer
	rel, err := inst.RunWithContext(ctx, chrt, vals)
	if err != nil {
		if !t.KeepFailed {
			_ = t.Uninstall()
		}
		return rel, fmt.Errorf("helm install %v: %w", valueFiles, err)
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

// Test runs the release's test hooks, as `helm test` (and Flux's test.enable) does.
func (t Target) Test() (*release.Release, error) {
	cfg, err := t.config()
	if err != nil {
		return nil, err
	}
	rt := action.NewReleaseTesting(cfg)
	rt.Namespace, rt.Timeout = t.Namespace, t.Timeout
	rel, err := rt.Run(t.Release)
	if err != nil {
		return rel, fmt.Errorf("helm test %s: %w", t.Release, err)
	}
	return rel, nil
}

// Upgrade upgrades the release to the chart in the repository with values files and --set overrides (values
// are replaced, as `helm upgrade` without --reuse-values does), running the upgrade hooks.
func (t Target) Upgrade(ctx context.Context, valueFiles []string, set ...string) (*release.Release, error) {
	cfg, chrt, vals, err := t.prepare(valueFiles, set)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Wait, up.Timeout, up.PostRenderer = t.Namespace, !t.NoWait, t.Timeout, t.PostRenderer
	rel, err := up.RunWithContext(ctx, t.Release, chrt, vals)
	if err != nil {
		return rel, fmt.Errorf("helm upgrade %v: %w", valueFiles, err)
	}
	return rel, nil
}

// Status is the release's latest revision, as `helm status` shows it.
func (t Target) Status() (*release.Release, error) {
	cfg, err := t.config()
	if err != nil {
		return nil, err
	}
	return action.NewStatus(cfg).Run(t.Release)
}

// Rollback rolls the release back to revision, as `helm rollback` does: the revision's stored manifest and its
// rollback hooks.
func (t Target) Rollback(revision int) error {
	cfg, err := t.config()
	if err != nil {
		return err
	}
	rb := action.NewRollback(cfg)
	rb.Version, rb.Wait, rb.Timeout = revision, !t.NoWait, t.Timeout
	if err := rb.Run(t.Release); err != nil {
		return fmt.Errorf("helm rollback %s %d: %w", t.Release, revision, err)
	}
	return nil
}

// DriverGenerations is the generation of every driver DaemonSet in namespace: what a change of their pod
// template moves and an upgrade that leaves the drivers alone keeps.
func DriverGenerations(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]int64, error) {
	dss, err := client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, ds := range dss.Items {
		out[ds.Name] = ds.Generation
	}
	return out, nil
}
