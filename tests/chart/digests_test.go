package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// upstreamPins is the GPU Operator v26.7.0 release's digest of each image it published with a tag and a digest,
// keyed as global.imageDigests keys them (repository:tag, no registry), read from the vendored excerpt of its bundle.
func upstreamPins(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "gpu-operator-v26.7.0-related-images.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		RelatedImages []struct{ Name, Image string } `json:"relatedImages"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	pins := map[string]string{}
	for _, img := range doc.RelatedImages {
		if key, digest := pinKey(img.Image); key != "" && digest != "" {
			pins[key] = digest
		}
	}
	if len(pins) < 10 {
		t.Fatalf("read %d tagged and pinned images from the vendored bundle excerpt, want its 13 or so", len(pins))
	}
	return pins
}

// pinKey splits registry/repository:tag@digest into global.imageDigests' key (repository:tag) and the digest; the
// key is empty for a reference without a tag.
func pinKey(ref string) (key, digest string) {
	ref, digest, _ = strings.Cut(ref, "@")
	_, path, _ := strings.Cut(ref, "/") // every reference here names its registry
	if i := strings.LastIndex(path, ":"); i < 0 || strings.Contains(path[i:], "/") {
		return "", digest
	}
	return path, digest
}

// TestDefaultDigestsAreUpstreamsOwn: the chart's default global.imageDigests are the digests the GPU Operator's
// v26.7.0 release published for the same repository and tag, each pins an image the chart renders (a version bump
// that forgets its pin fails here, instead of leaving a key that pins nothing), and every rendered image whose tag
// upstream published with a digest is pinned. A key set to "" unpins its image.
func TestDefaultDigestsAreUpstreamsOwn(t *testing.T) {
	t.Parallel()
	upstream := upstreamPins(t)
	raw, err := os.ReadFile(filepath.Join(chartrender.ChartDir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Global struct {
			ImageDigests map[string]string `json:"imageDigests"`
		} `json:"global"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	defaults := values.Global.ImageDigests
	if len(defaults) == 0 {
		t.Fatal("values.yaml pins no image by default")
	}
	for key, digest := range defaults {
		if want, ok := upstream[key]; !ok {
			t.Errorf("global.imageDigests[%s]: upstream's v26.7.0 release published no digest for that tag", key)
		} else if digest != want {
			t.Errorf("global.imageDigests[%s] = %s, upstream's v26.7.0 release published %s", key, digest, want)
		}
	}

	listed, err := imagelist.ParseFile(filepath.Join(chartrender.ChartDir(), imagelist.FileName))
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string]string{} // key -> digest as images.txt lists it (the render, checked by TestImages)
	for _, ref := range listed {
		if key, digest := pinKey(ref); key != "" {
			rendered[key] = digest
		}
	}
	for key := range defaults {
		if _, ok := rendered[key]; !ok {
			t.Errorf("global.imageDigests[%s] pins no image the chart renders (a version changed without its pin?)", key)
		}
	}
	pinned := 0
	for key, digest := range rendered {
		want, ok := upstream[key]
		switch {
		case !ok:
		case digest != want:
			t.Errorf("the chart renders %s@%s, upstream's v26.7.0 release published it as %s: pin it in global.imageDigests", key, digest, want)
		default:
			pinned++
		}
	}
	t.Logf("%d of %d rendered images pinned by default to upstream's digests", pinned, len(rendered))

	dp := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")}), "nvidia-device-plugin-daemonset")
	if got := dp.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(got, "@"+defaults["nvidia/k8s-device-plugin:v0.20.0"]) {
		t.Errorf("device plugin image %s: want the default pin", got)
	}
	unpinned := daemonSet(t, render(t, newestKube, []string{profileFile("container-only")},
		`global.imageDigests.nvidia/k8s-device-plugin:v0\.20\.0=`), "nvidia-device-plugin-daemonset")
	if got := unpinned.Spec.Template.Spec.Containers[0].Image; strings.Contains(got, "@") {
		t.Errorf("device plugin image %s with its pin set to \"\": want the tag alone", got)
	}
}
