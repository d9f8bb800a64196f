package chart

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/stackimage"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/airgaptest"
)

// TestImagePushThenInstall is the README's install-from-a-clone path: the image `image build` writes (here a small
// random multi-arch index in the same layout) pushed by `image push` into an in-process registry on 127.0.0.1, then
// the chart rendered with exactly the --set flags the push printed: every pod that runs the project's image (hooks,
// validators, driver managers) must name the pushed index (by digest; the driver manager by its pinned tag), and the
// registry must serve that index for it. A second push changes nothing.
func TestImagePushThenInstall(t *testing.T) {
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := stackimage.DefaultRepository + ":0.1.0"
	layoutDir := airgaptest.OwnImageLayout(t, idx, ref)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg := airgaptest.Registry(t) + "/mirror"
	var out strings.Builder
	o := stackimage.PushOptions{Layout: layoutDir, Registry: reg, Insecure: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out.Reset()
		if err := o.Run(context.Background(), &out); err != nil {
			t.Fatal(err)
		}
	}
	line := lineWith(out.String(), "install with: ")
	if !strings.Contains(out.String(), "pushed "+reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0@"+want.String()) || line == "" {
		t.Fatalf("push output:\n%s", out.String())
	}
	var set []string
	for _, f := range strings.Fields(strings.TrimPrefix(line, "install with: ")) {
		if f != "--set" {
			set = append(set, f)
		}
	}
	stream, err := chartrender.RenderRepo(context.Background(), []string{profileFile("container-only")}, set)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := imagelist.FromManifests(stream)
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, r := range refs {
		if !strings.Contains(r, "kube-gpu-stack/kube-gpu-stack") {
			continue
		}
		own++
		// the driver manager keeps its own pinned tag (driver.manager.image: a chart-only release must not roll the
		// driver pods), so it names the pushed tag rather than the digest; every other use pins the digest
		if r != reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0@"+want.String() && r != reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0" {
			t.Errorf("project image %s, want the pushed one", r)
			continue
		}
		d, err := remote.Head(must(name.ParseReference(r, name.Insecure)))
		if err != nil || d.Digest != want {
			t.Errorf("%s: the registry serves %v (%v), want %s", r, d, err, want)
		}
	}
	if own == 0 {
		t.Fatal("no pod runs the project's image")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
