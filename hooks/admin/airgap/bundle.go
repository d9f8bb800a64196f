package airgap

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// BundleOptions configure a bundle.
type BundleOptions struct {
	// ChartDir is the chart to package (charts/kube-gpu-stack of a clone); its operand subcharts go inside.
	ChartDir string
	// ImagesFile lists every image the chart can run; default <ChartDir>/images.txt.
	ImagesFile string
	// OwnImageLayout is the OCI image layout `kube-gpu-stack image build --out DIR` wrote. The project's own image
	// comes from there, never from a registry.
	OwnImageLayout string
	// OwnImage is the own image's reference in ImagesFile; default: the entry whose repository is OwnRepository.
	OwnImage string
	// Upstream, when set, replaces the registry of every image pulled (host[:port][/path]), keeping its repository
	// path: for bundling from a mirror of the upstream registries, or from a test registry. The bundle still names
	// each image by its listed reference.
	Upstream string
	// Insecure allows plain HTTP to the registries pulled from.
	Insecure bool
	// Out is the tarball to write; default <chart>-<version>-airgap.tar.
	Out string
	// Progress receives a progress bar per image while it is pulled (drawn only on a terminal); nil: none.
	Progress io.Writer
	// SigningKey is an Ed25519 private key (PEM, PKCS #8) that signs SumsFile into SignatureFile; empty: unsigned.
	SigningKey string
	// CommandSums is the release's checksums of its kube-gpu-stack command binaries (sha256sum's format). The bundle
	// carries it as CommandSumsFile, under its sums and signature, and `airgap mirror` writes it out: whoever mirrors
	// checks the command they carried in against what the bundle's signer released. Empty: none.
	CommandSums string

	images []Image
	// signingKey is SigningKey, loaded by Validate, before anything is pulled.
	signingKey ed25519.PrivateKey
	// version is the chart's version, for the files' comments.
	version string
	// commandSums is CommandSums's content, read and checked by Validate.
	commandSums []byte
}

// Complete fills the defaults that depend on the chart: the images file, the output name and the own image.
func (o *BundleOptions) Complete() error {
	if o.ChartDir == "" {
		return nil // Validate says what is missing
	}
	md, err := chartutil.LoadChartfile(filepath.Join(o.ChartDir, chartutil.ChartfileName))
	if err != nil {
		return fmt.Errorf("chart %s: %w", o.ChartDir, err)
	}
	o.version = md.Version
	if o.ImagesFile == "" {
		o.ImagesFile = filepath.Join(o.ChartDir, ImagesFile)
	}
	if o.Out == "" {
		o.Out = fmt.Sprintf("%s-%s-airgap.tar", md.Name, md.Version)
	}
	f, err := os.Open(o.ImagesFile)
	if err != nil {
		return fmt.Errorf("image list: %w", err)
	}
	defer f.Close()
	if o.images, err = ReadImageList(f, o.ImagesFile); err != nil {
		return err
	}
	if o.OwnImage == "" {
		for _, img := range o.images {
			if img.Repository() == OwnRepository {
				o.OwnImage = img.Ref
			}
		}
	}
	return nil
}

