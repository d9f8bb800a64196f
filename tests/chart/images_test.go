package chart

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestImages renders every profile for every supported Kubernetes version, alone and with the optional operands
// no profile enables, hooks and helm test Pods included (imagelist.Collect, as make generate does), and checks that
// charts/kube-gpu-stack/images.txt lists exactly the images they run, and that Chart.yaml's artifacthub.io/images
// annotation names the same ones. Licensed images only their owner can pull (imagelist.UserSupplied) are left out.
func TestImages(t *testing.T) {
	t.Parallel()
	set, err := imagelist.Collect(t.Context(), chartrender.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	rendered := set.Rendered
	images := set.Images()
	t.Logf("%d images (and %d user-supplied, not listed: %v) from %d renders", len(images), len(set.UserSupplied), set.UserSupplied, set.Renders)

	listPath := filepath.Join(chartrender.ChartDir(), imagelist.FileName)
	chartPath := filepath.Join(chartrender.ChartDir(), "Chart.yaml")
	// Failure messages name them from the repository root.
	listName, _ := filepath.Rel(chartrender.RepoRoot(), listPath)
	chartName, _ := filepath.Rel(chartrender.RepoRoot(), chartPath)

	t.Run("images.txt", func(t *testing.T) {
		listed, err := imagelist.ParseFile(listPath)
		if err != nil {
			t.Fatalf("%v (run make generate)", err)
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
			t.Log("review the chart change, then run make generate")
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
			t.Fatalf("%s has no %s annotation (run make generate)", chartName, imagelist.ImagesAnnotation)
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
			t.Log("run make generate to rewrite the annotation from the render")
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

// TestArtifactHubAnnotations checks the annotations Artifact Hub shows besides the images: the license and the
// source and docs links.
func TestArtifactHubAnnotations(t *testing.T) {
	t.Parallel()
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
