package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap"
)

// PushOptions configure pushing the image `image build` wrote to a registry of the user's.
type PushOptions struct {
	// Layout is the OCI layout `image build --out` wrote (one image index, named by RefNameAnnotation).
	Layout string
	// Registry is host[:port][/path]; the image goes to Registry/<repository>:<tag> of its reference, which is
	// where global.stackImage.registry=Registry makes the chart look.
	Registry string
	// Insecure allows plain HTTP; CAFile trusts a private CA (PEM) besides the system's.
	Insecure bool
	CAFile   string
}

// Validate rejects options Run cannot act on.
func (o *PushOptions) Validate() error {
	if o.Layout == "" {
		return errors.New("--layout: name the OCI layout `kube-gpu-stack image build --out DIR` wrote")
	}
	return airgap.ValidateRegistry("--registry", strings.TrimSuffix(o.Registry, "/"))
}

// Run pushes the layout's image index (every platform) under its repository and tag into Registry, checks that the
// registry serves it at the same digest, and prints the values that make the chart pull it, pinned by digest.
// Pushing again is harmless: the registry already holds every blob.
func (o *PushOptions) Run(ctx context.Context, out io.Writer) error {
	registry := strings.TrimSuffix(o.Registry, "/")
	p, err := layout.FromPath(o.Layout)
	if err != nil {
		return fmt.Errorf("--layout %s: not an OCI layout: %w", o.Layout, err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		return fmt.Errorf("--layout %s: %w", o.Layout, err)
	}
	manifest, err := root.IndexManifest()
	if err != nil {
		return fmt.Errorf("--layout %s: %w", o.Layout, err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations[RefNameAnnotation] == "" {
		return fmt.Errorf("--layout %s: want the one image `image build` writes, named by %s; found %d entries", o.Layout, RefNameAnnotation, len(manifest.Manifests))
	}
	desc := manifest.Manifests[0]
	src, err := name.NewTag(desc.Annotations[RefNameAnnotation])
	if err != nil {
		return fmt.Errorf("--layout %s: image name: %w", o.Layout, err)
	}
	index, err := root.ImageIndex(desc.Digest)
	if err != nil {
		return fmt.Errorf("--layout %s: %s is not an image index: %w", o.Layout, desc.Digest, err)
	}
	var nameOpts []name.Option
	if o.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	dst, err := name.NewTag(registry+"/"+src.RepositoryStr()+":"+src.TagStr(), nameOpts...)
	if err != nil {
		return err
	}
	transport, err := airgap.Transport(o.CAFile)
	if err != nil {
		return err
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithTransport(transport)}
	if err := remote.WriteIndex(dst, index, opts...); err != nil {
		return fmt.Errorf("push %s: %w", dst, err)
	}
	got, err := remote.Head(dst, opts...)
	if err != nil {
		return fmt.Errorf("check %s: %w", dst, err)
	}
	if got.Digest != desc.Digest {
		return fmt.Errorf("%s: the registry serves %s, not the pushed %s", dst, got.Digest, desc.Digest)
	}
	fmt.Fprintf(out, "pushed %s@%s\n", dst, desc.Digest)
	fmt.Fprintf(out, "install with: --set global.stackImage.registry=%s --set global.stackImage.repository=%s --set global.stackImage.tag=%s --set global.stackImage.digest=%s\n",
		registry, src.RepositoryStr(), src.TagStr(), desc.Digest)
	return nil
}
