package airgap

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap/registrytest"
)

// startRegistry starts an in-process registry on 127.0.0.1 and returns its host:port.
func startRegistry(t *testing.T, wrap ...func(http.Handler) http.Handler) string {
	return registrytest.Registry(t, wrap...)
}

// artifact is an image or an index, as the tests seed them.
type artifact interface {
	Digest() (v1.Hash, error)
}

// fixture is an "upstream" registry seeded with every image of an image list, the project's own image in a
// local OCI layout, and a small chart in the real chart's shape (an operand subchart linked into charts/).
type fixture struct {
	upstream  string
	chartDir  string
	ownLayout string
	ownRef    string
	// seeded maps each listed reference to what upstream (or the own layout) holds for it.
	seeded map[string]artifact
	list   string
}

const (
	driverUbuntu = "nvcr.io/nvidia/driver:595-ubuntu22.04"
	driverRHEL   = "nvcr.io/nvidia/driver:595-rhel9"
	toolkit      = "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
	nfd          = "registry.k8s.io/nfd/node-feature-discovery:v0.19.0"
	ownImage     = "ghcr.io/kube-gpu-stack/kube-gpu-stack:1.2.3"
)

// newFixture seeds upstream. layerSize sets the random layers' size. The driver images share a base layer
// (within one repository) and the toolkit shares it too (across repositories), so the bundle has something to
// deduplicate; the driver for Ubuntu is a two-platform index; NFD is listed pinned by digest, and upstream then
// moves its tag to another image, so only the pinned digest is right.
func newFixture(t *testing.T, layerSize int64) *fixture {
	t.Helper()
	f := &fixture{upstream: startRegistry(t), seeded: map[string]artifact{}, ownRef: ownImage}
	base := mustLayer(t, layerSize)
	image := func(layers ...v1.Layer) v1.Image {
		img, err := mutate.AppendLayers(empty.Image, layers...)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	platform := func(img v1.Image, arch string) mutate.IndexAddendum {
		return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}}
	}
	f.seeded[driverUbuntu] = mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		platform(image(base, mustLayer(t, layerSize)), "amd64"), platform(image(base, mustLayer(t, layerSize)), "arm64"))
	f.seeded[driverRHEL] = image(base, mustLayer(t, layerSize))
	f.seeded[toolkit] = image(base, mustLayer(t, layerSize/2))
	f.seeded[nfd] = image(mustLayer(t, layerSize/4))
	for ref, a := range f.seeded {
		f.push(t, ref, a)
	}
	nfdDigest, _ := f.seeded[nfd].Digest()
	f.push(t, nfd, image(mustLayer(t, 100))) // the tag moves on; the list pins the old digest

	own, err := random.Index(layerSize/4, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	f.seeded[ownImage] = own
	f.ownLayout = registrytest.OwnImageLayout(t, own, ownImage)

	f.list = strings.Join([]string{"# images of the test chart", "", ownImage, driverRHEL, driverUbuntu, toolkit,
		nfd + "@" + nfdDigest.String()}, "\n") + "\n"
	f.chartDir = writeChart(t, f.list)
	return f
}

func mustLayer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	l, err := random.Layer(size, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// push writes an image or index to upstream under ref's repository path and tag.
func (f *fixture) push(t *testing.T, ref string, a artifact) {
	t.Helper()
	img, err := ParseImage(ref)
	if err != nil {
		t.Fatal(err)
	}
	pushTo(t, f.upstream, img, a)
}

func pushTo(t *testing.T, reg string, img Image, a artifact) {
	t.Helper()
	dst, err := img.In(reg)
	if err != nil {
		t.Fatal(err)
	}
	registrytest.Push(t, dst, a)
}

// writeChart writes a chart named kube-gpu-stack whose operand subchart is a symlink into operands/, like the
// real chart, with the image list inside.
func writeChart(t *testing.T, images string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"chart/Chart.yaml": "apiVersion: v2\nname: kube-gpu-stack\nversion: 1.2.3\nappVersion: \"1.2.3\"\n" +
			"dependencies:\n  - name: device-plugin\n    version: 0.1.0\n    repository: file://../operands/device-plugin\n",
		"chart/values.yaml":                          "global:\n  imageRegistry: \"\"\n",
		"chart/images.txt":                           images,
		"chart/templates/cm.yaml":                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
		"operands/device-plugin/Chart.yaml":          "apiVersion: v2\nname: device-plugin\nversion: 0.1.0\n",
		"operands/device-plugin/templates/ds.yaml":   "# device plugin DaemonSet\n",
		"operands/device-plugin/values.yaml":         "image: {repository: nvidia/k8s-device-plugin}\n",
		"operands/device-plugin/templates/NOTES.txt": "operand\n",
	}
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "chart", "charts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../operands/device-plugin", filepath.Join(root, "chart", "charts", "device-plugin")); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "chart")
}

