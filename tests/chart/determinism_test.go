package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestRenderIsDeterministicAcrossEngines renders profiles through every path the chart takes to a cluster — the
// helm SDK's install (`helm install`, Flux) and the `helm template` CLI (Argo CD), each from the chart directory
// and from the packaged .tgz — and twice through each from the directory. Argo CD and Flux compare what they
// render with what runs, so every render must be the same bytes. The chart keeps its own version here (no
// pinning), as the CLI sees it.
func TestRenderIsDeterministicAcrossEngines(t *testing.T) {
	t.Parallel()
	helm := helmCLI(t)
	pkg := action.NewPackage()
	pkg.Destination = t.TempDir()
	tgz, err := pkg.Run(chartrender.ChartDir(), nil)
	if err != nil {
		t.Fatalf("package the chart: %v", err)
	}
	for _, name := range []string{"container-only", "mixed", "vm-vgpu", "driver-pools"} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(chartrender.RepoRoot(), "values", name+".yaml")
			renders := []struct{ engine, out string }{
				{"the helm SDK install from the chart directory", sdkRender(t, chartrender.ChartDir(), file)},
				{"the same, again", sdkRender(t, chartrender.ChartDir(), file)},
				{"the helm SDK install from the packaged .tgz", sdkRender(t, tgz, file)},
				{"helm template from the chart directory", cliRender(t, helm, chartrender.ChartDir(), file)},
				{"helm template from the chart directory, again", cliRender(t, helm, chartrender.ChartDir(), file)},
				{"helm template from the packaged .tgz", cliRender(t, helm, tgz, file)},
			}
			if !strings.Contains(renders[0].out, "kind: DaemonSet") || !strings.Contains(renders[0].out, "helm.sh/hook") {
				t.Fatalf("the render lacks DaemonSets or hooks; comparing it would prove little:\n%.400s", renders[0].out)
			}
			for _, r := range renders[1:] {
				if r.out != renders[0].out {
					t.Errorf("%s renders differently from %s:\n%s", r.engine, renders[0].engine, lineDiff(renders[0].out, r.out))
				}
			}
		})
	}
}

// sdkRender renders the chart (directory or archive) as chartrender does, with the chart's own versions.
func sdkRender(t *testing.T, path, valuesFile string) string {
	t.Helper()
	chrt, err := loader.Load(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
		t.Fatal(err)
	}
	vals, err := chartrender.Values([]string{valuesFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := chartrender.Render(t.Context(), chrt, vals, newestKube)
	if err != nil {
		t.Fatalf("render %s with %s: %v", path, valuesFile, err)
	}
	return out
}

// cliRender runs `helm template` as Argo CD does: no cluster, the capabilities from flags, CRDs included.
func cliRender(t *testing.T, helm, path, valuesFile string) string {
	t.Helper()
	args := []string{"template", chartrender.ReleaseName, path,
		"--namespace", chartrender.Namespace, "--kube-version", newestKube, "--include-crds", "-f", valuesFile}
	for _, v := range chartrender.APIVersions {
		args = append(args, "--api-versions", v)
	}
	cmd := exec.CommandContext(t.Context(), helm, args...)
	// helm's own config, cache and data (repositories, registry logins) from an empty home, not the user's
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// helmCLI is the pinned helm of this module (`go tool helm`), built once and run directly.
func helmCLI(t *testing.T) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-n", "helm")
	cmd.Dir = chartrender.RepoRoot()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool -n helm: %v\n%s", err, stderr.String())
	}
	path := strings.TrimSpace(string(out))
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("go tool -n helm printed %q: %v", path, err)
	}
	return path
}

// TestRenderIsDeterministic renders each profile twice: Argo CD compares renders, so they must be byte-equal.
func TestRenderIsDeterministic(t *testing.T) {
	t.Parallel()
	for _, p := range profiles(t) {
		a := render(t, newestKube, p.files)
		b, err := renderFresh(t, newestKube, p.files)
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Errorf("%s renders differently twice:\n%s", p.name, lineDiff(a, b))
		}
	}
}

// TestTemplatesAvoidNondeterminism: no template calls lookup or a random/time function (Argo CD re-renders and
// compares; `helm template` has no cluster for lookup).
func TestTemplatesAvoidNondeterminism(t *testing.T) {
	t.Parallel()
	banned := regexp.MustCompile(`\b(lookup|now|date|dateInZone|dateModify|unixEpoch|randAlphaNum|randAlpha|randNumeric|randAscii|randInt|randBytes|uuidv4|genCA|genCAWithKey|genPrivateKey|genSelfSignedCert|genSelfSignedCertWithKey|genSignedCert|genSignedCertWithKey|derivePassword|htpasswd)\b`)
	action := regexp.MustCompile(`{{[^}]*}}`)
	root := chartrender.RepoRoot()
	var files []string
	for _, pattern := range []string{"charts/*/templates/*", "operands/*/templates/*", "operands/*/templates/*/*", "charts/*/templates/*/*"} {
		m, _ := filepath.Glob(filepath.Join(root, pattern))
		files = append(files, m...)
	}
	if len(files) < 20 {
		t.Fatalf("found only %d template files", len(files))
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // a directory
		}
		for _, a := range action.FindAllString(string(data), -1) {
			if strings.HasPrefix(a, "{{/*") || strings.HasPrefix(a, "{{- /*") {
				continue
			}
			if m := banned.FindString(a); m != "" {
				t.Errorf("%s uses %s: %s", f, m, a)
			}
		}
	}
}
