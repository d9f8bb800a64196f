// Package imagebuild builds the project's own container image without Docker: the one in-cluster binary
// (hooks/cmd/in-cluster, installed as kube-gpu-stack with validator and driver-manager linked to it),
// cross-compiled as a static CGO_ENABLED=0 binary, in a scratch-like image run as a non-root user, for several
// platforms as one OCI image index, written as an OCI image layout (what the air-gapped bundle takes in).
//
// The build is reproducible: the same source gives the same index digest. Binaries are built with -trimpath,
// -buildvcs=false and -ldflags "-s -w -buildid="; tar entries are sorted with fixed owners, modes and mtimes
// (SourceDateEpoch); gzip runs with a fixed level and an empty header; the config's created time is SourceDateEpoch.
package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/cmd/incluster"
)

const (
	// DefaultRepository is where the image is published; the tag is the chart's appVersion.
	DefaultRepository = "ghcr.io/kube-gpu-stack/kube-gpu-stack"
	// SourceURL and License go into the image's OCI labels.
	SourceURL = "https://github.com/kube-gpu-stack/kube-gpu-stack"
	License   = "Apache-2.0"
	// BinDir holds the binaries; the chart calls them by bare name through PATH.
	BinDir = "/usr/local/bin"
	// NonRootID is the uid and gid the image runs as (user and group "nonroot", as in distroless images).
	NonRootID = 65532
	// RefNameAnnotation names the index in the layout's index.json.
	RefNameAnnotation = "org.opencontainers.image.ref.name"
	// ChartFile is where the version comes from when none is given.
	ChartFile = "charts/kube-gpu-stack/Chart.yaml"
)

// DefaultPlatforms are the platforms the image is built for.
var DefaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// Options configure one image build.
type Options struct {
	// ModuleDir is the root of this Go module (default ".").
	ModuleDir string
	// Version tags the image and fills its version label (default: the chart's appVersion, from ChartFile).
	Version string
	// Reference is the image's full name (default DefaultRepository:Version).
	Reference string
	// Platforms are os/arch[/variant] values (default DefaultPlatforms).
	Platforms []string
	// GoCommand builds the binaries (default "go").
	GoCommand string
	// SourceDateEpoch (seconds since 1970) is every file's mtime and the config's created time, so rebuilding the
	// same source gives the same digest; the CLI takes it from SOURCE_DATE_EPOCH.
	SourceDateEpoch int64
	// Out is the OCI image layout directory Run writes.
	Out string
	// Log receives one line per step (default io.Discard).
	Log io.Writer
}

// Complete fills defaults; the version is read from the chart when not given.
func (o *Options) Complete() error {
	if o.ModuleDir == "" {
		o.ModuleDir = "."
	}
	if o.Version == "" {
		v, err := ChartAppVersion(o.ModuleDir)
		if err != nil {
			return err
		}
		o.Version = v
	}
	if o.Reference == "" {
		o.Reference = DefaultRepository + ":" + o.Version
	}
	if len(o.Platforms) == 0 {
		o.Platforms = DefaultPlatforms
	}
	if o.GoCommand == "" {
		o.GoCommand = "go"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return nil
}

// Validate rejects options the build cannot act on, naming the setting at fault.
func (o *Options) Validate() error {
	if o.Version == "" {
		return errors.New("version: empty")
	}
	if _, err := name.NewTag(o.Reference, name.StrictValidation); err != nil {
		return fmt.Errorf("reference %q: want registry/repository:tag: %w", o.Reference, err)
	}
	if _, err := os.Stat(filepath.Join(o.ModuleDir, "go.mod")); err != nil {
		return fmt.Errorf("module dir %q: no go.mod: %w", o.ModuleDir, err)
	}
	seen := map[string]bool{}
	for _, p := range o.Platforms {
		if _, err := parsePlatform(p); err != nil {
			return err
		}
		if seen[p] {
			return fmt.Errorf("platform %q: listed twice", p)
		}
		seen[p] = true
	}
	if o.SourceDateEpoch < 0 {
		return fmt.Errorf("source date epoch %d: must not be negative", o.SourceDateEpoch)
	}
	return nil
}

// ChartAppVersion reads appVersion from the chart under moduleDir.
func ChartAppVersion(moduleDir string) (string, error) {
	path := filepath.Join(moduleDir, ChartFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the chart's appVersion: %w", err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &chart); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if chart.AppVersion == "" {
		return "", fmt.Errorf("%s: no appVersion", path)
	}
	return chart.AppVersion, nil
}

// Run builds the image, writes it to Out as an OCI image layout, and prints the index digest and each platform's
// manifest digest and compressed size.
func (o *Options) Run(ctx context.Context, out io.Writer) error {
	if o.Out == "" {
		return errors.New("out: no layout directory given")
	}
	start := time.Now()
	index, err := o.Build(ctx)
	if err != nil {
		return err
	}
	if err := o.WriteLayout(o.Out, index); err != nil {
		return err
	}
	digest, err := index.Digest()
	if err != nil {
		return err
	}
	images, err := Describe(index)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s@%s written to %s in %s\n", o.Reference, digest, o.Out, time.Since(start).Round(time.Second))
	for _, img := range images {
		fmt.Fprintf(out, "  %-14s %s  %s compressed\n", img.Platform, img.Digest, megabytes(img.CompressedSize))
	}
	return nil
}

func megabytes(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// Build cross-compiles the binary for every platform and assembles the image index.
func (o *Options) Build(ctx context.Context) (v1.ImageIndex, error) {
	work, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	mtime := time.Unix(o.SourceDateEpoch, 0).UTC()
	etc, err := etcLayer(mtime)
	if err != nil {
		return nil, err
	}
	var adds []mutate.IndexAddendum
	for _, p := range o.Platforms {
		platform, _ := parsePlatform(p) // checked by Validate
		dir := filepath.Join(work, strings.ReplaceAll(p, "/", "_"))
		fmt.Fprintf(o.Log, "building %s for %s\n", incluster.MainPackage, p)
		if err := o.goBuild(ctx, platform, filepath.Join(dir, incluster.Binary)); err != nil {
			return nil, err
		}
		bin, err := binariesLayer(filepath.Join(dir, incluster.Binary), incluster.Binary, incluster.Links, mtime)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		img, err := o.image(platform, mtime, etc, bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platform}})
	}
	return mutate.AppendManifests(empty.Index, adds...), nil
}

