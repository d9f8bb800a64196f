package airgap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	stdlog "log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/chart/loader"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap/registrytest"
)

func TestMain(m *testing.M) {
	stdlog.SetOutput(io.Discard) // the TLS test servers log each refused handshake
	os.Exit(m.Run())
}

// TestBundleThenMirror is the whole path: bundle from "upstream", check what the tarball holds, mirror into a
// "private" registry, find every image there by digest under its repository path, mirror again and push nothing.
func TestBundleThenMirror(t *testing.T) {
	f := newFixture(t, 256<<10)
	out := filepath.Join(t.TempDir(), "kube-gpu-stack-1.2.3-airgap.tar")
	log, err := f.bundle(t, out)
	if err != nil {
		t.Fatalf("bundle: %v\n%s", err, log)
	}
	t.Log("bundle:\n" + log)

	// What each listed image must be: the tag's digest upstream, the pinned digest, the own layout's.
	want := map[string]v1.Hash{}
	for ref, a := range f.seeded {
		want[ref], _ = a.Digest()
	}
	if moved := inRegistry(t, f.upstream, nfd); moved.Digest == want[nfd] {
		t.Fatal("fixture: the NFD tag should have moved away from the pinned digest")
	}

	entries := readTar(t, out)
	var names []string
	files := map[string][]byte{}
	for _, e := range entries {
		names = append(names, e.name)
		files[e.name] = e.data
	}
	t.Run("layout of the tarball", func(t *testing.T) {
		if names[len(names)-1] != SumsFile || !slices.IsSorted(names[:len(names)-1]) {
			t.Errorf("want sorted files then %s, got %v", SumsFile, names)
		}
		for _, n := range []string{"kube-gpu-stack-1.2.3.tgz", ImagesFile, ValuesFile, "images/index.json", "images/oci-layout"} {
			if _, ok := files[n]; !ok {
				t.Errorf("bundle lacks %s (has %v)", n, names)
			}
		}
	})
	t.Run("SHA256SUMS covers every other file", func(t *testing.T) {
		listed := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(files[SumsFile])), "\n") {
			sum, name, ok := strings.Cut(line, "  ")
			if !ok {
				t.Fatalf("not sha256sum format: %q", line)
			}
			listed[name] = sum
		}
		for _, e := range entries {
			if e.name == SumsFile {
				continue
			}
			sum := sha256.Sum256(e.data)
			if listed[e.name] != hex.EncodeToString(sum[:]) {
				t.Errorf("%s: SHA256SUMS says %q, content is %x", e.name, listed[e.name], sum)
			}
		}
		if len(listed) != len(entries)-1 {
			t.Errorf("SHA256SUMS lists %d files, the bundle has %d others", len(listed), len(entries)-1)
		}
	})
	t.Run("images.txt pins every image", func(t *testing.T) {
		listed, err := ReadImageList(bytes.NewReader(files[ImagesFile]), ImagesFile)
		if err != nil {
			t.Fatal(err)
		}
		if len(listed) != len(want) {
			t.Errorf("lists %d images, want %d:\n%s", len(listed), len(want), files[ImagesFile])
		}
		for _, img := range listed {
			if img.Digest != want[img.Ref] {
				t.Errorf("%s: listed %s, want %s", img.Ref, img.Digest, want[img.Ref])
			}
		}
	})
	t.Run("values-airgap.yaml", func(t *testing.T) {
		var vals struct {
			Global struct {
				ImageRegistry string            `json:"imageRegistry"`
				ImageDigests  map[string]string `json:"imageDigests"`
			}
		}
		if err := yaml.Unmarshal(files[ValuesFile], &vals); err != nil {
			t.Fatal(err)
		}
		if vals.Global.ImageRegistry != PlaceholderRegistry || !strings.Contains(string(files[ValuesFile]), "# Replace "+PlaceholderRegistry) {
			t.Errorf("want global.imageRegistry %s with a comment saying to replace it:\n%s", PlaceholderRegistry, files[ValuesFile])
		}
		// every bundled image pinned, by repository:tag as the chart names it, to the digest bundled
		images, err := ReadImageList(bytes.NewReader(files[ImagesFile]), ImagesFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range images {
			key := img.Repository() + ":" + img.Tag.TagStr()
			if got := vals.Global.ImageDigests[key]; got != img.Digest.String() {
				t.Errorf("imageDigests[%s] = %q, want %s", key, got, img.Digest)
			}
		}
		if len(vals.Global.ImageDigests) != len(images) {
			t.Errorf("imageDigests holds %d images, the bundle %d", len(vals.Global.ImageDigests), len(images))
		}
	})
	t.Run("the chart archive holds the operand subchart", func(t *testing.T) {
		chrt, err := loader.LoadArchive(bytes.NewReader(files["kube-gpu-stack-1.2.3.tgz"]))
		if err != nil {
			t.Fatal(err)
		}
		if chrt.Metadata.Version != "1.2.3" || len(chrt.Dependencies()) != 1 || chrt.Dependencies()[0].Name() != "device-plugin" ||
			len(chrt.Dependencies()[0].Templates) != 2 {
			t.Errorf("packaged chart %s %s with dependencies %v", chrt.Name(), chrt.Metadata.Version, chrt.Dependencies())
		}
	})

	// Every blob of every image, once: the layout must hold exactly these.
	unique := map[v1.Hash]int64{}
	var total int64 // what storing each image separately would take
	for _, a := range f.seeded {
		per := map[v1.Hash]int64{}
		blobsOf(t, a, per)
		for h, n := range per {
			unique[h] = n
			total += n
		}
	}
	t.Run("identical blobs are stored once", func(t *testing.T) {
		var stored []string
		for _, n := range names {
			if hexDigest, ok := blobDigestHex(n); ok {
				stored = append(stored, hexDigest)
			}
		}
		var wantBlobs []string
		for h := range unique {
			wantBlobs = append(wantBlobs, h.Hex)
		}
		slices.Sort(stored)
		slices.Sort(wantBlobs)
		if !slices.Equal(stored, wantBlobs) {
			t.Errorf("layout blobs %v, want exactly the images' unique blobs %v", stored, wantBlobs)
		}
	})
	t.Run("the tarball is the blobs plus the small files and tar headers", func(t *testing.T) {
		st, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		var blobBytes, other, headers int64
		for _, e := range entries {
			n := int64(len(e.data))
			headers += 512 + (512-n%512)%512 // a header block, and padding of the data to 512
			if _, ok := blobDigestHex(e.name); ok {
				blobBytes += n
			} else {
				other += n
			}
		}
		headers += 1024 // the end-of-archive blocks
		var uniqueBytes int64
		for _, n := range unique {
			uniqueBytes += n
		}
		if blobBytes != uniqueBytes || st.Size() != blobBytes+other+headers {
			t.Errorf("bundle %d bytes = blobs %d (unique blobs: %d) + other files %d + tar headers and padding %d?",
				st.Size(), blobBytes, uniqueBytes, other, headers)
		}
		t.Logf("bundle %d bytes; unique blobs %d bytes (%d blobs; %d bytes if each image kept its own); chart, "+
			"index and text files %d bytes; tar headers and padding %d bytes (%d entries)",
			st.Size(), uniqueBytes, len(unique), total, other, headers, len(entries))
	})

	private := startRegistry(t)
	chartOut := t.TempDir()
	log, err = mirror(t, out, private, func(o *MirrorOptions) { o.Out = chartOut })
	if err != nil {
		t.Fatalf("mirror: %v\n%s", err, log)
	}
	t.Log("mirror:\n" + log)
	t.Run("every image is in the private registry by digest, under its repository path", func(t *testing.T) {
		for ref, digest := range want {
			got := inRegistry(t, private, ref)
			if got.Digest != digest {
				t.Errorf("%s: private registry has %s at the tag, want %s", ref, got.Digest, digest)
			}
			img, _ := ParseImage(ref)
			dst, _ := img.In(private)
			if _, err := remote.Get(dst.Context().Digest(digest.String())); err != nil {
				t.Errorf("%s by digest: %v", ref, err)
			}
			if !strings.Contains(log, "pushed         "+dst.String()+"@"+digest.String()+": ") {
				t.Errorf("no pushed line for %s", dst)
			}
		}
	})
	t.Run("the pushes counted are what the registry needed", func(t *testing.T) {
		// The in-process registry keeps blobs by digest across repositories (a blob pushed to one repository is
		// found in every other), and manifests per repository: so each unique blob is uploaded once, and each
		// repository gets its own manifests.
		blobs, manifests := map[v1.Hash]bool{}, map[string]bool{}
		for ref, a := range f.seeded {
			img, _ := ParseImage(ref)
			per := map[v1.Hash]int64{}
			blobsOf(t, a, per)
			m := manifestDigests(t, a)
			for h := range per {
				if slices.Contains(m, h) {
					manifests[img.Repository()+"@"+h.String()] = true
				} else {
					blobs[h] = true
				}
			}
		}
		wantLine := fmt.Sprintf("%d images in %s: %d pushed, 0 already there; the registry accepted %d blobs (", len(want), private, len(want), len(blobs))
		if !strings.Contains(log, wantLine) || !strings.Contains(log, fmt.Sprintf("), %d manifests\n", len(manifests))) {
			t.Errorf("want a summary %q...%d manifests, got:\n%s", wantLine, len(manifests), log)
		}
	})
	t.Run("helm install line and chart", func(t *testing.T) {
		chartFile := filepath.Join(chartOut, "kube-gpu-stack-1.2.3.tgz")
		valuesFile := filepath.Join(chartOut, ValuesFile)
		line := fmt.Sprintf("helm install gpu %s --namespace gpu-operator --create-namespace -f %s\n", chartFile, valuesFile)
		if !strings.HasSuffix(log, line) {
			t.Errorf("want the last line %q, got:\n%s", line, log)
		}
		filled, err := os.ReadFile(valuesFile)
		if want := strings.Replace(string(files[ValuesFile]), "imageRegistry: "+PlaceholderRegistry+"\n", fmt.Sprintf("imageRegistry: %q\n", private), 1); err != nil || string(filled) != want {
			t.Errorf("%s: %v; want the bundle's values with the registry filled in:\n%s", valuesFile, err, filled)
		}
		copied, err := os.ReadFile(chartFile)
		if err != nil || !bytes.Equal(copied, files["kube-gpu-stack-1.2.3.tgz"]) {
			t.Errorf("%s is not the bundle's chart archive: %v", chartFile, err)
		}
	})
	t.Run("mirroring again pushes nothing", func(t *testing.T) {
		again, err := mirror(t, out, private)
		if err != nil {
			t.Fatalf("mirror again: %v\n%s", err, again)
		}
		wantLine := fmt.Sprintf("%d images in %s: 0 pushed, %d already there; the registry accepted 0 blobs (0 B), 0 manifests\n", len(want), private, len(want))
		if !strings.Contains(again, wantLine) || strings.Count(again, "already there  ") != len(want) {
			t.Errorf("want %q and a line per image, got:\n%s", wantLine, again)
		}
	})
}

