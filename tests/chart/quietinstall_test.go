package chart

import (
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// symlinkNotice is what helm's chart loader logs for every symbolic link it follows in a chart directory.
const symlinkNotice = "found symbolic link"

// TestInstallFromACloneIsQuiet: a user who installs from a clone (`helm install NAME ./charts/kube-gpu-stack`) and
// Argo CD, which runs `helm template` on every sync, see whatever helm logs while it loads the chart. Helm logs one
// "found symbolic link in path" notice per link it follows, so the chart holds none: the operand charts and the
// library live inside it, and operands/<name> and charts/gpu-stack-lib are the links, pointing in. The chart is
// installed from the clone through the helm SDK (as `helm install` and Flux's helm-controller do) and rendered,
// linted and packaged through the helm CLI (`helm template` is what Argo CD runs), and none may print a notice. Not
// parallel: it reads the process-wide log, which the package's parallel tests would write to.
func TestInstallFromACloneIsQuiet(t *testing.T) {
	dir := chartrender.ChartDir()
	values := filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml")

	t.Run("the chart directory holds no symlink", func(t *testing.T) {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(path)
				rel, _ := filepath.Rel(chartrender.RepoRoot(), path)
				t.Errorf("%s is a symlink to %s: helm logs a notice for it on every render", rel, target)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("helm SDK install", func(t *testing.T) {
		var logged strings.Builder
		prev := log.Writer()
		log.SetOutput(&logged)
		defer log.SetOutput(prev)
		chrt, err := loader.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
			t.Fatal(err)
		}
		vals, err := chartrender.Values([]string{values}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := chartrender.Render(t.Context(), chrt, vals, newestKube)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "kind: DaemonSet") {
			t.Fatalf("the install rendered no DaemonSet; its log proves little:\n%.400s", out)
		}
		assertNoSymlinkNotice(t, "the helm SDK", logged.String())
	})

	helm := helmCLI(t)
	dest := t.TempDir()
	for _, args := range [][]string{
		{"template", chartrender.ReleaseName, dir, "--namespace", chartrender.Namespace, "--kube-version", newestKube, "-f", values},
		{"lint", "--strict", dir, "--namespace", chartrender.Namespace, "--kube-version", newestKube, "-f", values},
		{"package", dir, "--destination", dest},
	} {
		t.Run("helm "+args[0], func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), helm, args...)
			// helm's own config, cache and data from an empty home, not the user's
			home := t.TempDir()
			cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
				"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
			}
			if args[0] == "template" && !strings.Contains(string(out), "kind: DaemonSet") {
				t.Fatalf("helm %s rendered no DaemonSet; its log proves little:\n%.400s", args[0], out)
			}
			assertNoSymlinkNotice(t, "helm "+args[0], stderr.String()+string(out))
		})
	}
}

func assertNoSymlinkNotice(t *testing.T, who, logged string) {
	t.Helper()
	var notices []string
	for _, line := range strings.Split(logged, "\n") {
		if strings.Contains(line, symlinkNotice) {
			notices = append(notices, line)
		}
	}
	if len(notices) > 0 {
		t.Errorf("%s logged %d %q notices loading the chart from the clone, the first:\n%s", who, len(notices),
			symlinkNotice, notices[0])
	}
}