// image is one platform's image: the /etc layer shared by all platforms, then the binaries.
func (o *Options) image(platform *v1.Platform, created time.Time, etc, bin layerFile) (v1.Image, error) {
	cfg := &v1.ConfigFile{
		Architecture: platform.Architecture,
		OS:           platform.OS,
		Variant:      platform.Variant,
		Created:      v1.Time{Time: created},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:       fmt.Sprint(NonRootID),
			WorkingDir: "/",
			Env:        []string{"PATH=" + BinDir + ":/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Labels: map[string]string{
				"org.opencontainers.image.title":       "kube-gpu-stack",
				"org.opencontainers.image.description": "The kube-gpu-stack chart's binaries: " + strings.Join(bin.names, ", "),
				"org.opencontainers.image.version":     o.Version,
				"org.opencontainers.image.source":      SourceURL,
				"org.opencontainers.image.url":         SourceURL,
				"org.opencontainers.image.licenses":    License,
			},
		},
	}
	img, err := mutate.ConfigFile(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), cfg)
	if err != nil {
		return nil, err
	}
	var adds []mutate.Addendum
	for _, l := range []layerFile{etc, bin} {
		adds = append(adds, mutate.Addendum{
			Layer:     l.layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "kube-gpu-stack image build: " + l.what},
		})
	}
	return mutate.Append(img, adds...)
}

// WriteLayout writes index as an OCI image layout in dir, its index.json entry annotated with the reference. An
// earlier layout in dir is replaced; a directory holding anything else is refused.
func (o *Options) WriteLayout(dir string, index v1.ImageIndex) error {
	if err := clearLayout(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(index, layout.WithAnnotations(map[string]string{RefNameAnnotation: o.Reference})); err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	return nil
}

// clearLayout empties dir when it holds an OCI layout (and nothing else), so a rebuild leaves no stale blobs.
func clearLayout(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	layoutFiles := map[string]bool{"oci-layout": true, "index.json": true, "blobs": true}
	isLayout := false
	for _, e := range entries {
		if !layoutFiles[e.Name()] {
			return fmt.Errorf("out %s: holds %s, which is not part of an OCI layout; choose an empty or new directory", dir, e.Name())
		}
		isLayout = isLayout || e.Name() == "oci-layout"
	}
	if len(entries) > 0 && !isLayout {
		return fmt.Errorf("out %s: not empty and not an OCI layout (no oci-layout file)", dir)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// PlatformImage is one platform's entry in the index.
type PlatformImage struct {
	Platform string
	Digest   v1.Hash
	// CompressedSize is what a pull transfers: the config and every layer, compressed.
	CompressedSize int64
}

// Describe lists the index's images in order with their compressed sizes.
func Describe(index v1.ImageIndex) ([]PlatformImage, error) {
	m, err := index.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []PlatformImage
	for _, d := range m.Manifests {
		img, err := index.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		mf, err := img.Manifest()
		if err != nil {
			return nil, err
		}
		size := mf.Config.Size
		for _, l := range mf.Layers {
			size += l.Size
		}
		pi := PlatformImage{Digest: d.Digest, CompressedSize: size}
		if d.Platform != nil {
			pi.Platform = d.Platform.String()
		}
		out = append(out, pi)
	}
	return out, nil
}

// parsePlatform accepts linux/ARCH[/VARIANT] for the architectures Go cross-compiles to statically.
func parsePlatform(s string) (*v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] != "linux" || parts[1] == "" {
		return nil, fmt.Errorf("platform %q: want linux/ARCH[/VARIANT], e.g. linux/amd64", s)
	}
	p := &v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
		if _, err := goarchEnv(p); err != nil {
			return nil, fmt.Errorf("platform %q: %w", s, err)
		}
	}
	return p, nil
}

// goarchEnv is the environment selecting the platform's variant (GOARM for arm); other variants are refused
// rather than silently ignored.
func goarchEnv(p *v1.Platform) ([]string, error) {
	switch {
	case p.Variant == "":
		return nil, nil
	case p.Architecture == "arm" && (p.Variant == "v5" || p.Variant == "v6" || p.Variant == "v7"):
		return []string{"GOARM=" + strings.TrimPrefix(p.Variant, "v")}, nil
	case p.Architecture == "arm64" && p.Variant == "v8":
		return nil, nil
	}
	return nil, fmt.Errorf("variant %s of %s is not supported", p.Variant, p.Architecture)
}