// Validate rejects options Run cannot act on.
func (o *BundleOptions) Validate() error {
	switch {
	case o.ChartDir == "":
		return errors.New("--chart: name the chart folder to bundle")
	case len(o.images) == 0:
		return fmt.Errorf("%s lists no image", o.ImagesFile)
	case o.OwnImage != "" && o.OwnImageLayout == "":
		return fmt.Errorf("the project's own image %s comes from a local build: pass --own-image-layout DIR "+
			"(the OCI layout `kube-gpu-stack image build --out DIR` writes)", o.OwnImage)
	case o.OwnImage == "" && o.OwnImageLayout != "":
		return fmt.Errorf("--own-image-layout given, but %s lists no image of repository %s (name it with --own-image)",
			o.ImagesFile, OwnRepository)
	}
	if o.OwnImage != "" {
		own, err := ParseImage(o.OwnImage)
		if err != nil {
			return fmt.Errorf("--own-image: %w", err)
		}
		if o.listed(own) < 0 {
			return fmt.Errorf("--own-image %s is not listed in %s", o.OwnImage, o.ImagesFile)
		}
	}
	if st, err := os.Stat(filepath.Dir(o.Out)); err != nil || !st.IsDir() {
		return fmt.Errorf("--out %s: its folder does not exist", o.Out)
	}
	if o.SigningKey != "" {
		key, err := LoadSigningKey(o.SigningKey)
		if err != nil {
			return fmt.Errorf("--sign-key: %w", err)
		}
		o.signingKey = key
	}
	if o.CommandSums != "" {
		raw, err := os.ReadFile(o.CommandSums)
		if err == nil {
			_, err = ParseCommandSums(raw, o.CommandSums)
		}
		if err != nil {
			return fmt.Errorf("--command-sums: %w", err)
		}
		o.commandSums = raw
	}
	return ValidateRegistry("--upstream", o.Upstream)
}

func (o *BundleOptions) listed(img Image) int {
	for i, l := range o.images {
		if l.Tag.Name() == img.Tag.Name() {
			return i
		}
	}
	return -1
}

