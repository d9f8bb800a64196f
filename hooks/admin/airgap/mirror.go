package airgap

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/atomicfile"
)

// Where the printed helm install line installs the chart (the README's release name and namespace).
const (
	installRelease   = "gpu"
	installNamespace = "gpu-operator"
)

// MirrorOptions configure a mirror.
type MirrorOptions struct {
	// Bundle is the tarball `airgap bundle` wrote, or a folder it was unpacked into.
	Bundle string
	// Registry is the private registry, host[:port][/path]: each image goes to Registry/<repository>:<tag>, where
	// global.imageRegistry=Registry makes the chart look for it.
	Registry string
	// Insecure allows plain HTTP to Registry.
	Insecure bool
	// CAFile is a PEM file of certificates to trust for Registry's TLS, besides the system's.
	CAFile string
	// SHA256 pins the bundle tarball: its SHA-256 (hex, optionally prefixed sha256:), as published with the
	// release. A bundle with another is refused before anything is read from it.
	SHA256 string
	// VerifyKey is an Ed25519 public key (PEM) the bundle's SignatureFile must verify with, before anything else of
	// the bundle is trusted; a bundle without a signature is then refused. Empty: the signature, if any, is not
	// checked (the mirror says so).
	VerifyKey string
	// Force moves a tag the registry already has at another digest to the bundle's image; without it such a tag
	// fails the mirror before anything is pushed.
	Force bool
	// AllowDowngrade mirrors a bundle older than a release the registry already holds (the project's own image at a
	// newer version); without it such a bundle fails the mirror before anything is pushed: an old bundle, even one
	// signed, brings back the flaws its release had.
	AllowDowngrade bool
	// Out is the folder the chart archive is copied to for the helm install line; default ".".
	Out string
	// Progress receives a progress bar per image while it is pushed (drawn only on a terminal); nil: none.
	Progress io.Writer
}

// Complete fills defaults.
func (o *MirrorOptions) Complete() {
	o.Registry = strings.TrimSuffix(o.Registry, "/") // it ends up in global.imageRegistry
	if o.Out == "" {
		o.Out = "."
	}
	// sha256sum prints lower case; a checksum copied from elsewhere may not be.
	o.SHA256 = strings.ToLower(strings.TrimPrefix(strings.TrimSpace(o.SHA256), "sha256:"))
}

// Validate rejects options Run cannot act on.
func (o *MirrorOptions) Validate() error {
	switch {
	case o.Bundle == "":
		return errors.New("name the bundle to mirror (the tarball `kube-gpu-stack airgap bundle` wrote)")
	case o.Registry == "":
		return errors.New("--registry: name the private registry (host[:port][/path])")
	}
	if o.SHA256 != "" {
		if _, err := hex.DecodeString(o.SHA256); err != nil || len(o.SHA256) != sha256.Size*2 {
			return fmt.Errorf("--sha256 %q: want the bundle's SHA-256, 64 hex digits (as sha256sum prints it)", o.SHA256)
		}
	}
	if st, err := os.Stat(o.Out); err != nil || !st.IsDir() {
		return fmt.Errorf("--out %s: not a folder", o.Out)
	}
	return ValidateRegistry("--registry", o.Registry)
}

// planned is one image of the bundle and what the registry holds at its tag.
type planned struct {
	img  Image
	desc v1.Descriptor
	dst  name.Tag
	// current is the digest the registry's tag points at; zero when the tag does not exist.
	current v1.Hash
}

