package airgap

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The fuzz tests below run their seed corpora (testdata/fuzz/FuzzX) with every `go test`; `go test -fuzz FuzzX`
// searches further. They cover what mirror parses from a bundle, which may come from anyone.

// FuzzParseSums: no SHA256SUMS content panics; what parses is names mapped to lower-case SHA-256 hex, and
// writing it back as sha256sum does parses to the same.
func FuzzParseSums(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		sums, err := parseSums(data)
		if err != nil {
			if !strings.Contains(err.Error(), "line ") {
				t.Fatalf("error %q does not name the line", err)
			}
			return
		}
		var again strings.Builder
		for _, name := range slices.Sorted(maps.Keys(sums)) {
			sum := sums[name]
			if name == "" || len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "" {
				t.Fatalf("parsed %q -> %q", name, sum)
			}
			fmt.Fprintf(&again, "%s  %s\n", sum, name)
		}
		reparsed, err := parseSums([]byte(again.String()))
		if err != nil || !maps.Equal(sums, reparsed) {
			t.Fatalf("%q parsed to %v, which written back parses to %v (%v)", data, sums, reparsed, err)
		}
	})
}

// FuzzReadImageList: no images.txt content panics; every image read is a valid reference that reads back the
// same from its String(), listed once, and can be named in a mirror registry.
func FuzzReadImageList(f *testing.F) {
	f.Fuzz(func(t *testing.T, content string) {
		images, err := ReadImageList(strings.NewReader(content), "images.txt")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "images.txt:") && !strings.HasPrefix(err.Error(), "read images.txt") {
				t.Fatalf("error %q does not name the list", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, img := range images {
			if seen[img.Ref] {
				t.Fatalf("%s read twice", img.Ref)
			}
			seen[img.Ref] = true
			back, err := ParseImage(img.String())
			if err != nil || back.Ref != img.Ref || back.Digest != img.Digest {
				t.Fatalf("%q reads back as %+v (%v)", img.String(), back, err)
			}
			if _, err := img.In("mirror.example:5000/gpu"); err != nil {
				t.Fatalf("%s cannot move to a mirror: %v", img, err)
			}
		}
	})
}

// The blobs every FuzzBundleLayout bundle holds besides the fuzzed manifest, and the placeholders the fuzzed
// index.json and manifest may use to point at them (so mutations keep finding real blobs).
var (
	fuzzConfig = []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	fuzzLayer  = []byte("a layer, as far as the bundle is concerned")
	// fuzzImage is a valid image manifest of fuzzConfig and fuzzLayer, for a fuzzed index to point at.
	fuzzImage = []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%x","size":%d},`+
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%x","size":%d}]}`,
		sha256.Sum256(fuzzConfig), len(fuzzConfig), sha256.Sum256(fuzzLayer), len(fuzzLayer)))
)

func fuzzPlaceholders(manifest []byte) *strings.Replacer {
	digest := func(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }
	size := func(b []byte) string { return strconv.Itoa(len(b)) }
	pairs := []string{"@CONFIG@", digest(fuzzConfig), "@CONFIGSIZE@", size(fuzzConfig),
		"@LAYER@", digest(fuzzLayer), "@LAYERSIZE@", size(fuzzLayer), "@IMAGE@", digest(fuzzImage), "@IMAGESIZE@", size(fuzzImage)}
	if manifest != nil {
		pairs = append(pairs, "@MANIFEST@", digest(manifest), "@MANIFESTSIZE@", size(manifest))
	}
	return strings.NewReplacer(pairs...)
}

// FuzzBundleLayout: a bundle whose SHA256SUMS is right but whose index.json and manifest are anything makes
// neither mirror's verification nor its reading of images panic, and an image that passes verification can be
// read whole, every layer included, as the push reads it.
func FuzzBundleLayout(f *testing.F) {
	f.Fuzz(func(t *testing.T, index, manifest []byte) {
		manifest = []byte(fuzzPlaceholders(nil).Replace(string(manifest)))
		index = []byte(fuzzPlaceholders(manifest).Replace(string(index)))
		files := map[string][]byte{LayoutDir + "/index.json": index, LayoutDir + "/oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`)}
		for _, b := range [][]byte{fuzzConfig, fuzzLayer, fuzzImage, manifest} {
			files[fmt.Sprintf("%s/blobs/sha256/%x", LayoutDir, sha256.Sum256(b))] = b
		}
		bundle := writeFuzzBundle(t, files)
		opened, err := openBundle(bundle, "", nil)
		if err != nil {
			t.Fatalf("the bundle's files match their sums: %v", err)
		}
		defer opened.Close()
		lay := bundleLayout{opened}
		idx, err := lay.index()
		if err != nil {
			return
		}
		for _, desc := range idx.Manifests {
			if _, err := ParseImage(desc.Annotations[refNameAnnotation]); err != nil {
				continue
			}
			if err := lay.check(desc); err != nil {
				continue
			}
			if err := readWhole(lay, desc); err != nil {
				t.Fatalf("%s passed verification, but reading it as the push does fails: %v", desc.Digest, err)
			}
		}
	})
}

// readWhole reads an image or index of the layout through go-containerregistry, as remote.Write does.
func readWhole(lay bundleLayout, desc v1.Descriptor) error {
	if desc.MediaType.IsIndex() {
		idx, err := lay.imageIndex(desc)
		if err != nil {
			return err
		}
		return readIndex(idx)
	}
	img, err := lay.image(desc)
	if err != nil {
		return err
	}
	return readImage(img)
}

func readIndex(idx v1.ImageIndex) error {
	if _, err := idx.Digest(); err != nil {
		return err
	}
	if _, err := idx.MediaType(); err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, child := range im.Manifests {
		switch {
		case child.MediaType.IsIndex():
			c, err := idx.ImageIndex(child.Digest)
			if err == nil {
				err = readIndex(c)
			}
			if err != nil {
				return err
			}
		case child.MediaType.IsImage():
			c, err := idx.Image(child.Digest)
			if err == nil {
				err = readImage(c)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func readImage(img v1.Image) error {
	if _, err := img.RawConfigFile(); err != nil {
		return err
	}
	if _, err := img.Digest(); err != nil {
		return err
	}
	if _, err := img.MediaType(); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return err
		}
		if !mt.IsDistributable() {
			continue // the push skips them, and so does verification
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// writeFuzzBundle writes files and their SHA256SUMS as a bundle tarball.
func writeFuzzBundle(t *testing.T, files map[string][]byte) string {
	t.Helper()
	var sums strings.Builder
	for _, name := range slices.Sorted(maps.Keys(files)) {
		fmt.Fprintf(&sums, "%x  %s\n", sha256.Sum256(files[name]), name)
	}
	files[SumsFile] = []byte(sums.String())
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := addBytes(tw, name, files[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bundle.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// FuzzOpenBundle: no tarball content makes opening a bundle panic; a bundle that opens serves each of its files
// at the size it listed.
func FuzzOpenBundle(f *testing.F) {
	f.Fuzz(func(t *testing.T, tarball []byte) {
		p := filepath.Join(t.TempDir(), "bundle.tar")
		if err := os.WriteFile(p, tarball, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := openBundle(p, "", nil)
		if err != nil {
			return
		}
		defer b.Close()
		for name := range b.entries {
			size, _ := b.size(name)
			rc, err := b.open(name)
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n != size {
				t.Fatalf("%s: read %d bytes (%v), listed %d", name, n, err, size)
			}
		}
		b.topLevel()
	})
}
