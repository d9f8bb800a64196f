package airgap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
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
}

// Validate rejects options Run cannot act on.
func (o *MirrorOptions) Validate() error {
	switch {
	case o.Bundle == "":
		return errors.New("name the bundle to mirror (the tarball `kube-gpu-stack airgap bundle` wrote)")
	case o.Registry == "":
		return errors.New("--registry: name the private registry (host[:port][/path])")
	}
	if st, err := os.Stat(o.Out); err != nil || !st.IsDir() {
		return fmt.Errorf("--out %s: not a folder", o.Out)
	}
	return ValidateRegistry("--registry", o.Registry)
}

// Run checks the bundle against its SHA256SUMS (a corrupt bundle pushes nothing), pushes every image the registry
// does not already hold at its tag, verifies each by digest, copies the chart archive to Out and prints the helm
// install line. Running it again pushes nothing: it reports "0 pushed", counted from what the registry accepted.
func (o *MirrorOptions) Run(ctx context.Context, out io.Writer) error {
	files, err := openBundle(o.Bundle)
	if err != nil {
		return err
	}
	defer files.Close()
	lay := bundleLayout{files}
	index, err := lay.index()
	if err != nil {
		return fmt.Errorf("bundle %s: %w", o.Bundle, err)
	}
	base, err := baseTransport(o.CAFile)
	if err != nil {
		return err
	}
	counter := &pushCounter{base: base}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithTransport(counter)}
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}

	var pushedImages, present int
	for _, desc := range index.Manifests {
		img, err := ParseImage(desc.Annotations[refNameAnnotation])
		if err != nil {
			return fmt.Errorf("bundle %s: layout entry %s: %w", o.Bundle, desc.Digest, err)
		}
		dst, err := img.In(o.Registry, nameOpts...)
		if err != nil {
			return err
		}
		before := counter.snapshot()
		there, err := holds(dst, desc.Digest, opts)
		if err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		if !there {
			if err := o.push(lay, desc, dst, opts); err != nil {
				return fmt.Errorf("image %s: push to %s: %w", img.Ref, dst, err)
			}
		}
		if err := verifyPushed(dst, desc.Digest, opts); err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		if there {
			present++
			fmt.Fprintf(out, "already there  %s@%s\n", dst, desc.Digest)
		} else {
			pushedImages++
			fmt.Fprintf(out, "pushed         %s@%s: %s\n", dst, desc.Digest, counter.snapshot().minus(before))
		}
	}
	chartFile, err := o.copyChart(files)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d images in %s: %d pushed, %d already there; the registry accepted %s\n",
		len(index.Manifests), o.Registry, pushedImages, present, counter.snapshot())
	fmt.Fprintf(out, "helm install %s %s --namespace %s --create-namespace --set global.imageRegistry=%s\n",
		installRelease, shellQuote(chartFile), installNamespace, o.Registry)
	return nil
}

// holds says whether the registry already serves the image at its tag with the bundle's digest.
func holds(dst name.Tag, digest v1.Hash, opts []remote.Option) (bool, error) {
	desc, err := remote.Head(dst, opts...)
	var terr *transport.Error
	if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %s: %w", dst, err)
	}
	return desc.Digest == digest, nil
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
