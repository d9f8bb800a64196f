package airgap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// bundleLayout serves the bundle's OCI image layout as go-containerregistry images and indexes, reading blobs
// straight from the bundle (go-containerregistry's layout package needs the layout unpacked on disk).
type bundleLayout struct{ files *bundleFiles }

func blobName(h v1.Hash) string { return path.Join(LayoutDir, "blobs", h.Algorithm, h.Hex) }

// blob streams a layer or config blob, checking its size and digest as it is read: the bundle was verified when it
// was opened, but the file may have changed since, and a registry must never get content under a digest it lacks.
func (l bundleLayout) blob(desc v1.Descriptor) (io.ReadCloser, error) {
	rc, err := l.files.open(blobName(desc.Digest))
	if err != nil {
		return nil, err
	}
	return &verifyingReader{rc: rc, name: blobName(desc.Digest), want: desc, hash: sha256.New()}, nil
}

// bytes reads a manifest, index or config blob whole (up to limit bytes) and checks it against its descriptor.
func (l bundleLayout) bytes(desc v1.Descriptor, limit int64, what string) ([]byte, error) {
	name := blobName(desc.Digest)
	raw, err := l.files.readFile(name, limit, what)
	if err != nil {
		return nil, err
	}
	if got := sha256.Sum256(raw); desc.Digest.Algorithm != "sha256" || hex.EncodeToString(got[:]) != desc.Digest.Hex {
		return nil, fmt.Errorf("bundle %s: %s holds content with digest sha256:%x, not %s", l.files.path, name, got, desc.Digest)
	}
	if int64(len(raw)) != desc.Size {
		return nil, fmt.Errorf("bundle %s: %s is %d bytes, its descriptor says %d", l.files.path, name, len(raw), desc.Size)
	}
	return raw, nil
}

// index is the layout's index.json: one descriptor per image, named by the refNameAnnotation.
func (l bundleLayout) index() (*v1.IndexManifest, error) {
	raw, err := l.files.readFile(path.Join(LayoutDir, "index.json"), maxManifestBytes, "an OCI index")
	if err != nil {
		return nil, err
	}
	return v1.ParseIndexManifest(bytes.NewReader(raw))
}

func (l bundleLayout) image(desc v1.Descriptor) (v1.Image, error) {
	m, raw, err := l.manifest(desc)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&layoutImage{l: l, desc: desc, raw: raw, manifest: m})
}

func (l bundleLayout) manifest(desc v1.Descriptor) (*v1.Manifest, []byte, error) {
	raw, err := l.bytes(desc, maxManifestBytes, "a manifest")
	if err != nil {
		return nil, nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return m, raw, nil
}

func (l bundleLayout) imageIndex(desc v1.Descriptor) (v1.ImageIndex, error) {
	m, raw, err := l.indexManifest(desc)
	if err != nil {
		return nil, err
	}
	return &layoutIndex{l: l, desc: desc, raw: raw, manifest: m}, nil
}

func (l bundleLayout) indexManifest(desc v1.Descriptor) (*v1.IndexManifest, []byte, error) {
	raw, err := l.bytes(desc, maxManifestBytes, "a manifest")
	if err != nil {
		return nil, nil, err
	}
	m, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("index %s: %w", desc.Digest, err)
	}
	return m, raw, nil
}

// maxIndexDepth bounds how deeply indexes may nest (multi-arch images nest one level).
const maxIndexDepth = 4

// check walks one image of the layout, as mirror would push it, before anything is pushed: every manifest and
// index within the size bound, parsed, and matching its digest and size, every config and layer present at the
// size its descriptor says (their content was checked against their names when the bundle was opened).
// Non-distributable layers are skipped, as the push skips them.
func (l bundleLayout) check(desc v1.Descriptor) error {
	return l.checkAt(desc, 0, map[v1.Hash]bool{})
}

