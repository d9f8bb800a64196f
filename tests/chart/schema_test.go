package chart

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/gpumigrate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/valuesschema"
)

// chartDirs are the charts that carry a values schema: the umbrella and every operand.
func chartDirs(t *testing.T) []string {
	t.Helper()
	operands, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "operands", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{chartrender.ChartDir()}, operands...)
}

// TestValuesSchemaUpToDate regenerates every chart's values.schema.json from its values.yaml and fails when the
// committed schema differs, or when a values key has no comment saying what it does.
func TestValuesSchemaUpToDate(t *testing.T) {
	common := filepath.Join(chartrender.RepoRoot(), "charts", "gpu-stack-lib", "operand-values.yaml")
	aliases := subchartKeys(t)
	for _, dir := range chartDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			c := common
			if dir == chartrender.ChartDir() {
				c = ""
			}
			got, err := valuesschema.Generate(dir, c, gpumigrate.SchemaHints(aliases[filepath.Base(dir)]))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "values.schema.json")
			if updateGolden {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run UPDATE_GOLDEN=1 go test ./tests/ to generate it)", err)
			}
			if string(want) != string(got) {
				t.Errorf("%s is stale: regenerate it with UPDATE_GOLDEN=1 go test ./tests/\n%s", path, lineDiff(string(want), string(got)))
			}
		})
	}
}

// subchartKeys maps each operand chart's directory name to its key in the umbrella's values (its alias); the
// umbrella itself is "".
func subchartKeys(t *testing.T) map[string]string {
	t.Helper()
	md, err := chartutil.LoadChartfile(filepath.Join(chartrender.ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, d := range md.Dependencies {
		keys[d.Name] = d.Name
		if d.Alias != "" {
			keys[d.Name] = d.Alias
		}
	}
	return keys
}

// TestBadValuesFailNamingTheKey renders each file in testdata/bad-values; each must fail, and the error must
// contain the text on the file's first line (`# want: ...`), which names the offending key.
func TestBadValuesFailNamingTheKey(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "bad-values", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad values files: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			want := wantLine(t, f)
			_, err := renderErr(t, newestKube, []string{f})
			if err == nil {
				t.Fatalf("rendering %s succeeded; want an error containing %q", f, want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error does not name the problem %q:\n%v", want, err)
			}
		})
	}
}

func wantLine(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan()
	want, ok := strings.CutPrefix(s.Text(), "# want: ")
	if !ok || want == "" {
		t.Fatalf("%s: first line must be `# want: <text the error must contain>`", path)
	}
	return want
}
