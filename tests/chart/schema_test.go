package chart

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/valuesschema"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestValuesSchemaUpToDate regenerates every chart's values.schema.json from its values.yaml (as make generate
// does) and fails when the committed schema differs, or when a values key has no comment saying what it does.
func TestValuesSchemaUpToDate(t *testing.T) {
	t.Parallel()
	files, err := valuesschema.All(chartrender.RepoRoot())
	if err != nil {
		t.Fatalf("%v (document the key in values.yaml, then run make generate)", err)
	}
	for _, f := range files {
		name, _ := filepath.Rel(chartrender.RepoRoot(), f.Path)
		t.Run(filepath.Base(filepath.Dir(f.Path)), func(t *testing.T) {
			want, err := os.ReadFile(f.Path)
			if err != nil {
				t.Fatalf("%v (run make generate)", err)
			}
			if string(want) != string(f.Content) {
				t.Errorf("%s is stale: run make generate\n%s", name, lineDiff(string(want), string(f.Content)))
			}
		})
	}
}

// TestBadValuesFailNamingTheKey renders each file in testdata/bad-values; each must fail, and the error must
// contain the text on the file's first line (`# want: ...`), which names the offending key.
func TestBadValuesFailNamingTheKey(t *testing.T) {
	t.Parallel()
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

// TestTypoUnderEveryDisabledOperandFails: for every operand subchart of the chart (each dependency with an enabled
// condition), a misspelt key under it fails the render naming the key, with the operand switched off as with it on
// (Helm checks a disabled subchart's own schema not at all; the umbrella's schema holds every operand's).
func TestTypoUnderEveryDisabledOperandFails(t *testing.T) {
	t.Parallel()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	operands := 0
	for _, dep := range chrt.Metadata.Dependencies {
		key := dep.Alias
		if key == "" {
			key = dep.Name
		}
		if dep.Condition != key+".enabled" {
			continue // the library chart: no switch, no values of its own
		}
		operands++
		for _, enabled := range []string{"false", "true"} {
			_, err := renderErr(t, newestKube, nil, key+".enabled="+enabled, key+".imagee.tag=x")
			if err == nil || !strings.Contains(err.Error(), "imagee") {
				t.Errorf("%s.imagee.tag=x with %s.enabled=%s: %v; want the render refused naming imagee", key, key, enabled, err)
			}
		}
	}
	if operands < 15 {
		t.Fatalf("%d operand subcharts found; the chart's dependencies were not read", operands)
	}
}