// bundle runs Bundle with the fixture's chart, own image and upstream, writing to out.
func (f *fixture) bundle(t *testing.T, out string) (string, error) {
	t.Helper()
	o := BundleOptions{ChartDir: f.chartDir, OwnImageLayout: f.ownLayout, Upstream: f.upstream, Out: out}
	var log bytes.Buffer
	if err := o.Complete(); err != nil {
		return "", err
	}
	if err := o.Validate(); err != nil {
		return "", err
	}
	err := o.Run(context.Background(), &log)
	return log.String(), err
}

func (f *fixture) mustBundle(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bundle.tar")
	if log, err := f.bundle(t, out); err != nil {
		t.Fatalf("bundle: %v\n%s", err, log)
	}
	return out
}

// mirror runs Mirror of bundle into reg.
func mirror(t *testing.T, bundle, reg string, edit ...func(*MirrorOptions)) (string, error) {
	t.Helper()
	o := MirrorOptions{Bundle: bundle, Registry: reg, Out: t.TempDir()}
	for _, e := range edit {
		e(&o)
	}
	o.Complete()
	if err := o.Validate(); err != nil {
		return "", err
	}
	var log bytes.Buffer
	err := o.Run(context.Background(), &log)
	return log.String(), err
}

// tarEntry is one file of a tarball, in order.
type tarEntry struct {
	name   string
	offset int64 // of the data
	data   []byte
}

func readTar(t *testing.T, path string) []tarEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	var out []tarEntry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		off := cr.n
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tarEntry{h.Name, off, data})
	}
}

// blobsOf lists every blob (manifests included) an image or index consists of, with sizes.
func blobsOf(t *testing.T, a artifact, into map[v1.Hash]int64) {
	t.Helper()
	switch a := a.(type) {
	case v1.ImageIndex:
		raw, err := a.RawManifest()
		if err != nil {
			t.Fatal(err)
		}
		d, _ := a.Digest()
		into[d] = int64(len(raw))
		im, err := a.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range im.Manifests {
			child, err := a.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			blobsOf(t, child, into)
		}
	case v1.Image:
		raw, err := a.RawManifest()
		if err != nil {
			t.Fatal(err)
		}
		d, _ := a.Digest()
		into[d] = int64(len(raw))
		m, err := a.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		into[m.Config.Digest] = m.Config.Size
		for _, l := range m.Layers {
			into[l.Digest] = l.Size
		}
	}
}

// tagIn is ref's repository path and tag in registry reg.
func tagIn(t *testing.T, reg, ref string) name.Tag {
	t.Helper()
	img, err := ParseImage(ref)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := img.In(reg)
	if err != nil {
		t.Fatal(err)
	}
	return tag
}

// inRegistry returns what reg serves for ref's repository path and tag, or fails.
func inRegistry(t *testing.T, reg, ref string) *remote.Descriptor {
	t.Helper()
	tag := tagIn(t, reg, ref)
	desc, err := remote.Get(tag)
	if err != nil {
		t.Fatalf("%s: %v", tag, err)
	}
	return desc
}

// catalog lists a registry's repositories.
func catalog(t *testing.T, reg string) []string {
	t.Helper()
	r, err := name.NewRegistry(reg)
	if err != nil {
		t.Fatal(err)
	}
	repos, err := remote.Catalog(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return repos
}
