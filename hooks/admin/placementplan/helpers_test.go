package placementplan

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// repoRoot is the repository root, from the package's folder, where `go test` runs its tests.
func repoRoot() string { return filepath.Join("..", "..", "..") }

var (
	renderMu    sync.Mutex
	renderCache = map[string]*Rendered{}
)

// renderProfile renders the chart with values/<profile>.yaml (and set), once per test binary.
// profileFiles are the values files a render of the named profile takes (its site example too, if it needs one).
func profileFiles(tb testing.TB, name string) []string {
	tb.Helper()
	profiles, err := chartrender.Profiles(repoRoot())
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range profiles {
		if p.Name == name {
			return p.Files()
		}
	}
	tb.Fatalf("no profile %s", name)
	return nil
}

func renderProfile(tb testing.TB, profile string, set ...string) *Rendered {
	tb.Helper()
	key := profile + "|" + filepath.Join(set...)
	renderMu.Lock()
	defer renderMu.Unlock()
	if r := renderCache[key]; r != nil {
		return r
	}
	r, err := Render(context.Background(), RenderOptions{
		ChartDir:   filepath.Join(repoRoot(), "charts", "kube-gpu-stack"),
		ValueFiles: profileFiles(tb, profile),
		Set:        set, Release: "gpu", Namespace: "gpu-operator", KubeVersion: "v1.37.0",
	})
	if err != nil {
		tb.Fatal(err)
	}
	renderCache[key] = r
	return r
}

func fixtureNodes(fs []nodefixtures.Node) []*corev1.Node {
	out := make([]*corev1.Node, len(fs))
	for i, f := range fs {
		out[i] = f.Object()
	}
	return out
}

func nodesOnly(nodes []*corev1.Node) *Cluster {
	return &Cluster{Nodes: nodes, GPU: gpupods.NewOffline(nil)}
}
