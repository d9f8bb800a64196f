// Package airgaptest plays an air-gapped install's registries on 127.0.0.1: an "upstream" seeded with a small
// random image under every name in the chart's images.txt (every third a two-platform index, so multi-arch images
// travel whole), the bundle built from it with the project's own image from a local OCI layout, and a "private"
// registry the bundle is mirrored into. Nothing reaches a registry outside the machine.
package airgaptest

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap/registrytest"
)

// Mirrored is a bundle built from upstream and mirrored into private.
type Mirrored struct {
	// Upstream and Private are the registries' host:port.
	Upstream, Private string
	// Bundle is the bundle tarball; ChartFile the chart archive the mirror copied out of it.
	Bundle, ChartFile string
	// Bundled is what the bundle holds: repository:tag -> digest.
	Bundled map[string]v1.Hash
	// BundleLog and MirrorLog are the commands' output.
	BundleLog, MirrorLog string
}

// Registry starts an in-process registry on 127.0.0.1 for the test and returns its host:port.
func Registry(t testing.TB) string { return registrytest.Registry(t) }

// unpinnedList writes the images by tag alone into a file for the bundle to read (BundleOptions.ImagesFile), and
// returns its path; "" when none is pinned (the chart's own list does). The registry seeded here holds random
// images, never the digests the chart pins (upstream's, global.imageDigests' defaults); the bundle's
// values-airgap.yaml then pins every image to what it bundled, by the same keys, so the renders checked against the
// private registry still carry a digest for each image.
func unpinnedList(t testing.TB, images []airgap.Image) string {
	t.Helper()
	if !slices.ContainsFunc(images, func(img airgap.Image) bool { return img.Digest != (v1.Hash{}) }) {
		return ""
	}
	var lines []string
	for _, img := range images {
		lines = append(lines, img.Ref)
	}
	path := filepath.Join(t.TempDir(), imagelist.FileName)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// BundleAndMirror seeds an upstream registry under every name in chartDir's images.txt, bundles the chart with
// airgap.BundleOptions and mirrors the bundle into a private registry with airgap.MirrorOptions.
func BundleAndMirror(t testing.TB, chartDir string) *Mirrored {
	t.Helper()
	listPath := filepath.Join(chartDir, imagelist.FileName)
	content, err := os.ReadFile(listPath)
	if err != nil {
		t.Fatalf("the air-gapped bundle is built from %s, which cannot be read: %v", listPath, err)
	}
	images, err := airgap.ReadImageList(bytes.NewReader(content), listPath)
	if err != nil {
		t.Fatal(err)
	}
	m := &Mirrored{Upstream: Registry(t), Bundled: map[string]v1.Hash{}}
	ownLayout := ""
	for i, img := range images {
		var a interface{ Digest() (v1.Hash, error) }
		if i%3 == 0 {
			a, err = random.Index(512, 1, 2)
		} else {
			a, err = random.Image(512, 1)
		}
		if err != nil {
			t.Fatal(err)
		}
		if img.Repository() == airgap.OwnRepository {
			ownLayout = registrytest.OwnImageLayout(t, a.(v1.ImageIndex), img.Ref)
		} else {
			seed(t, m.Upstream, img, a)
		}
		m.Bundled[img.Repository()+":"+img.Tag.TagStr()], _ = a.Digest()
	}
	if ownLayout == "" {
		t.Fatalf("%s lists no image of repository %s: the chart's hooks and validator run it", listPath, airgap.OwnRepository)
	}

	m.Bundle = filepath.Join(t.TempDir(), "bundle.tar")
	var out bytes.Buffer
	b := airgap.BundleOptions{ChartDir: chartDir, ImagesFile: unpinnedList(t, images), OwnImageLayout: ownLayout, Upstream: m.Upstream, Out: m.Bundle}
	if err := b.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := b.Run(t.Context(), &out); err != nil {
		t.Fatalf("bundle: %v\n%s", err, out.String())
	}
	m.BundleLog = out.String()

	m.Private = Registry(t)
	out.Reset()
	mo := airgap.MirrorOptions{Bundle: m.Bundle, Registry: m.Private, Out: t.TempDir()}
	mo.Complete()
	if err := mo.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := mo.Run(t.Context(), &out); err != nil {
		t.Fatalf("mirror: %v\n%s", err, out.String())
	}
	m.MirrorLog = out.String()
	md, err := chartutil.LoadChartfile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m.ChartFile = filepath.Join(mo.Out, "kube-gpu-stack-"+md.Version+".tgz")
	return m
}

// CheckInPrivate resolves a rendered reference in the private registry and compares its digest with the bundled
// image of the same repository and tag, reporting each mismatch.
func (m *Mirrored) CheckInPrivate(t testing.TB, ref string) {
	t.Helper()
	img, err := airgap.ParseImage(ref)
	if err != nil {
		t.Errorf("rendered %v", err)
		return
	}
	want, ok := m.Bundled[img.Repository()+":"+img.Tag.TagStr()]
	if !ok {
		t.Errorf("%s is rendered but not in the bundle", ref)
		return
	}
	if img.Digest != (v1.Hash{}) && img.Digest != want {
		t.Errorf("%s pins a digest the bundle does not hold (%s)", ref, want)
	}
	tagged, err := remote.Head(img.Tag)
	if err != nil {
		t.Errorf("%s: %v", ref, err)
		return
	}
	if tagged.Digest != want {
		t.Errorf("%s is %s in the private registry, the bundle holds %s", ref, tagged.Digest, want)
	}
	if _, err := remote.Get(img.Tag.Context().Digest(want.String())); err != nil {
		t.Errorf("%s by digest %s: %v", ref, want, err)
	}
}

// UserSupplied: a repository path under one of imagelist.UserSuppliedPrefixes, moved to the mirror (licensed
// images the user mirrors from their own copy; the bundle cannot hold them).
func UserSupplied(path string) bool {
	for _, prefix := range imagelist.UserSuppliedPrefixes {
		// a registry's whole namespace (the cluster's own registry) has no path to move: its images stay where they are
		if _, repoPrefix, _ := strings.Cut(prefix, "/"); repoPrefix != "" && strings.HasPrefix(path, repoPrefix) {
			return true
		}
	}
	return false
}

func seed(t testing.TB, reg string, img airgap.Image, a any) {
	t.Helper()
	dst, err := img.In(reg)
	if err != nil {
		t.Fatal(err)
	}
	registrytest.Push(t, dst, a)
}
