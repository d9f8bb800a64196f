package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestGolden renders every values profile for the oldest and newest supported Kubernetes and compares the bytes
// with tests/chart/testdata/golden/<profile>.<kube minor>.golden.yaml. A change to the chart's output shows up as a golden diff
// to review; UPDATE_GOLDEN=1 rewrites the files.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, p := range profiles(t) {
		for _, kv := range p.kubeVersions() {
			t.Run(p.name+"/"+kv, func(t *testing.T) {
				got := render(t, kv, p.files)
				minor := kv[:strings.LastIndex(kv, ".")]
				path := filepath.Join("testdata", "golden", p.name+"."+minor+".golden.yaml")
				if updateGolden {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
				}
				if string(want) != got {
					t.Errorf("%s differs from the rendered chart:\n%s\nreview the change, then UPDATE_GOLDEN=1", path, lineDiff(string(want), got))
				}
			})
		}
	}
}

// lineDiff shows the first differing lines of two texts with a little context.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			from := max(0, i-3)
			var sb strings.Builder
			for j := from; j < i; j++ {
				sb.WriteString("  " + al[j] + "\n")
			}
			for j := i; j < min(i+5, len(al)); j++ {
				sb.WriteString("- " + al[j] + "\n")
			}
			for j := i; j < min(i+5, len(bl)); j++ {
				sb.WriteString("+ " + bl[j] + "\n")
			}
			return sb.String()
		}
	}
	return ""
}

// TestPackagedChartCarriesEveryOperand packages the chart as `helm package` does and checks that the archive holds
// every operand and renders byte-identically to the directory.
func TestPackagedChartCarriesEveryOperand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pkg := action.NewPackage()
	pkg.Destination = dir
	path, err := pkg.Run(chartrender.ChartDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	packaged, err := chartrender.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	operands, _ := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "operands", "*"))
	var got []string
	for _, d := range packaged.Dependencies() {
		if d.Name() != "gpu-stack-lib" && len(d.Templates) == 0 {
			t.Errorf("packaged operand %s has no templates", d.Name())
		}
		got = append(got, d.Name())
	}
	for _, o := range operands {
		if !slices.Contains(got, filepath.Base(o)) {
			t.Errorf("packaged chart lacks operand %s (has %v)", filepath.Base(o), got)
		}
	}
	for _, p := range profiles(t) {
		vals, err := chartrender.Values(p.files, nil)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := chartrender.Load(path) // a render consumes the chart it is given
		if err != nil {
			t.Fatal(err)
		}
		fromPkg, err := chartrender.Render(t.Context(), fresh, vals, newestKube)
		if err != nil {
			t.Fatal(err)
		}
		if fromDir := render(t, newestKube, p.files); fromDir != fromPkg {
			t.Errorf("%s: the packaged chart renders differently from the directory:\n%s", p.name, lineDiff(fromDir, fromPkg))
		}
	}
}