// Run verifies the whole bundle before pushing anything: the tarball against --sha256, every file against
// SHA256SUMS, every blob against its digest, and every image's manifests, configs and layers (a bundle failing any
// of these pushes nothing). It then looks up every image's tag in the registry, and refuses (pushing nothing) when
// one points at another digest, unless Force. It pushes every image the registry does not already hold at its
// tag, verifies each by digest, copies the chart archive to Out and prints the helm install line. Running it again
// pushes nothing: it reports "0 pushed", counted from what the registry accepted.
func (o *MirrorOptions) Run(ctx context.Context, out io.Writer) error {
	var key ed25519.PublicKey
	if o.VerifyKey != "" {
		k, err := LoadVerifyKey(o.VerifyKey)
		if err != nil {
			return fmt.Errorf("--verify-key: %w", err)
		}
		key = k
	}
	files, err := openBundle(o.Bundle, o.SHA256, key)
	if err != nil {
		return err
	}
	defer files.Close()
	if _, signed := files.entries[SignatureFile]; signed && key == nil {
		fmt.Fprintf(out, "bundle %s is signed (%s), but no --verify-key was given: its signature is not checked\n", o.Bundle, SignatureFile)
	} else if key != nil {
		fmt.Fprintf(out, "bundle %s: %s verified with %s\n", o.Bundle, SignatureFile, o.VerifyKey)
	}
	lay := bundleLayout{files}
	index, err := lay.index()
	if err != nil {
		return fmt.Errorf("bundle %s: %w", o.Bundle, err)
	}
	plan, err := o.plan(lay, index)
	if err != nil {
		return err
	}

	base, err := baseTransport(o.CAFile)
	if err != nil {
		return err
	}
	counter := &pushCounter{base: base}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithTransport(counter)}
	if err := o.refuseDowngrade(plan, opts, out); err != nil {
		return err
	}
	var moved []string
	for i, p := range plan {
		if plan[i].current, err = tagged(p.dst, opts); err != nil {
			return fmt.Errorf("image %s: %w", p.img.Ref, err)
		}
		if c := plan[i].current; c != (v1.Hash{}) && c != p.desc.Digest {
			moved = append(moved, fmt.Sprintf("image %s: %s points at %s, the bundle holds %s", p.img.Ref, p.dst, c, p.desc.Digest))
		}
	}
	if len(moved) > 0 && !o.Force {
		return fmt.Errorf("%s; nothing pushed: the registry's tags are left as they are (--force moves them to the bundle's images)",
			strings.Join(moved, "; "))
	}

	var pushedImages, present int
	for _, p := range plan {
		before := counter.snapshot()
		there := p.current == p.desc.Digest
		if !there && !o.Force {
			// The tag may have been set since it was looked up (another mirror, a CI job): look again.
			now, err := tagged(p.dst, opts)
			if err != nil {
				return fmt.Errorf("image %s: %w", p.img.Ref, err)
			}
			if now != p.current && now != p.desc.Digest {
				return fmt.Errorf("image %s: %s was set to %s while mirroring, the bundle holds %s; not overwritten "+
					"(--force moves it)", p.img.Ref, p.dst, now, p.desc.Digest)
			}
		}
		if !there {
			if err := o.push(lay, p.desc, p.dst, opts); err != nil {
				return fmt.Errorf("image %s: push to %s: %w", p.img.Ref, p.dst, err)
			}
		}
		if err := verifyPushed(p.dst, p.desc.Digest, opts); err != nil {
			return fmt.Errorf("image %s: %w", p.img.Ref, err)
		}
		switch {
		case there:
			present++
			fmt.Fprintf(out, "already there  %s@%s\n", p.dst, p.desc.Digest)
		case p.current != (v1.Hash{}):
			pushedImages++
			fmt.Fprintf(out, "replaced       %s@%s (the tag pointed at %s): %s\n", p.dst, p.desc.Digest, p.current, counter.snapshot().minus(before))
		default:
			pushedImages++
			fmt.Fprintf(out, "pushed         %s@%s: %s\n", p.dst, p.desc.Digest, counter.snapshot().minus(before))
		}
	}
	chartFile, err := o.copyChart(files)
	if err != nil {
		return err
	}
	valuesFile, err := o.writeValues(files)
	if err != nil {
		return err
	}
	if err := o.writeCommandSums(files, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d images in %s: %d pushed, %d already there; the registry accepted %s\n",
		len(index.Manifests), o.Registry, pushedImages, present, counter.snapshot())
	if valuesFile == "" { // a bundle without values-airgap.yaml
		fmt.Fprintf(out, "helm install %s %s --namespace %s --create-namespace --set global.imageRegistry=%s\n",
			installRelease, shellQuote(chartFile), installNamespace, o.Registry)
		return nil
	}
	fmt.Fprintf(out, "helm install %s %s --namespace %s --create-namespace -f %s\n",
		installRelease, shellQuote(chartFile), installNamespace, shellQuote(valuesFile))
	return nil
}

