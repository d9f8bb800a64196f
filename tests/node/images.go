package node

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/imagebuild"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// PauseImage is the sandbox image containerd is configured with; it is built locally (tests/node/standin/pause),
// never pulled.
const PauseImage = "registry.k8s.io/pause:3.10"

// GoImage describes a one-binary image built from a main package of this module.
type GoImage struct {
	// Ref is the image's name, as pods refer to it.
	Ref string
	// Package is the main package, relative to the module root (e.g. ./tests/node/standin/pause); empty for an
	// image of binaries built elsewhere (Files).
	Package string
	// Binary is where Package's binary lies in the image; the entrypoint unless Entrypoint is set.
	Binary string
	// Entrypoint and Cmd are the image config's (default: [Binary]).
	Entrypoint, Cmd []string
	// User is the config's user (empty: root).
	User string
	// Env is the config's environment.
	Env []string
	// Links are symlinks in the image (path -> target), e.g. other entrypoint names of the same binary.
	Links map[string]string
	// Files are copied from this machine into the image (path in the image -> path here).
	Files map[string]string
	// Path are folders put first on the config's PATH (upstream's images that run their binaries by name).
	Path []string
	// Shell adds a static busybox as /bin/sh (and its applets the charts' probes and hooks use): the upstream images
	// run `sh -c` commands.
	Shell bool
}

// shellApplets are the busybox applets linked into images with Shell set.
var shellApplets = []string{"sh", "rm", "cat", "sleep", "echo", "test", "[", "ls", "mkdir", "true"}

// Build compiles the package statically for linux/amd64 (when Package is set) and packages it with Files.
func (g GoImage) Build(ctx context.Context, moduleDir string) (v1.Image, error) {
	files := map[string]tarFile{}
	if g.Package != "" {
		bin, err := g.compile(ctx, moduleDir)
		if err != nil {
			return nil, err
		}
		files[g.Binary] = tarFile{mode: 0o755, data: bin}
	}
	for p, target := range g.Links {
		files[p] = tarFile{link: target}
	}
	copies := maps.Clone(g.Files)
	if copies == nil {
		copies = map[string]string{}
	}
	if g.Shell {
		copies["/bin/busybox"] = "/bin/busybox"
		for _, a := range shellApplets {
			files["/bin/"+a] = tarFile{link: "busybox"}
		}
	}
	for p, src := range copies {
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		files[p] = tarFile{mode: 0o755, data: data}
	}
	layer, err := tarLayer(files)
	if err != nil {
		return nil, err
	}
	entry := g.Entrypoint
	if entry == nil && g.Binary != "" {
		entry = []string{g.Binary}
	}
	path := strings.Join(append(slices.Clone(g.Path), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), ":")
	if dir := filepath.Dir(g.Binary); g.Binary != "" && !strings.Contains(":"+path+":", ":"+dir+":") {
		path = dir + ":" + path
	}
	return configure(layer, v1.Config{
		Entrypoint: entry, Cmd: g.Cmd, User: g.User, WorkingDir: "/",
		Env: append([]string{"PATH=" + path}, g.Env...),
	})
}

// compile builds Package statically for linux/amd64 and returns the binary.
func (g GoImage) compile(ctx context.Context, moduleDir string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "standin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "bin")
	// a stand-in's contract check looks its row up by the reference it was built for
	ldflags := "-s -w -X github.com/kube-gpu-stack/kube-gpu-stack/tests/node/standin/contract.Image=" + g.Ref
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", out, g.Package)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build %s: %v: %s", g.Package, err, b)
	}
	return os.ReadFile(out)
}

// StandIn is the stand-in image for a third-party image: the stand-in program (package) at the image's binary
// paths, with the image's entrypoint, user and shell, all from the image's contract row.
func StandIn(ref, pkg string) (GoImage, error) {
	row, ok := contracts.Lookup(ref)
	if !ok || len(row.Binaries) == 0 {
		return GoImage{}, fmt.Errorf("no contract row with binaries for %s", ref)
	}
	g := GoImage{Ref: ref, Package: pkg, Binary: row.Binaries[0], Entrypoint: row.Entrypoint, Cmd: row.Cmd,
		Shell: row.Shell != "", Links: map[string]string{}}
	if row.User != "0" {
		g.User = row.User
	}
	for _, b := range row.Binaries[1:] {
		g.Links[b] = g.Binary
	}
	return g, nil
}

func configure(layer v1.Layer, cfg v1.Config) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	return mutate.ConfigFile(img, cf)
}

type tarFile struct {
	mode int64
	data []byte
	link string
}

// tarLayer is an uncompressed layer holding files (and their parent folders).
func tarLayer(files map[string]tarFile) (v1.Layer, error) {
	dirs := map[string]bool{}
	var names []string
	for p := range files {
		names = append(names, p)
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		names = append(names, d+"/")
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		h := &tar.Header{Name: strings.TrimPrefix(n, "/"), Mode: 0o755, Typeflag: tar.TypeDir}
		if f, ok := files[n]; ok {
			switch {
			case f.link != "":
				h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
			default:
				h.Typeflag, h.Mode, h.Size = tar.TypeReg, f.mode, int64(len(f.data))
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(files[n].data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// WriteArchive writes images as one docker-archive tarball (what `ctr images import` takes), each under its
// reference.
func WriteArchive(file string, images map[string]v1.Image) error {
	refs := map[name.Reference]v1.Image{}
	for r, img := range images {
		ref, err := name.ParseReference(r)
		if err != nil {
			return err
		}
		refs[ref] = img
	}
	return tarball.MultiRefWriteToFile(file, refs)
}

// ProjectImage builds the project's image for linux/amd64 only (the node's platform; one platform keeps the build
// short) and returns it with the reference the chart renders by default.
func ProjectImage(ctx context.Context, moduleDir string) (string, v1.Image, error) {
	o := imagebuild.Options{ModuleDir: moduleDir, Platforms: []string{"linux/amd64"}}
	if err := o.Complete(); err != nil {
		return "", nil, err
	}
	if err := o.Validate(); err != nil {
		return "", nil, err
	}
	index, err := o.Build(ctx)
	if err != nil {
		return "", nil, err
	}
	m, err := index.IndexManifest()
	if err != nil {
		return "", nil, err
	}
	if len(m.Manifests) != 1 {
		return "", nil, fmt.Errorf("project image: %d manifests, want 1", len(m.Manifests))
	}
	img, err := index.Image(m.Manifests[0].Digest)
	return o.Reference, img, err
}