// Run writes the bundle: the packaged chart, every listed image pulled by digest into one OCI image layout, the
// image list with digests, values-airgap.yaml, the command's checksums when given, and SHA256SUMS, as one tarball
// at Out. It prints a line per image
// and a summary; on failure nothing is left at Out.
func (o *BundleOptions) Run(ctx context.Context, out io.Writer) error {
	outDir, err := filepath.Abs(filepath.Dir(o.Out))
	if err != nil {
		return err
	}
	// Work next to the output: same file system, and the space the bundle needs anyway.
	work, err := os.MkdirTemp(outDir, ".airgap-work-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	chartFile, err := packageChart(o.ChartDir, work)
	if err != nil {
		return err
	}
	lay, err := layout.Write(filepath.Join(work, LayoutDir), empty.Index)
	if err != nil {
		return err
	}
	own, _ := ParseImage(o.OwnImage)
	resolved := make([]Image, 0, len(o.images))
	for _, img := range o.images {
		var digest v1.Hash
		if o.OwnImage != "" && img.Tag.Name() == own.Tag.Name() {
			digest, err = o.addOwnImage(lay, img)
			if err == nil {
				fmt.Fprintf(out, "from build  %s@%s\n", img.Ref, digest)
			}
		} else {
			var fetched int64
			digest, fetched, err = o.pull(ctx, lay, img)
			if err == nil {
				fmt.Fprintf(out, "pulled      %s@%s (%s fetched)\n", img.Ref, digest, humanBytes(fetched))
			}
		}
		if err != nil {
			return err
		}
		img.Digest = digest
		resolved = append(resolved, img)
	}
	if err := os.WriteFile(filepath.Join(work, ImagesFile), []byte(o.imageList(resolved)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, ValuesFile), []byte(o.airgapValues(resolved)), 0o644); err != nil {
		return err
	}
	if o.commandSums != nil {
		if err := os.WriteFile(filepath.Join(work, CommandSumsFile), o.commandSums, 0o644); err != nil {
			return err
		}
	}
	blobs, blobBytes, err := layoutBlobs(lay)
	if err != nil {
		return err
	}
	size, err := writeArchive(work, o.Out, o.signingKey)
	if err != nil {
		return fmt.Errorf("write %s: %w", o.Out, err)
	}
	fmt.Fprintf(out, "wrote %s (%s): chart %s, %d images in %d unique blobs (%s)\n",
		o.Out, humanBytes(size), chartFile, len(resolved), blobs, humanBytes(blobBytes))
	return nil
}

func (o *BundleOptions) nameOptions() []name.Option {
	if o.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

// pull resolves an image to its digest (the listed one, else the tag's) and copies it by digest into the layout,
// a multi-arch index whole. It returns the digest and the bytes fetched (blobs already in the layout are not).
func (o *BundleOptions) pull(ctx context.Context, lay layout.Path, img Image) (v1.Hash, int64, error) {
	src, err := img.In(o.Upstream, o.nameOptions()...)
	if err != nil {
		return v1.Hash{}, 0, err
	}
	fail := func(err error) (v1.Hash, int64, error) {
		if src.Name() != img.Tag.Name() {
			return v1.Hash{}, 0, fmt.Errorf("image %s (pulled from %s): %w", img.Ref, src, err)
		}
		return v1.Hash{}, 0, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	progress := newBar(o.Progress, img.Ref)
	defer progress.clear()
	var fetched atomic.Int64 // layers are fetched concurrently
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(&readCounter{base: remote.DefaultTransport, onRead: func(n int64) {
			progress.add(n)
			fetched.Add(n)
		}})}

	digest := img.Digest
	if digest == (v1.Hash{}) {
		desc, err := remote.Head(src, opts...)
		if err != nil {
			// Some registries answer HEAD poorly; GET is authoritative.
			got, gerr := remote.Get(src, opts...)
			if gerr != nil {
				return fail(gerr)
			}
			desc = &got.Descriptor
		}
		digest = desc.Digest
	}
	got, err := remote.Get(src.Context().Digest(digest.String()), opts...)
	if err != nil {
		return fail(err)
	}
	named := layout.WithAnnotations(map[string]string{refNameAnnotation: img.Ref})
	switch {
	case got.MediaType.IsIndex():
		idx, err := got.ImageIndex()
		if err == nil {
			progress.setTotal(missingBytes(lay, idx))
			err = lay.AppendIndex(idx, named)
		}
		if err != nil {
			return fail(err)
		}
	case got.MediaType.IsImage():
		im, err := got.Image()
		if err == nil {
			progress.setTotal(missingBytes(lay, im))
			err = lay.AppendImage(im, named)
		}
		if err != nil {
			return fail(err)
		}
	default:
		return fail(fmt.Errorf("unsupported manifest type %s", got.MediaType))
	}
	return digest, fetched.Load(), nil
}

// missingBytes is what copying an image or index into the layout will fetch: its blobs the layout lacks.
func missingBytes(lay layout.Path, artifact any) int64 {
	seen := map[v1.Hash]bool{}
	var total int64
	add := func(d v1.Descriptor) {
		if seen[d.Digest] {
			return
		}
		seen[d.Digest] = true
		if _, err := os.Stat(filepath.Join(string(lay), "blobs", d.Digest.Algorithm, d.Digest.Hex)); err != nil {
			total += d.Size
		}
	}
	var walk func(any)
	walk = func(a any) {
		switch a := a.(type) {
		case v1.ImageIndex:
			im, err := a.IndexManifest()
			if err != nil {
				return
			}
			for _, d := range im.Manifests {
				add(d)
				if d.MediaType.IsIndex() {
					child, err := a.ImageIndex(d.Digest)
					if err == nil {
						walk(child)
					}
				} else if d.MediaType.IsImage() {
					child, err := a.Image(d.Digest)
					if err == nil {
						walk(child)
					}
				}
			}
		case v1.Image:
			m, err := a.Manifest()
			if err != nil {
				return
			}
			add(m.Config)
			for _, l := range m.Layers {
				add(l)
			}
		}
	}
	walk(artifact)
	return total
}

// addOwnImage copies the project's own image from OwnImageLayout, where the image build named it img.
func (o *BundleOptions) addOwnImage(lay layout.Path, img Image) (v1.Hash, error) {
	src, err := layout.FromPath(o.OwnImageLayout)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("--own-image-layout %s: %w", o.OwnImageLayout, err)
	}
	idx, err := src.ImageIndex()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("--own-image-layout %s: %w", o.OwnImageLayout, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("--own-image-layout %s: %w", o.OwnImageLayout, err)
	}
	named := layout.WithAnnotations(map[string]string{refNameAnnotation: img.Ref})
	var holds []string
	for _, d := range im.Manifests {
		ref := d.Annotations[refNameAnnotation]
		holds = append(holds, ref)
		if built, err := ParseImage(ref); err != nil || built.Tag.Name() != img.Tag.Name() {
			continue
		}
		if img.Digest != (v1.Hash{}) && img.Digest != d.Digest {
			return v1.Hash{}, fmt.Errorf("%s pins %s@%s, but --own-image-layout %s holds %s: rebuild the image or update the list",
				o.ImagesFile, img.Ref, img.Digest, o.OwnImageLayout, d.Digest)
		}
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err == nil {
				err = lay.AppendIndex(child, named)
			}
			return d.Digest, wrapOwn(err, o.OwnImageLayout, img)
		case d.MediaType.IsImage():
			child, err := idx.Image(d.Digest)
			if err == nil {
				err = lay.AppendImage(child, named)
			}
			return d.Digest, wrapOwn(err, o.OwnImageLayout, img)
		}
	}
	return v1.Hash{}, fmt.Errorf("--own-image-layout %s holds no image named %s (it holds: %s); build it with "+
		"`kube-gpu-stack image build` for this chart version", o.OwnImageLayout, img.Ref, strings.Join(holds, ", "))
}

