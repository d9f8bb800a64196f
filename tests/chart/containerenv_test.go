package chart

import (
	"path/filepath"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// envNamesOverlay names extra environment variables the way YAML 1.1 reads as booleans (Y, N, on, off, yes, no):
// they are names all the same, and every container must carry them as such.
const envNamesOverlay = `global:
  extraEnv: {"Y": "1", "N": "2", "on": "3", "off": "4", "yes": "5", "no": "6"}
`

// TestEnvNamesThatReadAsBooleansStayNames: the chart builds env lists as YAML text; a name such as Y must not come
// out as `name: true` (which the API server refuses) or fail the render.
func TestEnvNamesThatReadAsBooleansStayNames(t *testing.T) {
	t.Parallel()
	want := map[string]string{"Y": "1", "N": "2", "on": "3", "off": "4", "yes": "5", "no": "6"}
	out, err := renderErr(t, newestKube, []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml"), writeTemp(t, "env.yaml", envNamesOverlay)})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	seen := 0
	for _, o := range objects(t, out) {
		if o.kind() != "DaemonSet" {
			continue
		}
		for path, ps := range podSpecs(o) {
			for _, c := range containersOf(ps) {
				got := map[string]any{}
				env, _ := c["env"].([]any)
				for _, e := range env {
					e, _ := e.(map[string]any)
					name, ok := e["name"].(string)
					if !ok {
						t.Errorf("%s container %v: env name %v (%T) is not a string", path, c["name"], e["name"], e["name"])
						continue
					}
					got[name] = e["value"]
				}
				for name, value := range want {
					if got[name] != value {
						t.Errorf("%s container %v: env %s = %v, want %q", path, c["name"], name, got[name], value)
					}
				}
				seen++
			}
		}
	}
	if seen == 0 {
		t.Fatal("no DaemonSet containers rendered")
	}
}