func (l bundleLayout) checkAt(desc v1.Descriptor, depth int, seen map[v1.Hash]bool) error {
	if seen[desc.Digest] {
		return nil
	}
	seen[desc.Digest] = true
	switch {
	case desc.MediaType.IsIndex():
		if depth >= maxIndexDepth {
			return fmt.Errorf("index %s: indexes nested more than %d deep", desc.Digest, maxIndexDepth)
		}
		m, _, err := l.indexManifest(desc)
		if err != nil {
			return err
		}
		for _, child := range m.Manifests {
			if err := l.checkAt(child, depth+1, seen); err != nil {
				return err
			}
		}
		return nil
	case desc.MediaType.IsImage():
		m, _, err := l.manifest(desc)
		if err != nil {
			return err
		}
		if _, err := l.bytes(m.Config, maxConfigBytes, "an image config"); err != nil {
			return err
		}
		for _, layer := range m.Layers {
			if !layer.MediaType.IsDistributable() {
				continue
			}
			if err := l.present(layer); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("%s: unsupported manifest type %q", desc.Digest, desc.MediaType)
	}
}

// present checks that a layer blob is in the bundle at its descriptor's size.
func (l bundleLayout) present(desc v1.Descriptor) error {
	name := blobName(desc.Digest)
	n, ok := l.files.size(name)
	switch {
	case !ok:
		return fmt.Errorf("bundle %s: layer %s is missing (no %s)", l.files.path, desc.Digest, name)
	case n != desc.Size:
		return fmt.Errorf("bundle %s: %s is %d bytes, its descriptor says %d", l.files.path, name, n, desc.Size)
	}
	return nil
}

// verifyingReader passes a blob through, and turns its end into an error when the bytes read are not the
// descriptor's size and digest.
type verifyingReader struct {
	rc   io.ReadCloser
	name string
	want v1.Descriptor
	hash hash.Hash
	n    int64
}

func (r *verifyingReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	r.n += int64(n)
	r.hash.Write(p[:n])
	if r.n > r.want.Size {
		return n, fmt.Errorf("%s is longer than the %d bytes its descriptor says", r.name, r.want.Size)
	}
	if errors.Is(err, io.EOF) {
		got := hex.EncodeToString(r.hash.Sum(nil))
		switch {
		case r.n != r.want.Size:
			return n, fmt.Errorf("%s is %d bytes, its descriptor says %d", r.name, r.n, r.want.Size)
		case r.want.Digest.Algorithm != "sha256" || got != r.want.Digest.Hex:
			return n, fmt.Errorf("%s holds content with digest sha256:%s, not %s", r.name, got, r.want.Digest)
		}
	}
	return n, err
}

func (r *verifyingReader) Close() error { return r.rc.Close() }

// layoutImage is one image manifest of the layout (go-containerregistry's partial package fills in the rest of
// v1.Image).
type layoutImage struct {
	l        bundleLayout
	desc     v1.Descriptor
	raw      []byte
	manifest *v1.Manifest
}

func (i *layoutImage) MediaType() (types.MediaType, error) {
	if i.manifest.MediaType != "" {
		return i.manifest.MediaType, nil
	}
	return i.desc.MediaType, nil
}

func (i *layoutImage) RawManifest() ([]byte, error) { return i.raw, nil }
func (i *layoutImage) RawConfigFile() ([]byte, error) {
	return i.l.bytes(i.manifest.Config, maxConfigBytes, "an image config")
}
func (i *layoutImage) Descriptor() (*v1.Descriptor, error) { d := i.desc; return &d, nil }

func (i *layoutImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.manifest.Config.Digest {
		return &layoutBlob{i.l, i.manifest.Config}, nil
	}
	for _, d := range i.manifest.Layers {
		if d.Digest == h {
			return &layoutBlob{i.l, d}, nil
		}
	}
	return nil, fmt.Errorf("manifest %s has no blob %s", i.desc.Digest, h)
}

// layoutBlob is a layer or config blob of the layout.
type layoutBlob struct {
	l    bundleLayout
	desc v1.Descriptor
}

func (b *layoutBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *layoutBlob) Compressed() (io.ReadCloser, error)  { return b.l.blob(b.desc) }
func (b *layoutBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *layoutBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
func (b *layoutBlob) Descriptor() (*v1.Descriptor, error) { d := b.desc; return &d, nil }

// layoutIndex is one image index (a multi-arch image) of the layout.
type layoutIndex struct {
	l        bundleLayout
	desc     v1.Descriptor
	raw      []byte
	manifest *v1.IndexManifest
}

func (i *layoutIndex) MediaType() (types.MediaType, error) {
	if i.manifest.MediaType != "" {
		return i.manifest.MediaType, nil
	}
	return i.desc.MediaType, nil
}

func (i *layoutIndex) Digest() (v1.Hash, error)                  { return i.desc.Digest, nil }
func (i *layoutIndex) Size() (int64, error)                      { return int64(len(i.raw)), nil }
func (i *layoutIndex) IndexManifest() (*v1.IndexManifest, error) { return i.manifest.DeepCopy(), nil }
func (i *layoutIndex) RawManifest() ([]byte, error)              { return i.raw, nil }
func (i *layoutIndex) Descriptor() (*v1.Descriptor, error)       { d := i.desc; return &d, nil }

func (i *layoutIndex) child(h v1.Hash) (v1.Descriptor, error) {
	for _, d := range i.manifest.Manifests {
		if d.Digest == h {
			return d, nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("index %s has no manifest %s", i.desc.Digest, h)
}

func (i *layoutIndex) Image(h v1.Hash) (v1.Image, error) {
	d, err := i.child(h)
	if err != nil {
		return nil, err
	}
	return i.l.image(d)
}

func (i *layoutIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) {
	d, err := i.child(h)
	if err != nil {
		return nil, err
	}
	return i.l.imageIndex(d)
}
