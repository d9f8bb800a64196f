package placementplan

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/schemahint"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

// Roles a GPU node may have (nvidia.com/gpu.workload.config).
var roles = map[string]bool{"container": true, "vm-passthrough": true, "vm-vgpu": true}

// Rendered is what plan needs of one render of the chart: the operand DaemonSets, the driver pools the hooks get,
// and how roles are assigned.
type Rendered struct {
	DaemonSets []placement.DaemonSet
	// Pools are the driver pools as the hooks read them (DRIVER_POOLS); nil when the chart renders no hook.
	Pools []driverpools.Pool
	// Sandbox: global.sandboxWorkloads.enabled, so nodes take their role from nvidia.com/gpu.workload.config.
	Sandbox bool
	// DefaultRole is the role of a GPU node without a valid role label (global.sandboxWorkloads.defaultWorkload).
	DefaultRole string
	// Evict: the driver managers evict GPU pods (driver.manager.gpuPodDeletion, the pre-upgrade hook's --evict), so
	// a PodDisruptionBudget that never allows an eviction blocks the change; true when the chart renders no hook.
	Evict bool
	// Force: hooks.preUpgrade.force (the hook's --force), so such budgets fail their nodes alone instead.
	Force bool
	// VGPUPools are the vGPU manager pools as the pre-upgrade hook reads them (VGPU_MANAGER_POOLS).
	VGPUPools []driverpools.Pool
	// Manifests are the rendered DaemonSets' and Deployments' documents by "KIND/NAME", for TemplateChanges.
	Manifests map[string][]byte
}

// RenderOptions say what to render: the chart, the values, and the release as Helm would install it.
type RenderOptions struct {
	ChartDir           string
	ValueFiles, Set    []string
	Release, Namespace string
	KubeVersion        string
	// ChartVersion, when set, stamps the chart's version and appVersion, as a release of the chart bumps both.
	ChartVersion string
}

// Render renders the chart once, as `helm install --dry-run` would (the schema checked), and reduces it.
func Render(ctx context.Context, o RenderOptions) (*Rendered, error) {
	chrt, err := loader.Load(o.ChartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", o.ChartDir, err)
	}
	if o.ChartVersion != "" {
		chrt.Metadata.Version, chrt.Metadata.AppVersion = o.ChartVersion, o.ChartVersion
	}
	vals, err := (&values.Options{ValueFiles: o.ValueFiles, Values: o.Set}).MergeValues(getter.Providers{})
	if err != nil {
		return nil, err
	}
	kv, err := chartutil.ParseKubeVersion(o.KubeVersion)
	if err != nil {
		return nil, err
	}
	merged, err := chartutil.CoalesceValues(chrt, vals)
	if err != nil {
		return nil, err
	}
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.ClientOnly, inst.DryRun, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace, inst.KubeVersion = o.Release, o.Namespace, kv
	rel, err := inst.RunWithContext(ctx, chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("render the chart: %w", schemahint.Explain(err, schemas(chrt)))
	}
	var b strings.Builder
	b.WriteString(rel.Manifest)
	for _, h := range rel.Hooks {
		b.WriteString("\n---\n")
		b.WriteString(h.Manifest)
	}
	r, err := Reduce(b.String())
	if err != nil {
		return nil, err
	}
	if sandbox, err := merged.Table("global.sandboxWorkloads"); err == nil {
		r.Sandbox, _ = sandbox["enabled"].(bool)
		r.DefaultRole, _ = sandbox["defaultWorkload"].(string)
	}
	if r.DefaultRole == "" {
		r.DefaultRole = "container"
	}
	return r, nil
}

// Reduce reads a rendered manifest stream: its operand DaemonSets (hooks/kube/placement) and the DRIVER_POOLS of the
// hooks that carry it (the gate and the pre-upgrade plan render the same pools).
func Reduce(stream string) (*Rendered, error) {
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		return nil, err
	}
	r := &Rendered{DaemonSets: dss, Evict: true, Manifests: renderedWorkloads(stream)}
	for _, doc := range strings.Split(stream, "\n---\n") {
		if !strings.Contains(doc, "DRIVER_POOLS") {
			continue
		}
		var obj struct {
			Spec struct {
				Template struct {
					Spec corev1.PodSpec `json:"spec"`
				} `json:"template"`
				corev1.PodSpec `json:",inline"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, err
		}
		for _, spec := range []corev1.PodSpec{obj.Spec.Template.Spec, obj.Spec.PodSpec} {
			raw, ok := envValue(spec, "DRIVER_POOLS")
			if !ok {
				continue
			}
			if r.Pools == nil {
				if r.Pools, err = driverpools.Parse(raw); err != nil {
					return nil, err
				}
				if r.Pools == nil {
					r.Pools = []driverpools.Pool{}
				}
			}
			for _, c := range spec.Containers {
				if slices.Contains(c.Args, "--evict=false") {
					r.Evict = false
				}
				if slices.Contains(c.Args, "--force=true") {
					r.Force = true
				}
			}
			if raw, ok := envValue(spec, "VGPU_MANAGER_POOLS"); ok && r.VGPUPools == nil {
				if r.VGPUPools, err = driverpools.Parse(raw); err != nil {
					return nil, err
				}
			}
		}
	}
	return r, nil
}

// schemas are the values schemas of the chart and its subcharts by chart name, as Helm names them in its errors.
func schemas(c *chart.Chart) map[string][]byte {
	out := map[string][]byte{c.Name(): c.Schema}
	for _, d := range c.Dependencies() {
		out[d.Name()] = d.Schema
	}
	return out
}

func envValue(spec corev1.PodSpec, name string) (string, bool) {
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value, true
			}
		}
	}
	return "", false
}
