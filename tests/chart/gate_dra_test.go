package chart

import (
	"path/filepath"
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestGateReadsResourceSlicesOnlyWithDRA: with the DRA driver the post-install gate and `helm test` run `check
// --resource-slices` and may read ResourceSlices (to hold DRA nodes until theirs are published); without it they
// neither pass the flag nor get the right, so a cluster without resource.k8s.io/v1 is never asked for it.
func TestGateReadsResourceSlicesOnlyWithDRA(t *testing.T) {
	slicesRead := rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch"}}
	for _, tc := range []struct {
		profile string
		dra     bool
	}{{"dra.yaml", true}, {"dra-mixed.yaml", true}, {"container-only.yaml", false}} {
		t.Run(tc.profile, func(t *testing.T) {
			stream := render(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", tc.profile)})
			for _, name := range []string{gateName, testName} {
				role := decodeNamed[rbacv1.ClusterRole](t, stream, "ClusterRole", name+"-"+chartrender.Namespace)
				if got := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return equalJSON(r, slicesRead) }); got != tc.dra {
					t.Errorf("ClusterRole of %s reads resourceslices: %v, want %v: %s", name, got, tc.dra, mustJSON(role.Rules))
				}
			}
			gate := decodeNamed[batchv1.Job](t, stream, "Job", gateName).Spec.Template.Spec.Containers[0]
			test := decodeNamed[corev1.Pod](t, stream, "Pod", testName).Spec.Containers[0]
			for _, c := range []corev1.Container{gate, test} {
				if got := slices.Contains(c.Args, "--resource-slices"); got != tc.dra {
					t.Errorf("%s args %v: --resource-slices %v, want %v", c.Name, c.Args, got, tc.dra)
				}
			}
		})
	}
}
