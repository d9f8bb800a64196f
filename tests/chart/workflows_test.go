package chart

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

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

// TestReleaseWorkflowHoldsItsRights: the release workflow grants nothing at the top; each job names its rights, and
// the job that runs `make test` (which runs the code under test, and every module it downloads) may only read the
// repository and sees no secret; signing (an OIDC token) happens only in a job that neither tests nor builds; every
// action is pinned by a 40-hex commit with its version in a comment; every checkout leaves no token in .git/config;
// the Go toolchain is an exact version, not a range or go.mod's minimum; and the release publishes a Sigstore
// bundle for each file it signs and the SBOMs. GitHub Actions does not run here: this and actionlint are what
// checks the workflow before a tag.
func TestReleaseWorkflowHoldsItsRights(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		Uses string            `json:"uses"`
		Run  string            `json:"run"`
		With map[string]any    `json:"with"`
		Env  map[string]string `json:"env"`
	}
	type job struct {
		Permissions any               `json:"permissions"`
		Env         map[string]string `json:"env"`
		Steps       []step            `json:"steps"`
	}
	var wf struct {
		Permissions any               `json:"permissions"`
		Env         map[string]string `json:"env"`
		Jobs        map[string]job    `json:"jobs"`
	}
	if err := yaml.Unmarshal(raw, &wf); err != nil {
		t.Fatal(err)
	}
	if p, ok := wf.Permissions.(map[string]any); !ok || len(p) != 0 {
		t.Errorf("top-level permissions %v, want {} (each job names its own)", wf.Permissions)
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(wf.Env["GO_VERSION"]) {
		t.Errorf("GO_VERSION %q, want an exact toolchain version", wf.Env["GO_VERSION"])
	}
	pinned := regexp.MustCompile(`^[\w.-]+/[\w./-]+@[0-9a-f]{40}$`)
	comment := regexp.MustCompile(`(?m)uses: (\S+) # v\d+\.\d+\.\d+$`)
	commented := map[string]bool{}
	for _, m := range comment.FindAllStringSubmatch(string(raw), -1) {
		commented[m[1]] = true
	}
	signers := 0
	for name, j := range wf.Jobs {
		perms, ok := j.Permissions.(map[string]any)
		if !ok || len(perms) == 0 {
			t.Errorf("job %s names no permissions", name)
		}
		tests, signs, builds := false, false, false
		for _, s := range j.Steps {
			body := s.Run + fmt.Sprint(s.Env, s.With)
			tests = tests || strings.Contains(s.Run, "make test")
			builds = builds || strings.Contains(s.Run, "make image") || strings.Contains(s.Run, "make cli")
			signs = signs || strings.Contains(s.Run, "cosign sign") || strings.HasPrefix(s.Uses, "actions/attest-build-provenance@")
			if tests && strings.Contains(body, "secrets.") {
				t.Errorf("job %s runs make test and reads a secret", name)
			}
			if s.Uses == "" {
				continue
			}
			if !pinned.MatchString(s.Uses) || !commented[s.Uses] {
				t.Errorf("job %s: %s is not pinned by commit with its version in a comment", name, s.Uses)
			}
			switch {
			case strings.HasPrefix(s.Uses, "actions/checkout@"):
				if s.With["persist-credentials"] != false {
					t.Errorf("job %s: checkout keeps its token in .git/config (persist-credentials: %v)", name, s.With["persist-credentials"])
				}
			case strings.HasPrefix(s.Uses, "actions/setup-go@"):
				if s.With["go-version"] != "${{ env.GO_VERSION }}" || s.With["go-version-file"] != nil {
					t.Errorf("job %s: setup-go %v, want go-version: ${{ env.GO_VERSION }}", name, s.With)
				}
			}
		}
		if tests && (len(perms) != 1 || perms["contents"] != "read") {
			t.Errorf("job %s runs make test with permissions %v, want contents: read alone", name, perms)
		}
		if perms["id-token"] == "write" {
			signers++
			if tests || builds {
				t.Errorf("job %s may sign (id-token: write) and also tests or builds", name)
			}
		}
		if signs && perms["id-token"] != "write" {
			t.Errorf("job %s signs or attests without id-token: write", name)
		}
	}
	if signers != 1 {
		t.Errorf("%d jobs may sign, want one", signers)
	}
	for _, want := range []string{"*.sigstore.json", "spdx.json", "cosign sign-blob --yes --bundle", "cosign attest --yes --type spdxjson"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the release workflow has no %q", want)
		}
	}
}
