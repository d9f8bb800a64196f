package driverpools

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzParse: DRIVER_POOLS comes from the rendered chart; whatever it holds, Parse and the questions the hooks ask
// of its pools never panic, and a pool Parse accepts has a name and a usable maxUnavailable.
func FuzzParse(f *testing.F) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{
		"nvidia.com/gpu.present": "true", "nvidia.com/driver.pool": "r570", "feature.node.kubernetes.io/system-os_release.ID": "ubuntu"}}}
	f.Fuzz(func(t *testing.T, raw string) {
		pools, err := Parse(raw)
		if err != nil {
			return
		}
		_, _ = Matching(pools, node)
		for _, p := range pools {
			if p.Name == "" {
				t.Fatalf("pool without a name accepted: %+v", p)
			}
			for _, total := range []int{0, 1, 7, 1000} {
				if n, err := p.MaxUnavailableNodes(total); err != nil || n < 1 {
					t.Fatalf("pool %s: maxUnavailable %v of %d nodes = %d, %v", p.Name, p.MaxUnavailable, total, n, err)
				}
			}
			_, _ = p.DaemonSetFor(node)
		}
		_ = Names(pools)
	})
}
