package placementplan

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// largeCluster is n nodes: the role-matrix fixtures (every role, opt-out, pool, DRA node and a node without a GPU)
// repeated under numbered names.
func largeCluster(n int) []*corev1.Node {
	base := nodefixtures.RoleMatrix()
	out := make([]*corev1.Node, 0, n)
	for i := 0; len(out) < n; i++ {
		f := base[i%len(base)]
		f.Name = fmt.Sprintf("%s-%04d", f.Name, i)
		out = append(out, f.Object())
	}
	return out
}

func profileNames(tb testing.TB) []string {
	profiles, err := chartrender.Profiles(repoRoot())
	if err != nil {
		tb.Fatalf("no profiles: %v", err)
	}
	var out []string
	for _, p := range profiles {
		out = append(out, p.Name)
	}
	return out
}

// BenchmarkPlan is one `plan` of 1,000 nodes per profile: the chart rendered once, every node evaluated.
func BenchmarkPlan(b *testing.B) {
	nodes := largeCluster(1000)
	for _, profile := range profileNames(b) {
		b.Run(profile, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r, err := Render(context.Background(), RenderOptions{
					ChartDir:   filepath.Join(repoRoot(), "charts", "kube-gpu-stack"),
					ValueFiles: profileFiles(b, profile),
					Release:    "gpu", Namespace: "gpu-operator", KubeVersion: "v1.37.0",
				})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Evaluate(context.Background(), r, nodesOnly(nodes), "gpu", "gpu-operator"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEvaluate is the node evaluation alone (O(nodes x DaemonSets)), the render done before.
func BenchmarkEvaluate(b *testing.B) {
	nodes := largeCluster(1000)
	for _, profile := range profileNames(b) {
		r := renderProfile(b, profile)
		b.Run(profile, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Evaluate(context.Background(), r, nodesOnly(nodes), "gpu", "gpu-operator"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
