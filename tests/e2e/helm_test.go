package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// releaseNamespace is where every test installs the release.
const releaseNamespace = "gpu-operator"

// target is the release every test installs on its control plane: one at a time, since the chart's cluster-scoped
// objects (RuntimeClasses, CRDs, ClusterRoles) belong to one release per cluster.
func (e *env) target() install.Target {
	return install.Target{Kubeconfig: e.kube.Kubeconfig, Release: "gpu", Namespace: releaseNamespace, Timeout: 2 * time.Minute}
}

func (e *env) installProfile(t *testing.T, profile string, set ...string) *release.Release {
	t.Helper()
	rel, err := e.target().Install(t.Context(), profileFiles(t, profile), set...)
	if err != nil {
		for _, r := range e.stand.Runs() { // the hooks' own output says why
			t.Logf("%s hook %s (exit %d):\n%s", r.Component, r.Pod, r.ExitCode, r.Output)
		}
		t.Fatal(err)
	}
	return rel
}

// profileFiles are the values files an install of the profile file takes: the profile, then the site example it
// cannot render without (chartrender.Profile.Files: the openshift profile's RHCOS builds).
func profileFiles(t *testing.T, file string) []string {
	t.Helper()
	profiles, err := chartrender.Profiles(chartrender.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range profiles {
		if p.File == file {
			return p.Files()
		}
	}
	return []string{file}
}

func (e *env) uninstall(t *testing.T) {
	t.Helper()
	if err := e.target().Uninstall(); err != nil {
		t.Error(err)
	}
}

func (e *env) expectedPlacement(t *testing.T, rel *release.Release) placement.Placement {
	t.Helper()
	p, err := install.Expected(t.Context(), e.kube.Client, rel)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitForPlacement waits until the running operand pods are exactly `want` on every node of e.
func (e *env) waitForPlacement(t *testing.T, want placement.Placement) {
	t.Helper()
	var names []string
	for _, n := range e.nodes {
		names = append(names, n.Name)
	}
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := e.target().Running(ctx, e.kube.Client, names)
		if err != nil {
			return false, err
		}
		last = diffPlacement(names, got, want)
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("operand pods never matched the expected placement:\n%s", last)
	}
}

func diffPlacement(nodes []string, got, want placement.Placement) string {
	var b strings.Builder
	for _, n := range nodes {
		g, w := got.Operands(n), want.Operands(n)
		if !slices.Equal(g, w) {
			fmt.Fprintf(&b, "node %s:\n  running  %v\n  expected %v\n", n, g, w)
		}
	}
	return b.String()
}
