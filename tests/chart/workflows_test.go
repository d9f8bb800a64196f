package chart

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// actionlint builds the pinned actionlint of ci/actionlint (its own module, so the project's go.mod stays clean)
// once per version into the user cache, and returns the binary.
func actionlint(t *testing.T) string {
	t.Helper()
	module := filepath.Join(chartrender.RepoRoot(), "ci", "actionlint")
	sum, err := os.ReadFile(filepath.Join(module, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(sum)
	bin := filepath.Join(cache, "kube-gpu-stack", "actionlint-"+hex.EncodeToString(h[:6]), "actionlint")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-o", bin, "github.com/rhysd/actionlint/cmd/actionlint")
	cmd.Dir = module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build actionlint: %v\n%s", err, out)
	}
	return bin
}

// TestWorkflowsPassActionlint: every workflow under .github/workflows passes actionlint (syntax, expressions,
// job and step references, known actions' inputs); a workflow with known mistakes fails it, so the check cannot
// pass vacuously. Shell scripts in run: steps are not checked (no shellcheck here).
func TestWorkflowsPassActionlint(t *testing.T) {
	t.Parallel()
	bin := actionlint(t)
	workflows, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), ".github", "workflows", "*.yml"))
	if err != nil || len(workflows) == 0 {
		t.Fatalf("no workflow found: %v", err)
	}
	run := func(files ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"-no-color", "-shellcheck=", "-pyflakes="}, files...)...)
		cmd.Dir = chartrender.RepoRoot()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(workflows...); err != nil {
		t.Errorf("actionlint: %v\n%s", err, out)
	}
	out, err := run(filepath.Join("tests", "chart", "testdata", "workflows", "broken.yml"))
	for _, want := range []string{"pushh", "runs-on", "steps.nothing"} {
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("actionlint passed or missed %q in the broken workflow: %v\n%s", want, err, out)
		}
	}
}
