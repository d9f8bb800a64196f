// Package chartrender renders the umbrella chart exactly as `helm install --dry-run` (and Argo CD's
// `helm template`) would, through the helm v3 SDK, with pinned versions so the output is stable.
package chartrender

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/release"
)

// Pinned facts of every render, so goldens move only when the chart's output does.
const (
	ReleaseName  = "gpu"
	Namespace    = "gpu-operator"
	ChartVersion = "0.0.0-golden"
)

// KubeVersions are the oldest and newest Kubernetes minors the chart supports.
var KubeVersions = []string{"v1.31.0", "v1.37.0"}

// APIVersions are the optional APIs a render may assume (the ServiceMonitor and PrometheusRule CRDs of Prometheus
// Operator; the ValidatingAdmissionPolicy API, which every supported Kubernetes serves but `helm template` does not
// list).
var APIVersions = chartutil.VersionSet{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
	"monitoring.coreos.com/v1/PrometheusRule", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"}

// module is this repository's Go module path, as its go.mod names it.
const module = "github.com/kube-gpu-stack/kube-gpu-stack"

// RepoRoot is the repository root: the nearest folder at or above the working directory (a test's package folder,
// or the root itself under `go run ./ci/...`) whose go.mod declares this module. It is found from the working
// directory because -trimpath builds (make test's) do not keep this file's path; a build that keeps it falls back
// to it when the working directory is elsewhere.
func RepoRoot() string {
	if dir, err := os.Getwd(); err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && declaresModule(b) {
				return d
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// declaresModule says whether a go.mod's module line names this module (ci/ holds other modules' go.mod files).
func declaresModule(gomod []byte) bool {
	for line := range strings.Lines(string(gomod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == module
		}
	}
	return false
}

// ChartDir is the umbrella chart users install.
func ChartDir() string { return filepath.Join(RepoRoot(), "charts", "kube-gpu-stack") }

// Load loads a chart directory or archive and pins the version of it and every dependency. Rendering removes
// disabled subcharts from the chart, so load once per render.
func Load(dir string) (*chart.Chart, error) {
	chrt, err := LoadReleased(dir)
	if err != nil {
		return nil, err
	}
	pin(chrt)
	return chrt, nil
}

// LoadReleased loads a chart directory or archive with the versions its Chart.yaml files give, as `helm install`
// does.
func LoadReleased(dir string) (*chart.Chart, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
		return nil, err
	}
	return chrt, nil
}

func pin(c *chart.Chart) {
	c.Metadata.Version = ChartVersion
	c.Metadata.AppVersion = ChartVersion
	for _, d := range c.Metadata.Dependencies {
		d.Version = ChartVersion
	}
	for _, d := range c.Dependencies() {
		pin(d)
	}
}

// Values merges values files (in order) and --set style overrides.
func Values(files []string, set []string) (map[string]any, error) {
	return (&values.Options{ValueFiles: files, Values: set}).MergeValues(getter.Providers{})
}

// Render renders the chart with the given values for a Kubernetes version and returns the manifest stream as
// `helm template` prints it (manifests, then hooks). Errors carry schema, kubeVersion and template failures.
func Render(ctx context.Context, chrt *chart.Chart, vals map[string]any, kubeVersion string) (string, error) {
	rel, err := DryRun(ctx, chrt, vals, kubeVersion, APIVersions)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(strings.TrimSpace(rel.Manifest))
	b.WriteString("\n")
	for _, h := range rel.Hooks {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", h.Path, strings.TrimSpace(h.Manifest))
	}
	return b.String(), nil
}

// DryRun is `helm install --dry-run` without a cluster for a Kubernetes version whose API server serves apiVersions
// beyond the built-in ones: the release, its manifest, hooks and notes.
func DryRun(ctx context.Context, chrt *chart.Chart, vals map[string]any, kubeVersion string, apiVersions []string) (*release.Release, error) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.ClientOnly = true
	inst.DryRun = true
	inst.Replace = true
	inst.IncludeCRDs = true
	inst.ReleaseName = ReleaseName
	inst.Namespace = Namespace
	inst.KubeVersion = kv
	inst.APIVersions = slices.Clone(apiVersions)
	return inst.RunWithContext(ctx, chrt, vals)
}

// Newest is the newest Kubernetes version the chart is rendered for.
var Newest = KubeVersions[len(KubeVersions)-1]

// RenderRepo renders the repository's chart (ChartDir) with values files (in order) and --set overrides for the
// Newest Kubernetes, as Render does.
func RenderRepo(ctx context.Context, files, set []string) (string, error) {
	chrt, err := Load(ChartDir())
	if err != nil {
		return "", err
	}
	vals, err := Values(files, set)
	if err != nil {
		return "", err
	}
	return Render(ctx, chrt, vals, Newest)
}

// Action is the Helm action a render is for, as templates see it (.Release.IsInstall / IsUpgrade), and the APIs the
// cluster serves beyond the built-in ones and APIVersions (.Capabilities.APIVersions; Argo CD passes the cluster's).
type Action struct {
	Upgrade     bool
	APIVersions []string
}

// RenderFor renders the chart as Helm's engine does for action a against a cluster: every template, hooks and
// manifests alike, one document per object, sorted by template (no schema check: Render does that).
func RenderFor(chrt *chart.Chart, vals map[string]any, kubeVersion string, a Action) (string, error) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	caps.APIVersions = append(caps.APIVersions, APIVersions...)
	caps.APIVersions = append(caps.APIVersions, a.APIVersions...)
	if err := chartutil.ProcessDependenciesWithMerge(chrt, vals); err != nil {
		return "", err
	}
	revision := 1
	if a.Upgrade {
		revision = 2
	}
	opts := chartutil.ReleaseOptions{Name: ReleaseName, Namespace: Namespace, Revision: revision, IsInstall: !a.Upgrade, IsUpgrade: a.Upgrade}
	top, err := chartutil.ToRenderValues(chrt, vals, opts, caps)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := strings.TrimSpace(files[name])
		if body == "" || strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range strings.Split(body, "\n---") {
			if doc = strings.TrimSpace(strings.TrimPrefix(doc, "---")); doc != "" {
				fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, doc)
			}
		}
	}
	return b.String(), nil
}