func wrapOwn(err error, dir string, img Image) error {
	if err != nil {
		return fmt.Errorf("own image %s from %s: %w", img.Ref, dir, err)
	}
	return nil
}

// layoutBlobs counts the layout's blobs and their bytes: each is stored once, however many images share it.
func layoutBlobs(lay layout.Path) (count int, size int64, err error) {
	err = filepath.WalkDir(filepath.Join(string(lay), "blobs"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			count++
			size += info.Size()
		}
		return err
	})
	return count, size, err
}

func (o *BundleOptions) imageList(images []Image) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# The images in this bundle of kube-gpu-stack %s, as the chart names them, each with its digest.\n", o.version)
	b.WriteString("# `kube-gpu-stack airgap mirror --registry REG` pushes each to REG/<repository>:<tag>.\n")
	for _, img := range images {
		b.WriteString(img.String() + "\n")
	}
	return b.String()
}

// airgapValues is values-airgap.yaml: the registry to replace, and every bundled image pinned to its digest
// (global.imageDigests, by repository:tag as the chart names it), so the install runs exactly what was bundled.
func (o *BundleOptions) airgapValues(images []Image) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# kube-gpu-stack %s without internet access: every image comes from your private registry, pinned to the
# digest bundled (global.imageDigests).
# Replace %s with that registry (host[:port][/path]) once
# `+"`kube-gpu-stack airgap mirror --registry REG BUNDLE`"+` has pushed the bundle's images there; that command also
# writes a copy of this file with REG filled in.
global:
  imageRegistry: %s
  imageDigests:
`, o.version, PlaceholderRegistry, PlaceholderRegistry)
	pins := map[string]string{}
	for _, img := range images {
		if img.Digest != (v1.Hash{}) {
			pins[img.Repository()+":"+img.Tag.TagStr()] = img.Digest.String()
		}
	}
	for _, k := range slices.Sorted(maps.Keys(pins)) {
		fmt.Fprintf(&b, "    %q: %q\n", k, pins[k])
	}
	return b.String()
}

// packageChart packages the chart with every dependency inside (as `helm package` does) into dir, and returns the
// archive's file name. Its entries get a fixed time, so the same chart makes the same bytes.
func packageChart(chartDir, dir string) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("chart %s: %w", chartDir, err)
	}
	if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
		return "", fmt.Errorf("chart %s: %w", chartDir, err)
	}
	scratch, err := os.MkdirTemp(dir, ".chart-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	saved, err := chartutil.Save(chrt, scratch)
	if err != nil {
		return "", fmt.Errorf("package chart %s: %w", chartDir, err)
	}
	base := filepath.Base(saved)
	return base, fixArchiveTimes(saved, filepath.Join(dir, base))
}

// fixArchiveTimes copies a .tgz, setting every entry's and the gzip header's time to archiveTime.
func fixArchiveTimes(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	zw := gzip.NewWriter(out)
	zw.Header = zr.Header
	zw.ModTime = archiveTime
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = archiveTime, time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return out.Close()
}
