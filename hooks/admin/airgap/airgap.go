// Package airgap moves a release to clusters without internet access. Bundle writes one tarball holding the
// packaged chart and every image the chart can run, in one OCI image layout (a blob shared by several images is
// stored once). Mirror verifies that tarball, pushes its images into a private registry under their own repository
// paths — the layout global.imageRegistry expects — and prints the helm install line for that registry.
package airgap

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Files inside a bundle.
const (
	// SumsFile lists the SHA-256 of every other file, in sha256sum's format.
	SumsFile = "SHA256SUMS"
	// ImagesFile lists every image in the bundle with its digest.
	ImagesFile = "images.txt"
	// ValuesFile points global.imageRegistry at PlaceholderRegistry.
	ValuesFile = "values-airgap.yaml"
	// LayoutDir is the OCI image layout holding every image.
	LayoutDir = "images"
	// CommandSumsFile lists the SHA-256 of the release's kube-gpu-stack command binaries (sha256sum's format), in a
	// bundle made with them (BundleOptions.CommandSums): SumsFile and its signature cover it like every other file.
	CommandSumsFile = "kube-gpu-stack-SHA256SUMS"
)

// maxCommandSumsBytes bounds CommandSumsFile: a line per platform, with room to spare.
const maxCommandSumsBytes = 64 << 10

// ParseCommandSums checks a list of command binaries' checksums in sha256sum's format ("HEX  NAME" or "HEX *NAME",
// one a line): each a SHA-256 and a plain file name (no folder: they name a release's files), none named twice. It
// returns the names.
func ParseCommandSums(raw []byte, source string) ([]string, error) {
	if len(raw) > maxCommandSumsBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than a list of command checksums needs (%d at most)", source, len(raw), maxCommandSumsBytes)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%s is empty: want a line per command binary", source)
	}
	var names []string
	for i, line := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, " ")
		name = strings.TrimPrefix(strings.TrimPrefix(name, " "), "*")
		switch {
		case !ok || len(sum) != 64 || strings.Trim(sum, "0123456789abcdef") != "":
			return nil, fmt.Errorf("%s:%d: %q is not a SHA-256 (64 lower-case hex digits), two spaces and a file name", source, i+1, line)
		case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\"):
			return nil, fmt.Errorf("%s:%d: %q is not a plain file name", source, i+1, name)
		case slices.Contains(names, name):
			return nil, fmt.Errorf("%s:%d: %s is listed twice", source, i+1, name)
		}
		names = append(names, name)
	}
	return names, nil
}

// PlaceholderRegistry is what values-airgap.yaml sets global.imageRegistry to until the admin names the real one.
const PlaceholderRegistry = "registry.example.internal"

// OwnRepository is the repository of the project's own image (validator, driver manager, hooks).
const OwnRepository = "kube-gpu-stack/kube-gpu-stack"

// refNameAnnotation names an image in an OCI layout's index.json (the OCI image spec's
// org.opencontainers.image.ref.name); the bundle records each image's listed reference there.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Image is one entry of an image list: a reference as the chart renders it, and its digest where known.
type Image struct {
	// Ref is registry/repository:tag as listed, without the digest.
	Ref string
	// Tag is Ref parsed.
	Tag name.Tag
	// Digest pins the image; zero when the list names only the tag.
	Digest v1.Hash
}

// ParseImage reads registry/repository:tag or registry/repository:tag@sha256:…, as images.txt lists images: what an
// air-gapped copy can reproduce exactly, so the registry is named (nothing implied, such as Docker Hub) and so is
// the tag (no implied :latest).
func ParseImage(s string) (Image, error) {
	s = strings.TrimSpace(s)
	ref, digest, pinned := strings.Cut(s, "@")
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return Image{}, fmt.Errorf("image %q: want registry/repository:tag[@sha256:…]: %w", s, err)
	}
	if RegistryOf(ref) == "" {
		return Image{}, fmt.Errorf("image %q names no registry (its first path part must be a host: registry.example.com/...)", s)
	}
	img := Image{Ref: ref, Tag: tag}
	if pinned {
		if img.Digest, err = v1.NewHash(digest); err != nil {
			return Image{}, fmt.Errorf("image %q: digest: %w", s, err)
		}
	}
	return img, nil
}

// RegistryOf is the registry host a reference names explicitly, or "" when it names none. The first path part
// is a host when it has a '.' or ':' or is localhost, the rule container runtimes apply.
func RegistryOf(ref string) string {
	first, _, ok := strings.Cut(ref, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first
	}
	return ""
}

// String is the reference with its digest where known: the form the image lists use.
func (i Image) String() string {
	if i.Digest == (v1.Hash{}) {
		return i.Ref
	}
	return i.Ref + "@" + i.Digest.String()
}

// Repository is the image's path within its registry, kept when the image moves to another registry.
func (i Image) Repository() string { return i.Tag.RepositoryStr() }

// In names the image in another registry (host[:port][/path]) under the same repository path and tag: where
// global.imageRegistry makes the chart look for it.
func (i Image) In(registry string, opts ...name.Option) (name.Tag, error) {
	if registry == "" {
		return name.NewTag(i.Ref, opts...)
	}
	return name.NewTag(strings.TrimSuffix(registry, "/")+"/"+i.Repository()+":"+i.Tag.TagStr(), opts...)
}

// ReadImageList reads an image list: one reference per line, blank lines and lines starting with # ignored.
// source names the list in errors. A reference listed twice is kept once; listed with two digests, it is an error.
func ReadImageList(r io.Reader, source string) ([]Image, error) {
	var out []Image
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		img, err := ParseImage(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", source, line, err)
		}
		if i, ok := seen[img.Ref]; ok {
			if out[i].Digest != img.Digest {
				return nil, fmt.Errorf("%s:%d: %s is listed twice with different digests", source, line, img.Ref)
			}
			continue
		}
		seen[img.Ref] = len(out)
		out = append(out, img)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", source, err)
	}
	return out, nil
}

// ValidateRegistry checks a registry given as host[:port][/path].
func ValidateRegistry(flag, registry string) error {
	switch {
	case registry == "":
		return nil
	case strings.Contains(registry, "://"):
		return fmt.Errorf("%s %q: want host[:port][/path], without a scheme (see --insecure for plain HTTP)", flag, registry)
	case strings.Contains(strings.TrimSuffix(registry, "/"), "//"):
		return fmt.Errorf("%s %q: want host[:port][/path], without empty path segments", flag, registry)
	}
	if _, err := name.NewRepository(strings.TrimSuffix(registry, "/") + "/probe"); err != nil {
		return fmt.Errorf("%s %q: want host[:port][/path]: %w", flag, registry, err)
	}
	return nil
}
