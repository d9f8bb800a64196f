package airgap

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// rewriteBundle writes a copy of bundle with edit applied to its files (SHA256SUMS left out), then SHA256SUMS
// recomputed unless edit set one: a bundle whose sums match whatever it holds, as a hostile bundle's would.
func rewriteBundle(t *testing.T, bundle string, edit func(files map[string][]byte)) string {
	t.Helper()
	files := map[string][]byte{}
	for _, e := range readTar(t, bundle) {
		if e.name != SumsFile {
			files[e.name] = e.data
		}
	}
	edit(files)
	if _, ok := files[SumsFile]; !ok {
		var sums strings.Builder
		for _, name := range slices.Sorted(mapKeys(files)) {
			sum := sha256.Sum256(files[name])
			fmt.Fprintf(&sums, "%x  %s\n", sum, name)
		}
		files[SumsFile] = []byte(sums.String())
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range slices.Sorted(mapKeys(files)) {
		if err := tw.WriteHeader(header(name, int64(len(files[name])))); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(files[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "rewritten.tar")
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func mapKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func blobPath(h v1.Hash) string { return LayoutDir + "/blobs/" + h.Algorithm + "/" + h.Hex }

// editIndex rewrites the bundle's index.json through edit.
func editIndex(t *testing.T, files map[string][]byte, edit func(*v1.IndexManifest)) {
	t.Helper()
	idx, err := v1.ParseIndexManifest(bytes.NewReader(files[LayoutDir+"/index.json"]))
	if err != nil {
		t.Fatal(err)
	}
	edit(idx)
	raw, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	files[LayoutDir+"/index.json"] = raw
}

// TestMirrorVerifiesEveryBlob: a bundle whose SHA256SUMS matches its files but whose blob content does not match
// the digest it is stored (and referenced) under fails before anything is pushed, naming the file and both
// digests; so does a descriptor whose size is not the blob's.
func TestMirrorVerifiesEveryBlob(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	nfdImage := f.seeded[nfd].(v1.Image) // listed last, so every other image would be pushed before it
	nfdManifest, _ := nfdImage.Digest()
	m, err := nfdImage.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layer := m.Layers[0].Digest
	toolkitDigest, _ := f.seeded[toolkit].Digest()

	for name, c := range map[string]struct {
		edit func(files map[string][]byte)
		want []string
	}{
		"a layer changed": {
			edit: func(files map[string][]byte) { files[blobPath(layer)][100] ^= 0xff },
			want: []string{blobPath(layer), layer.String(), "not the " + layer.String()},
		},
		"a manifest changed": {
			edit: func(files map[string][]byte) {
				files[blobPath(nfdManifest)] = append(files[blobPath(nfdManifest)], ' ')
			},
			want: []string{blobPath(nfdManifest), nfdManifest.String()},
		},
		"a size in index.json": {
			edit: func(files map[string][]byte) {
				editIndex(t, files, func(idx *v1.IndexManifest) {
					for i, d := range idx.Manifests {
						if d.Digest == toolkitDigest {
							idx.Manifests[i].Size++
						}
					}
				})
			},
			want: []string{toolkit, blobPath(toolkitDigest), "bytes"},
		},
		"a layer missing": {
			edit: func(files map[string][]byte) { delete(files, blobPath(layer)) },
			want: []string{nfd, layer.String(), "missing"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			private := startRegistry(t)
			_, err := mirror(t, rewriteBundle(t, bundle, c.edit), private)
			if err == nil {
				t.Fatal("mirrored a bundle whose blobs do not match their digests")
			}
			for _, w := range append(c.want, "nothing pushed") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q: %v", w, err)
				}
			}
			if repos := catalog(t, private); len(repos) != 0 {
				t.Errorf("a bundle failing verification pushed to %v", repos)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestMirrorRefusesToMoveATag: a tag the registry already has at another digest is not overwritten (nothing is
// pushed at all) unless Force; the error names the image, the tag and both digests. The same digest is left alone.
func TestMirrorRefusesToMoveATag(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	private := startRegistry(t)
	toolkitImg, _ := ParseImage(toolkit)
	pushTo(t, private, toolkitImg, f.seeded[toolkit])
	rhel, _ := ParseImage(driverRHEL)
	pushTo(t, private, rhel, f.seeded[toolkit]) // another image at the driver's tag
	wrong, _ := f.seeded[toolkit].Digest()
	right, _ := f.seeded[driverRHEL].Digest()

	_, err := mirror(t, bundle, private)
	want := fmt.Sprintf("image %s: %s points at %s, the bundle holds %s", driverRHEL, mustTag(t, driverRHEL, private), wrong, right)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--force") ||
		!strings.Contains(err.Error(), "nothing pushed") {
		t.Fatalf("want a refusal %q mentioning --force and that nothing was pushed, got %v", want, err)
	}
	if got := inRegistry(t, private, driverRHEL).Digest; got != wrong {
		t.Errorf("the refused tag moved to %s", got)
	}
	for _, ref := range []string{ownImage, driverUbuntu, nfd} {
		if d := mustIn(t, ref, private); d != (v1.Hash{}) {
			t.Errorf("%s was pushed (%s) although the mirror was refused", ref, d)
		}
	}
	if _, err := remote.Head(tagIn(t, private, driverUbuntu)); err == nil {
		t.Errorf("%s was pushed although the mirror was refused", driverUbuntu)
	}
	t.Logf("refused: %v", err)

	log, err := mirror(t, bundle, private, func(o *MirrorOptions) { o.Force = true })
	if err != nil {
		t.Fatalf("with Force: %v\n%s", err, log)
	}
	if got := inRegistry(t, private, driverRHEL).Digest; got != right {
		t.Errorf("with Force, the tag points at %s, want %s", got, right)
	}
	if !strings.Contains(log, ": 4 pushed, 1 already there;") || !strings.Contains(log, "replaced       "+mustTag(t, driverRHEL, private)) {
		t.Errorf("want the driver replaced, 4 pushed and the toolkit already there:\n%s", log)
	}
}

// TestMirrorBoundsWhatItReads: index.json, a manifest and SHA256SUMS beyond their size bound fail with an error
// naming the file and the bound, before anything is read into memory or pushed.
func TestMirrorBoundsWhatItReads(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	nfdDigest, _ := f.seeded[nfd].Digest()
	for name, c := range map[string]struct {
		edit func(files map[string][]byte)
		want []string
	}{
		"index.json": {
			edit: func(files map[string][]byte) {
				// Still valid JSON: a hostile bundle need not be malformed to be big.
				files[LayoutDir+"/index.json"] = append(files[LayoutDir+"/index.json"], bytes.Repeat([]byte(" "), maxManifestBytes)...)
			},
			want: []string{LayoutDir + "/index.json is ", "bytes, more than the 4194304 bytes"},
		},
		"a manifest": {
			edit: func(files map[string][]byte) {
				raw := files[blobPath(nfdDigest)]
				big := append(bytes.TrimSuffix(raw, []byte("}")), []byte(`,"annotations":{"x":"`+strings.Repeat("x", maxManifestBytes)+`"}}`)...)
				h, n, _ := v1.SHA256(bytes.NewReader(big))
				files[blobPath(h)] = big
				delete(files, blobPath(nfdDigest))
				editIndex(t, files, func(idx *v1.IndexManifest) {
					for i, d := range idx.Manifests {
						if d.Digest == nfdDigest {
							idx.Manifests[i].Digest, idx.Manifests[i].Size = h, n
						}
					}
				})
			},
			want: []string{nfd, "bytes, more than the 4194304 bytes a manifest may be"},
		},
		"SHA256SUMS": {
			edit: func(files map[string][]byte) {
				files[SumsFile] = bytes.Repeat([]byte("# a comment that sha256sum would not accept\n"), maxSumsBytes/40)
			},
			want: []string{SumsFile + " is ", "bytes, more than the 16777216 bytes"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			private := startRegistry(t)
			_, err := mirror(t, rewriteBundle(t, bundle, c.edit), private)
			if err == nil {
				t.Fatal("mirrored an oversize bundle")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q: %v", w, err)
				}
			}
			if repos := catalog(t, private); len(repos) != 0 {
				t.Errorf("an oversize bundle pushed to %v", repos)
			}
		})
	}
}

// TestMirrorPinsTheBundle: with SHA256 set, a tarball of another digest is refused before anything is read from
// it (even a file that is no tarball at all gets that error, not a parse error); the right digest, in any case and
// with or without sha256:, mirrors; a folder cannot be pinned.
func TestMirrorPinsTheBundle(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	content, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	right := fmt.Sprintf("%x", sum)
	wrongSum := sha256.Sum256(append(content, 0))
	wrong := fmt.Sprintf("%x", wrongSum)
	private := startRegistry(t)
	pin := func(s string) func(*MirrorOptions) { return func(o *MirrorOptions) { o.SHA256 = s } }

	_, err = mirror(t, bundle, private, pin(wrong))
	if want := "has SHA-256 " + right + ", not the " + wrong + " --sha256 pins"; err == nil || !strings.Contains(err.Error(), want) ||
		!strings.Contains(err.Error(), "nothing pushed") {
		t.Errorf("want %q, got %v", want, err)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.tar")
	if err := os.WriteFile(garbage, []byte("not a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := mirror(t, garbage, private, pin(right)); err == nil || !strings.Contains(err.Error(), "--sha256 pins") {
		t.Errorf("want the pin checked before the tarball is parsed, got %v", err)
	}
	if repos := catalog(t, private); len(repos) != 0 {
		t.Errorf("a bundle failing its pin pushed to %v", repos)
	}
	if _, err := mirror(t, filepath.Dir(bundle), private, pin(right)); err == nil || !strings.Contains(err.Error(), "is a folder") {
		t.Errorf("want a pinned folder refused, got %v", err)
	}
	for _, s := range []string{"sha256:" + right, strings.ToUpper(right)} {
		if log, err := mirror(t, bundle, private, pin(s)); err != nil {
			t.Errorf("--sha256 %s: %v\n%s", s, err, log)
		}
	}
	for _, s := range []string{right[:63], right + "0", "sha512:" + right, strings.Repeat("g", 64)} {
		if _, err := mirror(t, bundle, private, pin(s)); err == nil || !strings.Contains(err.Error(), "--sha256") {
			t.Errorf("--sha256 %s: want it refused, got %v", s, err)
		}
	}
}

// TestBlobChangedAfterOpening: a layer read for a push is checked again as it streams, so a bundle folder changed
// after it was verified cannot hand the registry other content under the digest.
func TestBlobChangedAfterOpening(t *testing.T) {
	f := newFixture(t, 4<<10)
	folder := t.TempDir()
	for _, e := range readTar(t, f.mustBundle(t)) {
		p := filepath.Join(folder, filepath.FromSlash(e.name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, e.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := openBundle(folder, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	m, err := f.seeded[nfd].(v1.Image).Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layer := m.Layers[0]
	lay := bundleLayout{files}
	read := func() error {
		rc, err := lay.blob(layer)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(io.Discard, rc)
		return err
	}
	if err := read(); err != nil {
		t.Fatalf("the unchanged layer: %v", err)
	}
	p := filepath.Join(folder, filepath.FromSlash(blobPath(layer.Digest)))
	content, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for name, changed := range map[string][]byte{
		"changed": append([]byte{content[0] ^ 0xff}, content[1:]...),
		"longer":  append(bytes.Clone(content), 0),
		"shorter": content[:len(content)-1],
	} {
		if err := os.WriteFile(p, changed, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := read(); err == nil || !strings.Contains(err.Error(), blobPath(layer.Digest)) {
			t.Errorf("%s: want an error naming %s, got %v", name, blobPath(layer.Digest), err)
		}
	}
}

// sparseTar is a tarball of one PAX sparse file (GNU sparse 1.0) named name that reads as realsize bytes of zeros,
// followed by a file x. Go's tar writer writes no sparse files, so the PAX header is patched in by hand.
func sparseTar(t *testing.T, name string, realsize int64) []byte {
	t.Helper()
	record := func(k, v string) string {
		s := " " + k + "=" + v + "\n"
		n := len(s) + 1
		for len(strconv.Itoa(n))+len(s) != n {
			n++
		}
		return strconv.Itoa(n) + s
	}
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") + record("GNU.sparse.name", name) +
		record("GNU.sparse.realsize", strconv.FormatInt(realsize, 10))
	sparseMap := make([]byte, 512) // the map (one empty data region) precedes the data
	copy(sparseMap, "1\n0\n0\n")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct{ name, data string }{{"PaxHeaders/x", pax}, {"GNUSparseFile.0/x", string(sparseMap)}, {"x", "x"}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg, Format: tar.FormatUSTAR}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	b[156] = tar.TypeXHeader // the first entry becomes the PAX header of the second
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// TestOpenBundleRefusesSparseEntries: a tarball entry not stored whole (a PAX sparse file: a few bytes that read
// as a terabyte of zeros) is refused at once, not hashed for hours.
func TestOpenBundleRefusesSparseEntries(t *testing.T) {
	for _, realsize := range []int64{1 << 40, 100} {
		p := filepath.Join(t.TempDir(), "sparse.tar")
		if err := os.WriteFile(p, sparseTar(t, "images/index.json", realsize), 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			b, err := openBundle(p, "", nil)
			if err == nil {
				b.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "images/index.json") || !strings.Contains(err.Error(), "sparse") {
				t.Errorf("%d bytes: want the sparse entry refused, naming it, got %v", realsize, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("still reading a %d-byte sparse entry of a 3 kB tarball after 10 s", realsize)
		}
	}
}

// TestMirrorNoticesATagSetWhileMirroring: a tag another client sets between the mirror's look-up and its push is
// not overwritten either.
func TestMirrorNoticesATagSetWhileMirroring(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	rhel, _ := ParseImage(driverRHEL)
	var private string
	var pushed atomic.Bool
	private = startRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(w, r)
			if r.Method == http.MethodHead && r.URL.Path == "/v2/nvidia/driver/manifests/595-rhel9" {
				// Right after the mirror's first look-up, someone else pushes to the tag (its own look-ups pass).
				if pushed.CompareAndSwap(false, true) {
					pushTo(t, private, rhel, f.seeded[toolkit])
				}
			}
		})
	})
	wrong, _ := f.seeded[toolkit].Digest()
	_, err := mirror(t, bundle, private)
	want := fmt.Sprintf("image %s: %s was set to %s while mirroring", driverRHEL, mustTag(t, driverRHEL, private), wrong)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("want %q, got %v", want, err)
	}
	if got := inRegistry(t, private, driverRHEL).Digest; got != wrong {
		t.Errorf("the tag set while mirroring was moved to %s", got)
	}
}

// TestMirrorRefusesADowngrade: a registry that holds this project's image at a newer release refuses an older
// bundle (signed or not, it brings back its release's flaws) before anything is pushed, unless AllowDowngrade; a
// registry holding only older releases, or a pre-release of a newer one, takes it.
func TestMirrorRefusesADowngrade(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t) // release 1.2.3
	own, _ := ParseImage(ownImage)
	releaseIn := func(reg, version string) {
		t.Helper()
		img, err := ParseImage(strings.TrimSuffix(ownImage, ":1.2.3") + ":" + version)
		if err != nil {
			t.Fatal(err)
		}
		pushTo(t, reg, img, f.seeded[toolkit])
	}

	older := startRegistry(t)
	releaseIn(older, "1.2.2")
	releaseIn(older, "2.0.0-rc.1")
	if log, err := mirror(t, bundle, older); err != nil {
		t.Fatalf("a registry holding 1.2.2 and 2.0.0-rc.1 refused release 1.2.3: %v\n%s", err, log)
	}

	newer := startRegistry(t)
	releaseIn(newer, "1.10.0")
	_, err := mirror(t, bundle, newer)
	want := fmt.Sprintf("is of release 1.2.3, older than release 1.10.0 that %s/%s already holds; nothing pushed", newer, own.Repository())
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--allow-downgrade") {
		t.Fatalf("want a refusal %q naming --allow-downgrade, got %v", want, err)
	}
	for _, ref := range []string{ownImage, driverRHEL, driverUbuntu, toolkit, nfd} {
		if _, err := remote.Head(tagIn(t, newer, ref)); err == nil {
			t.Errorf("%s was pushed although the mirror was refused", ref)
		}
	}
	log, err := mirror(t, bundle, newer, func(o *MirrorOptions) { o.AllowDowngrade = true })
	if err != nil {
		t.Fatalf("with AllowDowngrade: %v\n%s", err, log)
	}
	if !strings.Contains(log, "older than release 1.10.0") || !strings.Contains(log, ": 5 pushed, 0 already there;") {
		t.Errorf("want the downgrade named and every image pushed:\n%s", log)
	}
}
