package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// updateGolden rewrites golden files (and generated schemas) instead of comparing: UPDATE_GOLDEN=1 go test ./tests/...
var updateGolden = os.Getenv("UPDATE_GOLDEN") == "1"

// profile is one values file under values/: one cluster shape. minKube is the oldest Kubernetes minor it supports
// ("1.34"), from a "Needs Kubernetes >= 1.NN" line in its header comment; empty when it runs on every supported one.
type profile struct{ name, file, minKube string }

// needsKube is how a profile's header says which Kubernetes it needs (the DRA profiles: resource.k8s.io/v1).
var needsKube = regexp.MustCompile(`(?m)^#.*Needs Kubernetes >= (1\.[0-9]+)`)

// kubeVersions are the supported Kubernetes versions the profile renders for: chartrender.KubeVersions from its
// minKube on.
func (p profile) kubeVersions() []string {
	var out []string
	for _, kv := range chartrender.KubeVersions {
		if p.minKube == "" || version.MustParseGeneric(kv).AtLeast(version.MustParseGeneric(p.minKube)) {
			out = append(out, kv)
		}
	}
	return out
}

func profiles(t *testing.T) []profile {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "values", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values profiles found: %v", err)
	}
	var out []profile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		p := profile{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), file: f}
		if m := needsKube.FindSubmatch(b); m != nil {
			p.minKube = string(m[1])
		}
		out = append(out, p)
	}
	return out
}

// umbrella loads the umbrella chart afresh: a render drops disabled subcharts from the chart it is given, so a
// loaded chart serves one render only.
func umbrella(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the umbrella chart with values files and --set overrides for a Kubernetes version.
func render(t *testing.T, kubeVersion string, files []string, set ...string) string {
	t.Helper()
	out, err := renderErr(t, kubeVersion, files, set...)
	if err != nil {
		t.Fatalf("render %v %v: %v", files, set, err)
	}
	return out
}

func renderErr(t *testing.T, kubeVersion string, files []string, set ...string) (string, error) {
	t.Helper()
	vals, err := chartrender.Values(files, set)
	if err != nil {
		return "", err
	}
	return chartrender.Render(t.Context(), umbrella(t), vals, kubeVersion)
}

// newestKube is the Kubernetes version most tests render for.
var newestKube = chartrender.Newest

// object is one rendered manifest, decoded generically, with the template it came from.
type object struct {
	Source string
	Raw    map[string]any
}

func (o object) kind() string { s, _ := o.Raw["kind"].(string); return s }
func (o object) name() string {
	m, _ := o.Raw["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}

// objects splits a rendered stream into its objects.
func objects(t *testing.T, stream string) []object {
	t.Helper()
	var out []object
	for _, doc := range strings.Split(stream, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		source := ""
		for _, line := range strings.Split(doc, "\n") {
			if s, ok := strings.CutPrefix(line, "# Source: "); ok {
				source = s
				break
			}
		}
		var raw map[string]any
		if err := yaml.Unmarshal([]byte(doc), &raw); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(raw) == 0 {
			continue
		}
		out = append(out, object{Source: source, Raw: raw})
	}
	return out
}