// plan is each image of the bundle's layout with where it goes in the registry, every one checked against the
// bundle before anything is pushed.
func (o *MirrorOptions) plan(lay bundleLayout, index *v1.IndexManifest) ([]planned, error) {
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	plan := make([]planned, 0, len(index.Manifests))
	for _, desc := range index.Manifests {
		img, err := ParseImage(desc.Annotations[refNameAnnotation])
		if err != nil {
			return nil, fmt.Errorf("bundle %s: layout entry %s: %w", o.Bundle, desc.Digest, err)
		}
		if err := lay.check(desc); err != nil {
			return nil, fmt.Errorf("image %s: %w; nothing pushed", img.Ref, err)
		}
		dst, err := img.In(o.Registry, nameOpts...)
		if err != nil {
			return nil, err
		}
		plan = append(plan, planned{img: img, desc: desc, dst: dst})
	}
	return plan, nil
}

// refuseDowngrade fails when the registry holds the project's own image at a newer version than the bundle's (a
// release mirrored before, likely installed), unless AllowDowngrade. The bundle's version is its own image's tag,
// which its signature and sums cover.
func (o *MirrorOptions) refuseDowngrade(plan []planned, opts []remote.Option, out io.Writer) error {
	i := slices.IndexFunc(plan, func(p planned) bool { return p.img.Repository() == OwnRepository })
	if i < 0 {
		return nil // a bundle of other images only: no release to compare
	}
	own := plan[i]
	bundled, err := semver.NewVersion(own.dst.TagStr())
	if err != nil {
		return nil // not a release version (a development build): nothing to compare
	}
	tags, err := remote.List(own.dst.Repository, opts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return nil // the registry holds no release yet
	}
	if err != nil {
		return fmt.Errorf("list the releases %s holds (to refuse a downgrade): %w", own.dst.Repository, err)
	}
	var newest *semver.Version
	for _, tag := range tags {
		if v, err := semver.NewVersion(tag); err == nil && v.Prerelease() == "" && (newest == nil || v.GreaterThan(newest)) {
			newest = v
		}
	}
	if newest == nil || !newest.GreaterThan(bundled) {
		return nil
	}
	if o.AllowDowngrade {
		fmt.Fprintf(out, "bundle %s is of release %s, older than release %s in %s: mirrored all the same (--allow-downgrade)\n",
			o.Bundle, bundled.Original(), newest.Original(), own.dst.Repository)
		return nil
	}
	return fmt.Errorf("bundle %s is of release %s, older than release %s that %s already holds; nothing pushed: "+
		"an old bundle brings back its release's flaws, even signed (--allow-downgrade mirrors it all the same)",
		o.Bundle, bundled.Original(), newest.Original(), own.dst.Repository)
}

// writeValues writes the bundle's values-airgap.yaml into Out with the registry filled in: global.imageRegistry
// this mirror's, and global.imageDigests pinning every bundled image. It returns its path ("" for a bundle without
// one).
func (o *MirrorOptions) writeValues(files *bundleFiles) (string, error) {
	if _, ok := files.entries[ValuesFile]; !ok {
		return "", nil
	}
	raw, err := files.readFile(ValuesFile, maxManifestBytes, "")
	if err != nil {
		return "", err
	}
	placeholder := "  imageRegistry: " + PlaceholderRegistry + "\n"
	if strings.Count(string(raw), placeholder) != 1 {
		return "", fmt.Errorf("bundle %s: %s does not set global.imageRegistry to %s once: not a bundle's values file", o.Bundle, ValuesFile, PlaceholderRegistry)
	}
	filled := strings.Replace(string(raw), placeholder, fmt.Sprintf("  imageRegistry: %q\n", o.Registry), 1)
	dst := filepath.Join(o.Out, ValuesFile)
	if err := atomicfile.Write(dst, []byte(filled), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", dst, err)
	}
	if !filepath.IsAbs(dst) && !strings.HasPrefix(dst, ".") {
		dst = "." + string(filepath.Separator) + dst
	}
	return dst, nil
}

