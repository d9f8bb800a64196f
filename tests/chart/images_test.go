package chart

import (
	"fmt"
	"io"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/imagelist"
)

// TestImages renders every profile for every supported Kubernetes version, alone and with the optional operands
// no profile enables (everythingOn), hooks and helm test Pods included, and checks that
// charts/kube-gpu-stack/images.txt lists exactly the images they run, and that Chart.yaml's artifacthub.io/images
// annotation names the same ones. Licensed images only their owner can pull (imagelist.UserSupplied) are left out.
// A profile that points global.imageRegistry at a mirror contributes the upstream images it mirrors (rendered
// with the mirror unset), and its mirrored render must be exactly those images moved to the mirror.
// UPDATE_GOLDEN=1 rewrites images.txt and the annotation.
func TestImages(t *testing.T) {
	log.SetOutput(io.Discard) // the chart loader logs one notice per operand symlink
	var mu sync.Mutex
	rendered := map[string][]string{} // image -> the renders that run it
	userSupplied := map[string]bool{}
	hooks, tests, renders := false, false, 0
	// One parallel subtest per render: the renders are independent and take most of the time.
	t.Run("render", func(t *testing.T) {
		for _, p := range profiles(t) {
			for _, kv := range p.kubeVersions() {
				for _, set := range [][]string{nil, everythingOn} {
					where := p.name + "/" + kv + "/alone"
					if set != nil {
						where = p.name + "/" + kv + "/every-optional-operand"
					}
					t.Run(where, func(t *testing.T) {
						t.Parallel()
						vals, err := chartrender.Values([]string{p.file}, set)
						if err != nil {
							t.Fatal(err)
						}
						global, _ := vals["global"].(map[string]any)
						mirror, _ := global["imageRegistry"].(string)
						var upstream []string
						var stream string
						n := 1
						if mirror == "" {
							stream = renderReleased(t, vals, kv, where)
							upstream = renderedImages(t, stream, where)
						} else {
							mirrored := renderedImages(t, renderReleased(t, vals, kv, where), where)
							global["imageRegistry"] = ""
							stream = renderReleased(t, vals, kv, where+" without its mirror")
							upstream = renderedImages(t, stream, where+" without its mirror")
							checkMirrored(t, where, mirror, upstream, mirrored)
							n++
						}
						mu.Lock()
						defer mu.Unlock()
						renders += n
						hooks = hooks || strings.Contains(stream, "helm.sh/hook: pre-upgrade")
						tests = tests || strings.Contains(stream, "helm.sh/hook: test")
						for _, img := range upstream {
							if imagelist.UserSupplied(img) {
								userSupplied[img] = true
								continue
							}
							rendered[img] = append(rendered[img], where)
						}
					})
				}
			}
		}
	})
	if t.Failed() {
		t.FailNow() // a failed render leaves the image set incomplete: comparing or rewriting it would mislead
	}
	if !hooks || !tests {
		t.Fatalf("no render held a pre-upgrade hook (%v) or a helm test Pod (%v): the renderer drops hooks, so the image list would miss their images", hooks, tests)
	}
	for _, prefix := range imagelist.UserSuppliedPrefixes {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(userSupplied)), func(img string) bool { return strings.HasPrefix(img, prefix) }) {
			t.Errorf("imagelist.UserSuppliedPrefixes has %s, which no profile renders: drop it", prefix)
		}
	}
	images := slices.Sorted(maps.Keys(rendered))
	t.Logf("%d images (and %d user-supplied, not listed: %v) from %d renders: %d profiles x %d Kubernetes versions, alone and with every optional operand",
		len(images), len(userSupplied), slices.Sorted(maps.Keys(userSupplied)), renders, len(profiles(t)), len(chartrender.KubeVersions))

	listPath := filepath.Join(chartrender.ChartDir(), imagelist.FileName)
	chartPath := filepath.Join(chartrender.ChartDir(), "Chart.yaml")
	// Failure messages name them from the repository root.
	listName, _ := filepath.Rel(chartrender.RepoRoot(), listPath)
	chartName, _ := filepath.Rel(chartrender.RepoRoot(), chartPath)
	if updateGolden {
		if err := os.WriteFile(listPath, imagelist.Format(images), 0o644); err != nil {
			t.Fatal(err)
		}
		chartYAML, err := os.ReadFile(chartPath)
		if err != nil {
			t.Fatal(err)
		}
		updated, err := imagelist.SetChartAnnotation(chartYAML, imagelist.ImagesAnnotation, imagelist.FormatArtifactHubImages(images))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(chartPath, updated, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}

	t.Run("images.txt", func(t *testing.T) {
		listed, err := imagelist.ParseFile(listPath)
		if err != nil {
			t.Fatalf("%v (run make golden to create it)", err)
		}
		for _, img := range images {
			if !slices.Contains(listed, img) {
				t.Errorf("%s is rendered (by %s) but missing from %s", img, summarize(rendered[img]), listName)
			}
		}
		for _, img := range listed {
			if _, ok := rendered[img]; !ok {
				t.Errorf("%s lists %s, which no profile renders", listName, img)
			}
		}
		content, _ := os.ReadFile(listPath)
		if !t.Failed() && string(content) != string(imagelist.Format(images)) {
			t.Errorf("%s names the rendered images but is not in its generated form (header, order, duplicates)", listName)
		}
		if t.Failed() {
			t.Log("review the chart change, then run make golden")
		}
	})

	t.Run("artifacthub.io/images", func(t *testing.T) {
		chartYAML, err := os.ReadFile(chartPath)
		if err != nil {
			t.Fatal(err)
		}
		annotations, err := imagelist.ChartAnnotations(chartYAML)
		if err != nil {
			t.Fatal(err)
		}
		value, ok := annotations[imagelist.ImagesAnnotation]
		if !ok {
			t.Fatalf("%s has no %s annotation (run make golden)", chartName, imagelist.ImagesAnnotation)
		}
		entries, err := imagelist.ParseArtifactHubImages(value)
		if err != nil {
			t.Fatalf("%s: %v", chartName, err)
		}
		// Compared with images.txt, the list the annotation must equal; the subtest above ties that to the render.
		listed, err := imagelist.ParseFile(listPath)
		if err != nil {
			t.Fatal(err)
		}
		var annotated []string
		for _, e := range entries {
			annotated = append(annotated, e.Image)
			if !slices.Contains(listed, e.Image) {
				t.Errorf("%s's %s names %s (as %q), which %s does not list", chartName, imagelist.ImagesAnnotation, e.Image, e.Name, imagelist.FileName)
			}
		}
		for _, img := range listed {
			if !slices.Contains(annotated, img) {
				t.Errorf("%s lists %s, which %s's %s lacks", imagelist.FileName, img, chartName, imagelist.ImagesAnnotation)
			}
		}
		if !t.Failed() && value != imagelist.FormatArtifactHubImages(listed) {
			t.Errorf("%s's %s names the listed images but not in its generated form (names, order)", chartName, imagelist.ImagesAnnotation)
		}
		if t.Failed() {
			t.Log("run make golden to rewrite the annotation from the render")
		}
	})

	t.Run("ships in the packaged chart", func(t *testing.T) {
		pkg := action.NewPackage()
		pkg.Destination = t.TempDir()
		path, err := pkg.Run(chartrender.ChartDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		packaged, err := loader.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(listPath)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(packaged.Files, func(f *chart.File) bool { return f.Name == imagelist.FileName })
		if i < 0 {
			t.Fatalf("the packaged chart %s lacks %s (check .helmignore)", filepath.Base(path), imagelist.FileName)
		}
		if string(packaged.Files[i].Data) != string(want) {
			t.Errorf("the packaged chart's %s differs from %s", imagelist.FileName, listName)
		}
	})
}

// summarize names the first few renders of a list, sorted, and counts the rest.
func summarize(renders []string) string {
	renders = slices.Sorted(slices.Values(renders))
	if len(renders) <= 3 {
		return strings.Join(renders, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(renders[:3], ", "), len(renders)-3)
}

// renderReleased renders the chart at its released versions: the project's own image is tagged with the chart's
// appVersion, which chartrender.Load pins to a placeholder for stable goldens.
func renderReleased(t *testing.T, vals map[string]any, kubeVersion, where string) string {
	t.Helper()
	chrt, err := loader.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
		t.Fatal(err)
	}
	out, err := chartrender.Render(t.Context(), chrt, vals, kubeVersion)
	if err != nil {
		t.Fatalf("render %s: %v", where, err)
	}
	return out
}

// renderedImages lists a render's images, each a reference an air-gapped copy can reproduce exactly.
func renderedImages(t *testing.T, stream, where string) []string {
	t.Helper()
	images, err := imagelist.FromManifests(stream)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	for _, img := range images {
		if err := imagelist.CheckReference(img); err != nil {
			t.Errorf("%s renders %v", where, err)
		}
	}
	return images
}

// checkMirrored checks that a render through a mirror runs exactly the upstream images, each moved to the mirror.
func checkMirrored(t *testing.T, where, mirror string, upstream, mirrored []string) {
	t.Helper()
	var moved []string
	for _, img := range upstream {
		moved = append(moved, mirror+strings.TrimPrefix(img, imagelist.RegistryOf(img)))
	}
	for _, img := range mirrored {
		if !slices.Contains(moved, img) {
			t.Errorf("%s renders %s, which is none of its upstream images moved to %s", where, img, mirror)
		}
	}
	for i, img := range moved {
		if !slices.Contains(mirrored, img) {
			t.Errorf("%s does not take %s from its mirror (want %s)", where, upstream[i], img)
		}
	}
}

// TestArtifactHubAnnotations checks the annotations Artifact Hub shows besides the images: the license and the
// source and docs links.
func TestArtifactHubAnnotations(t *testing.T) {
	chartYAML, err := os.ReadFile(filepath.Join(chartrender.ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	annotations, err := imagelist.ChartAnnotations(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	if got := annotations["artifacthub.io/license"]; got != "Apache-2.0" {
		t.Errorf("artifacthub.io/license is %q, want Apache-2.0", got)
	}
	var links []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	}
	if err := yaml.UnmarshalStrict([]byte(annotations["artifacthub.io/links"]), &links); err != nil {
		t.Fatalf("artifacthub.io/links: %v", err)
	}
	got := map[string]string{}
	for _, l := range links {
		got[l.Name] = l.URL
	}
	const repo = "https://github.com/kube-gpu-stack/kube-gpu-stack"
	want := map[string]string{"source": repo, "docs": repo + "/blob/main/README.md"}
	if !maps.Equal(got, want) {
		t.Errorf("artifacthub.io/links: %v, want %v", got, want)
	}
}