func manifestDigests(t *testing.T, a artifact) []v1.Hash {
	t.Helper()
	d, _ := a.Digest()
	out := []v1.Hash{d}
	if idx, ok := a.(v1.ImageIndex); ok {
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range im.Manifests {
			out = append(out, m.Digest)
		}
	}
	return out
}

// TestBundleIsReproducible: the same chart and images make the same bytes (fixed times, sorted entries).
func TestBundleIsReproducible(t *testing.T) {
	f := newFixture(t, 4<<10)
	first, err := os.ReadFile(f.mustBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(f.mustBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Error("two bundles of the same chart and images differ")
	}
}

// TestBundleFailsOnAMissingImage: an image upstream lacks fails the bundle naming it, and leaves no tarball (and
// no scratch files) behind.
func TestBundleFailsOnAMissingImage(t *testing.T) {
	f := newFixture(t, 4<<10)
	missing := "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0"
	f.chartDir = writeChart(t, f.list+missing+"\n")
	dir := t.TempDir()
	out := filepath.Join(dir, "bundle.tar")
	log, err := f.bundle(t, out)
	if err == nil || !strings.Contains(err.Error(), "image "+missing+" (pulled from "+f.upstream+"/nvidia/cloud-native/k8s-mig-manager:v0.15.0)") {
		t.Fatalf("want an error naming %s, got %v\n%s", missing, err, log)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Errorf("a failed bundle left %v in %s", left, dir)
	}
}

// TestOwnImageComesFromTheLayout: the own image is never pulled (upstream does not have it); a layout without it
// fails naming what it holds, and bundling without a layout is refused up front.
func TestOwnImageComesFromTheLayout(t *testing.T) {
	f := newFixture(t, 4<<10)
	if mustIn(t, ownImage, f.upstream) != (v1.Hash{}) {
		t.Fatal("fixture: upstream should not hold the own image")
	}
	other, _ := f.seeded[ownImage].(v1.ImageIndex)
	f.ownLayout = registrytest.OwnImageLayout(t, other, "ghcr.io/kube-gpu-stack/kube-gpu-stack:9.9.9")
	_, err := f.bundle(t, filepath.Join(t.TempDir(), "b.tar"))
	if err == nil || !strings.Contains(err.Error(), "holds no image named "+ownImage+" (it holds: ghcr.io/kube-gpu-stack/kube-gpu-stack:9.9.9)") {
		t.Errorf("want an error naming the own image and what the layout holds, got %v", err)
	}
	f.ownLayout = ""
	_, err = f.bundle(t, filepath.Join(t.TempDir(), "b.tar"))
	if err == nil || !strings.Contains(err.Error(), "pass --own-image-layout") {
		t.Errorf("want a refusal asking for --own-image-layout, got %v", err)
	}
}

// mustIn returns the digest reg holds at ref's repository path and tag; zero when it holds none.
func mustIn(t *testing.T, ref, reg string) v1.Hash {
	t.Helper()
	desc, err := remote.Head(tagIn(t, reg, ref))
	if err != nil {
		return v1.Hash{}
	}
	return desc.Digest
}

// TestMirrorPushesOnlyWhatIsMissing: an image the registry already has at its tag is not pushed; with Force, one
// whose tag points elsewhere is pushed and re-tagged; the bundle can also be an unpacked folder.
func TestMirrorPushesOnlyWhatIsMissing(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	private := startRegistry(t)
	toolkitImg, _ := ParseImage(toolkit)
	pushTo(t, private, toolkitImg, f.seeded[toolkit])
	rhel, _ := ParseImage(driverRHEL)
	pushTo(t, private, rhel, f.seeded[toolkit]) // the wrong image at the driver's tag

	folder := t.TempDir()
	for _, e := range readTar(t, bundle) {
		p := filepath.Join(folder, filepath.FromSlash(e.name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, e.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log, err := mirror(t, folder, private, func(o *MirrorOptions) { o.Force = true })
	if err != nil {
		t.Fatalf("mirror: %v\n%s", err, log)
	}
	if !strings.Contains(log, "already there  "+mustTag(t, toolkit, private)) || strings.Count(log, "already there  ") != 1 {
		t.Errorf("want only the toolkit already there:\n%s", log)
	}
	wrong, _ := f.seeded[toolkit].Digest()
	want, _ := f.seeded[driverRHEL].Digest()
	if inRegistry(t, private, driverRHEL).Digest != want {
		t.Error("the driver's tag still points at the wrong image")
	}
	if line := fmt.Sprintf("replaced       %s@%s (the tag pointed at %s): ", mustTag(t, driverRHEL, private), want, wrong); !strings.Contains(log, line) {
		t.Errorf("want a line %q:\n%s", line, log)
	}
	if !strings.Contains(log, ": 4 pushed, 1 already there;") {
		t.Errorf("want 4 pushed, 1 already there:\n%s", log)
	}
}

func mustTag(t *testing.T, ref, reg string) string {
	t.Helper()
	img, _ := ParseImage(ref)
	tag, err := img.In(reg)
	if err != nil {
		t.Fatal(err)
	}
	return tag.String()
}

// TestMirrorRefusesACorruptBundle: a changed byte or a cut-short tarball fails before anything is pushed,
// naming what is wrong.
func TestMirrorRefusesACorruptBundle(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	content, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	var victim tarEntry
	for _, e := range readTar(t, bundle) {
		if _, ok := blobDigestHex(e.name); ok && len(e.data) > 1000 {
			victim = e
			break
		}
	}
	corrupt := bytes.Clone(content)
	corrupt[victim.offset+500] ^= 0xff
	corruptPath := filepath.Join(t.TempDir(), "corrupt.tar")
	if err := os.WriteFile(corruptPath, corrupt, 0o644); err != nil {
		t.Fatal(err)
	}
	private := startRegistry(t)
	_, err = mirror(t, corruptPath, private)
	if err == nil || !strings.Contains(err.Error(), victim.name+" is corrupt") || !strings.Contains(err.Error(), "nothing pushed") {
		t.Errorf("want an error naming %s as corrupt, got %v", victim.name, err)
	}

	// Cut inside a file, and between two files (SHA256SUMS comes last, so any cut loses it).
	for cut, want := range map[int64]string{victim.offset + 500: "not a complete tarball", victim.offset - 512: "has no SHA256SUMS"} {
		cutPath := filepath.Join(t.TempDir(), "cut.tar")
		if err := os.WriteFile(cutPath, content[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err = mirror(t, cutPath, private); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("cut at %d: want %q, got %v", cut, want, err)
		}
	}
	if repos := catalog(t, private); len(repos) != 0 {
		t.Errorf("a refused bundle pushed to %v", repos)
	}
}

// TestMirrorVerifiesByDigest: a registry that accepts the push but does not serve the manifest by digest fails
// the mirror, naming the image.
func TestMirrorVerifiesByDigest(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	lossy := startRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/nvidia/k8s/container-toolkit/manifests/sha256:") {
				http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"lost"}]}`, http.StatusNotFound)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	_, err := mirror(t, bundle, lossy)
	if err == nil || !strings.Contains(err.Error(), "image "+toolkit+": "+lossy+"/nvidia/k8s/container-toolkit does not serve sha256:") {
		t.Errorf("want the toolkit named as not served by digest, got %v", err)
	}
}

// TestMirrorTrustsTheCAFile: a TLS registry with its own CA works with --ca and fails without it.
func TestMirrorTrustsTheCAFile(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	s := httptest.NewTLSServer(registry.New(registry.Logger(stdlog.New(io.Discard, "", 0))))
	t.Cleanup(s.Close)
	reg := strings.TrimPrefix(s.URL, "https://")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := mirror(t, bundle, reg); err == nil {
		t.Error("a registry with an unknown CA was trusted without --ca")
	}
	log, err := mirror(t, bundle, reg, func(o *MirrorOptions) { o.CAFile = ca })
	if err != nil || !strings.Contains(log, "5 pushed") {
		t.Errorf("with --ca: %v\n%s", err, log)
	}
	if _, err := mirror(t, bundle, reg, func(o *MirrorOptions) { o.CAFile = bundle }); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("want a --ca file without certificates refused, got %v", err)
	}
}

func TestReadImageList(t *testing.T) {
	good := "# header\n\nnvcr.io/nvidia/driver:595\n  registry.k8s.io/nfd/node-feature-discovery:v0.19.0@sha256:" + strings.Repeat("ab", 32) +
		"\nnvcr.io/nvidia/driver:595\n"
	images, err := ReadImageList(strings.NewReader(good), "list")
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 2 || images[0].Repository() != "nvidia/driver" || images[0].Digest != (v1.Hash{}) ||
		images[1].Digest.Hex != strings.Repeat("ab", 32) || images[1].Ref != "registry.k8s.io/nfd/node-feature-discovery:v0.19.0" {
		t.Errorf("parsed %+v", images)
	}
	if moved, _ := images[1].In("mirror.local:5000/gpu"); moved.String() != "mirror.local:5000/gpu/nfd/node-feature-discovery:v0.19.0" {
		t.Errorf("moved to %s", moved)
	}
	for content, want := range map[string]string{
		"# x\nnvcr.io/nvidia/driver\n":                                 "list:2: image \"nvcr.io/nvidia/driver\"",
		"a.io/x:1@sha256:nothex\n":                                     "list:1: image \"a.io/x:1@sha256:nothex\": digest",
		"a.io/x:1@sha256:" + strings.Repeat("ab", 32) + "\na.io/x:1\n": "list:2: a.io/x:1 is listed twice with different digests",
	} {
		if _, err := ReadImageList(strings.NewReader(content), "list"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want %q, got %v", content, want, err)
		}
	}
}

// TestProgressBar: on a terminal the bar is redrawn in place and cleared; elsewhere nothing is drawn.
func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	b := newBar(&buf, "nvcr.io/nvidia/driver:595")
	b.setTotal(2000)
	b.add(1000)
	b.clear()
	if buf.Len() != 0 {
		t.Errorf("drew %q on a non-terminal", buf.String())
	}
	b.live = true
	b.update(v1.Update{Total: 2_000_000, Complete: 500_000})
	b.clear()
	want := "\r\x1b[Knvcr.io/nvidia/driver:595 [======                  ]  25% 500.0 kB/2.0 MB\r\x1b[K"
	if buf.String() != want {
		t.Errorf("drew %q, want %q", buf.String(), want)
	}
}

// TestBundleLayoutNamesEveryImage: the layout Mirror reads names each image by its listed reference, in the
// list's order, with the right digest.
func TestBundleLayoutNamesEveryImage(t *testing.T) {
	f := newFixture(t, 4<<10)
	files, err := openBundle(f.mustBundle(t), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	index, err := bundleLayout{files}.index()
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, d := range index.Manifests {
		named = append(named, d.Annotations[refNameAnnotation])
		want, _ := f.seeded[d.Annotations[refNameAnnotation]].Digest()
		if d.Digest != want {
			t.Errorf("%s: layout has %s, want %s", d.Annotations[refNameAnnotation], d.Digest, want)
		}
	}
	wantNames := []string{ownImage, driverRHEL, driverUbuntu, toolkit, nfd}
	if !slices.Equal(named, wantNames) {
		t.Errorf("layout names %v, want the list's order %v", named, wantNames)
	}
}