// writeCommandSums writes the bundle's CommandSumsFile, if it has one, into Out, and says how to check the command
// against it. The bundle's sums (and signature, with VerifyKey) covered it; it is read back against them here.
func (o *MirrorOptions) writeCommandSums(files *bundleFiles, out io.Writer) error {
	if _, ok := files.entries[CommandSumsFile]; !ok {
		return nil
	}
	raw, err := files.readFile(CommandSumsFile, maxCommandSumsBytes, "")
	if err != nil {
		return err
	}
	if _, err := ParseCommandSums(raw, o.Bundle+": "+CommandSumsFile); err != nil {
		return err
	}
	dst := filepath.Join(o.Out, CommandSumsFile)
	if err := atomicfile.Write(dst, raw, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	fmt.Fprintf(out, "wrote %s, the release's checksums of its command, which the bundle's %s covers: "+
		"check the command you carried in with sha256sum -c %s --ignore-missing, where it lies\n", dst, SumsFile, shellQuote(dst))
	return nil
}

// tagged is the digest the registry's tag points at; zero when the tag does not exist.
func tagged(dst name.Tag, opts []remote.Option) (v1.Hash, error) {
	desc, err := remote.Head(dst, opts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return v1.Hash{}, nil
	}
	if err != nil {
		return v1.Hash{}, fmt.Errorf("look up %s: %w", dst, err)
	}
	return desc.Digest, nil
}

// push writes one image or multi-arch index (whole) to dst; go-containerregistry skips the blobs and child
// manifests the repository already has.
func (o *MirrorOptions) push(lay bundleLayout, desc v1.Descriptor, dst name.Tag, opts []remote.Option) error {
	var write func(opts []remote.Option) error
	switch {
	case desc.MediaType.IsIndex():
		idx, err := lay.imageIndex(desc)
		if err != nil {
			return err
		}
		write = func(opts []remote.Option) error { return remote.WriteIndex(dst, idx, opts...) }
	case desc.MediaType.IsImage():
		img, err := lay.image(desc)
		if err != nil {
			return err
		}
		write = func(opts []remote.Option) error { return remote.Write(dst, img, opts...) }
	default:
		return fmt.Errorf("unsupported manifest type %s", desc.MediaType)
	}
	progress := newBar(o.Progress, dst.String())
	defer progress.clear()
	updates := make(chan v1.Update, 64)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for u := range updates {
			progress.update(u)
		}
	}()
	err := write(append(slices.Clone(opts), remote.WithProgress(updates))) // closes updates when done
	<-drained
	return err
}

// verifyPushed checks the registry serves the manifest by its digest (go-containerregistry checks the bytes
// against the digest), every child manifest of an index, and the tag pointing at that digest.
func verifyPushed(dst name.Tag, digest v1.Hash, opts []remote.Option) error {
	byDigest := dst.Context().Digest(digest.String())
	got, err := remote.Get(byDigest, opts...)
	if err != nil {
		return fmt.Errorf("%s does not serve %s after the push: %w", dst.Context(), digest, err)
	}
	if got.Digest != digest {
		return fmt.Errorf("%s serves %s for %s", dst.Context(), got.Digest, byDigest)
	}
	if got.MediaType.IsIndex() {
		idx, err := got.ImageIndex()
		if err != nil {
			return err
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return err
		}
		for _, child := range im.Manifests {
			if _, err := remote.Head(dst.Context().Digest(child.Digest.String()), opts...); err != nil {
				return fmt.Errorf("%s lacks %s of index %s after the push: %w", dst.Context(), child.Digest, digest, err)
			}
		}
	}
	tagged, err := remote.Head(dst, opts...)
	if err != nil {
		return fmt.Errorf("%s after the push: %w", dst, err)
	}
	if tagged.Digest != digest {
		return fmt.Errorf("%s points at %s after the push, want %s", dst, tagged.Digest, digest)
	}
	return nil
}

// copyChart copies the bundle's chart archive into Out and returns its path for the helm install line.
func (o *MirrorOptions) copyChart(files *bundleFiles) (string, error) {
	var charts []string
	for _, f := range files.topLevel() {
		if strings.HasSuffix(f, ".tgz") {
			charts = append(charts, f)
		}
	}
	if len(charts) != 1 {
		return "", fmt.Errorf("bundle %s: want one chart archive (.tgz), found %d", o.Bundle, len(charts))
	}
	src, err := files.open(charts[0])
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst := filepath.Join(o.Out, charts[0])
	tmp, err := os.CreateTemp(o.Out, "."+charts[0]+".partial-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy the chart to %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	if !filepath.IsAbs(dst) && !strings.HasPrefix(dst, ".") {
		dst = "." + string(filepath.Separator) + dst // a local path to helm, not a repo/chart name
	}
	return dst, nil
}

// shellQuote quotes a path for a copy-pasted command line when it needs it.
func shellQuote(s string) string {
	if !strings.ContainsAny(s, " \t'\"$`\\;&|<>()*?[]#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
