package airgap

import (
	"bytes"
	"fmt"
	"io"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// bundleLayout serves the bundle's OCI image layout as go-containerregistry images and indexes, reading blobs
// straight from the bundle (go-containerregistry's layout package needs the layout unpacked on disk).
type bundleLayout struct{ files *bundleFiles }

func (l bundleLayout) blob(h v1.Hash) (io.ReadCloser, error) {
	return l.files.open(path.Join(LayoutDir, "blobs", h.Algorithm, h.Hex))
}

func (l bundleLayout) bytes(h v1.Hash) ([]byte, error) {
	return l.files.readFile(path.Join(LayoutDir, "blobs", h.Algorithm, h.Hex))
}

// index is the layout's index.json: one descriptor per image, named by the refNameAnnotation.
func (l bundleLayout) index() (*v1.IndexManifest, error) {
	raw, err := l.files.readFile(path.Join(LayoutDir, "index.json"))
	if err != nil {
		return nil, err
	}
	return v1.ParseIndexManifest(bytes.NewReader(raw))
}

func (l bundleLayout) image(desc v1.Descriptor) (v1.Image, error) {
	raw, err := l.bytes(desc.Digest)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return partial.CompressedToImage(&layoutImage{l: l, desc: desc, raw: raw, manifest: m})
}

func (l bundleLayout) imageIndex(desc v1.Descriptor) (v1.ImageIndex, error) {
	raw, err := l.bytes(desc.Digest)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", desc.Digest, err)
	}
	return &layoutIndex{l: l, desc: desc, raw: raw, manifest: m}, nil
}

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

func (i *layoutImage) RawManifest() ([]byte, error)        { return i.raw, nil }
func (i *layoutImage) RawConfigFile() ([]byte, error)      { return i.l.bytes(i.manifest.Config.Digest) }
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
func (b *layoutBlob) Compressed() (io.ReadCloser, error)  { return b.l.blob(b.desc.Digest) }
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
