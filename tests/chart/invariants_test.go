package chart

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// overlay adds a marker pull secret and toleration to the global values; every pod must carry both.
const overlay = `global:
  imagePullSecrets: [invariant-pull]
  tolerations:
    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
    - {key: invariant.example/taint, operator: Exists}
`

// everythingOn enables the operands and features that no profile turns on by default, so their images and pod
// specs are covered too.
var everythingOn = chartrender.EveryOptionalOperand

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// podSpecs returns every pod spec in an object (workload templates, Jobs, bare Pods) keyed by a readable path.
func podSpecs(o object) map[string]map[string]any {
	out := map[string]map[string]any{}
	spec, _ := o.Raw["spec"].(map[string]any)
	switch o.kind() {
	case "Pod":
		out[o.kind()+"/"+o.name()] = spec
	case "DaemonSet", "Deployment", "StatefulSet", "Job":
		tpl, _ := spec["template"].(map[string]any)
		ps, _ := tpl["spec"].(map[string]any)
		out[o.kind()+"/"+o.name()] = ps
	}
	return out
}

func containersOf(ps map[string]any) []map[string]any {
	var out []map[string]any
	for _, key := range []string{"initContainers", "containers"} {
		list, _ := ps[key].([]any)
		for _, c := range list {
			out = append(out, c.(map[string]any))
		}
	}
	return out
}

// TestEveryObjectIsLabelledAndSelectorsAreStable: every object carries the recommended labels; the chart label and
// version never reach a selector or a pod template (selectors are immutable, and a version in a pod template
// would roll every pod on a chart-only bump).
func TestEveryObjectIsLabelledAndSelectorsAreStable(t *testing.T) {
	t.Parallel()
	required := []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
		"app.kubernetes.io/part-of", "app.kubernetes.io/version", "helm.sh/chart"}
	volatile := []string{"helm.sh/chart", "app.kubernetes.io/version"}
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			meta, _ := o.Raw["metadata"].(map[string]any)
			labels, _ := meta["labels"].(map[string]any)
			for _, k := range required {
				if _, ok := labels[k]; !ok {
					t.Errorf("%s: %s %s lacks label %s", p.name, o.kind(), o.name(), k)
				}
			}
			spec, _ := o.Raw["spec"].(map[string]any)
			sel, _ := spec["selector"].(map[string]any)
			if ml, ok := sel["matchLabels"].(map[string]any); ok {
				sel = ml
			}
			tpl, _ := spec["template"].(map[string]any)
			tplMeta, _ := tpl["metadata"].(map[string]any)
			tplLabels, _ := tplMeta["labels"].(map[string]any)
			tplAnnotations, _ := tplMeta["annotations"].(map[string]any)
			for _, k := range volatile {
				for where, m := range map[string]map[string]any{"selector": sel, "pod template labels": tplLabels, "pod template annotations": tplAnnotations} {
					if _, ok := m[k]; ok {
						t.Errorf("%s: %s %s has %s in its %s", p.name, o.kind(), o.name(), k, where)
					}
				}
			}
		}
	}
}

// TestEveryPodGetsGlobalPullSecretsAndTolerations: global.imagePullSecrets and global.tolerations reach every pod
// the chart creates, whatever the profile.
func TestEveryPodGetsGlobalPullSecretsAndTolerations(t *testing.T) {
	t.Parallel()
	extra := writeTemp(t, "overlay.yaml", overlay)
	for _, p := range profiles(t) {
		pods := 0
		for _, o := range objects(t, render(t, newestKube, append(slices.Clone(p.files), extra), everythingOn...)) {
			for where, ps := range podSpecs(o) {
				pods++
				secrets, _ := ps["imagePullSecrets"].([]any)
				if !slices.ContainsFunc(secrets, func(s any) bool { return s.(map[string]any)["name"] == "invariant-pull" }) {
					t.Errorf("%s: %s lacks the global pull secret", p.name, where)
				}
				tols, _ := ps["tolerations"].([]any)
				if !slices.ContainsFunc(tols, func(s any) bool { return s.(map[string]any)["key"] == "invariant.example/taint" }) {
					t.Errorf("%s: %s lacks the global toleration", p.name, where)
				}
			}
		}
		if pods == 0 {
			t.Errorf("%s renders no pod", p.name)
		}
	}
}
