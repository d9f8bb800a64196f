package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// gateTimeout is the validation gate's --timeout in a rendered stream.
func gateTimeout(t *testing.T, stream string) time.Duration {
	t.Helper()
	for _, h := range hookObjects(t, stream) {
		if h.kind() == "Job" && h.name() == gateName {
			d, err := time.ParseDuration(podOf(t, h).flag("--timeout"))
			if err != nil {
				t.Fatalf("gate --timeout: %v", err)
			}
			return d
		}
	}
	t.Fatal("no validation gate Job rendered")
	return 0
}

// TestFirstInstallOutlastsTheDriverBuild: on the first install every GPU node builds its driver at once, which the
// driver's startup probe allows initialDelay + period x failureThreshold (about 21 minutes), so the gate must wait
// at least that long there, and the documented install commands give Helm a --timeout above the gate's Job deadline
// (gate + 30 s), or a normal first install is marked failed. Upgrades keep the shorter timeoutSeconds.
func TestFirstInstallOutlastsTheDriverBuild(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("container-only")})
	p := containerNamed(t, daemonSet(t, stream, "nvidia-driver-daemonset-ubuntu2204"), "nvidia-driver-ctr").StartupProbe
	if p == nil {
		t.Fatal("the driver container has no startup probe")
	}
	build := time.Duration(p.InitialDelaySeconds+p.PeriodSeconds*p.FailureThreshold) * time.Second
	install := gateTimeout(t, stream)
	if install < build {
		t.Errorf("the gate waits %s after the first install; the driver's startup probe allows %s to build it", install, build)
	}

	vals, err := chartrender.Values([]string{profileFile("container-only")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	up, err := chartrender.RenderFor(umbrella(t), vals, newestKube, chartrender.Action{Upgrade: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := gateTimeout(t, up); got != 240*time.Second || got+30*time.Second >= helmTimeout*time.Second {
		t.Errorf("the gate waits %s after an upgrade, want hooks.validation.timeoutSeconds (240s), its Job gone before `helm upgrade`'s default %ds", got, helmTimeout)
	}

	docs, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	commands := 0
	for _, file := range append([]string{filepath.Join(chartrender.RepoRoot(), "README.md")}, docs...) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(file)
		for _, line := range strings.Split(string(text), "\n") {
			if !strings.HasPrefix(line, "helm install gpu ./charts/kube-gpu-stack") {
				continue
			}
			commands++
			f := strings.Fields(line)
			timeout := 5 * time.Minute // helm's default
			for i, w := range f {
				if w == "--timeout" && i+1 < len(f) {
					if timeout, err = time.ParseDuration(f[i+1]); err != nil {
						t.Fatalf("%s %q: %v", name, line, err)
					}
				}
			}
			if timeout <= install+30*time.Second {
				t.Errorf("%s %q: helm's timeout %s does not outlast the gate's Job (%s + 30s)", name, line, timeout, install)
			}
		}
	}
	if commands == 0 {
		t.Error("neither the README nor docs/ has a `helm install gpu ./charts/kube-gpu-stack` command")
	}
}

// TestNodeFeatureRuleIsNeverRecreated: deleting the nvidia-gpu-present rule makes NFD drop nvidia.com/gpu.present
// from every node, and the DaemonSet controller then deletes every operand pod. Wherever the cluster serves the
// NodeFeatureRule API (every upgrade, every Argo CD sync after the first, any install next to external NFD) the rule
// is an ordinary release object, which Helm and Argo CD update in place; a hook with before-hook-creation is deleted
// and created again on each run. Only a first install that brings the CRD itself renders it as a hook, carrying the
// release's ownership marks so that the next upgrade adopts it in place.
func TestNodeFeatureRuleIsNeverRecreated(t *testing.T) {
	t.Parallel()
	const api = "nfd.k8s-sigs.io/v1alpha1/NodeFeatureRule"
	rule := func(t *testing.T, a chartrender.Action) map[string]any {
		t.Helper()
		vals, err := chartrender.Values([]string{profileFile("container-only")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := chartrender.RenderFor(umbrella(t), vals, newestKube, a)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objects(t, stream) {
			if o.kind() == "NodeFeatureRule" && o.name() == "nvidia-gpu-present" {
				meta, _ := o.Raw["metadata"].(map[string]any)
				ann, _ := meta["annotations"].(map[string]any)
				return ann
			}
		}
		t.Fatal("no NodeFeatureRule nvidia-gpu-present rendered")
		return nil
	}
	for name, a := range map[string]chartrender.Action{
		"upgrade":                     {Upgrade: true, APIVersions: []string{"nfd.k8s-sigs.io/v1alpha1", api}},
		"install with the API served": {APIVersions: []string{"nfd.k8s-sigs.io/v1alpha1", api}},
	} {
		if ann := rule(t, a); ann["helm.sh/hook"] != nil || ann["helm.sh/hook-delete-policy"] != nil {
			t.Errorf("%s: the rule is a hook (%v): every run would delete and recreate it", name, ann)
		}
	}
	ann := rule(t, chartrender.Action{})
	if ann["helm.sh/hook"] != "post-install,post-upgrade" {
		t.Errorf("first install without the API: the rule is not a post-install hook (%v), but its CRD comes in the same release", ann)
	}
	if ann["meta.helm.sh/release-name"] != chartrender.ReleaseName || ann["meta.helm.sh/release-namespace"] != chartrender.Namespace {
		t.Errorf("the hook form lacks the release's ownership marks (%v): the next upgrade could not adopt it", ann)
	}
}
