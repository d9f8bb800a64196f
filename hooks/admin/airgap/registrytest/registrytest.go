// Package registrytest is the registry side of the air-gap tests, shared by the airgap package's own tests and the
// cluster suites' (tests/internal/airgaptest): an in-process registry, images pushed into it, and the OCI layout
// the image build writes. It does not import airgap, so that package's own tests can use it.
package registrytest

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry starts an in-process registry on 127.0.0.1 for the test, its handler wrapped by wrap (first innermost),
// and returns its host:port.
func Registry(t testing.TB, wrap ...func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	for _, w := range wrap {
		h = w(h)
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// Push writes an image or an image index (a v1.Image or a v1.ImageIndex) to dst.
func Push(t testing.TB, dst name.Reference, a any) {
	t.Helper()
	var err error
	switch a := a.(type) {
	case v1.ImageIndex:
		err = remote.WriteIndex(dst, a)
	case v1.Image:
		err = remote.Write(dst, a)
	default:
		t.Fatalf("push %s: %T is no image or index", dst, a)
	}
	if err != nil {
		t.Fatalf("seed %s: %v", dst, err)
	}
}

// OwnImageLayout writes an OCI layout the way the image build does: the multi-arch index named by ref.
func OwnImageLayout(t testing.TB, idx v1.ImageIndex, ref string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "own-image")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		t.Fatal(err)
	}
	return dir
}
