package airgap

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// baseTransport is go-containerregistry's default transport, trusting caFile's certificates besides the
// system's when caFile is set.
func baseTransport(caFile string) (http.RoundTripper, error) {
	if caFile == "" {
		return remote.DefaultTransport, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca %s: no PEM certificate in it", caFile)
	}
	base, ok := remote.DefaultTransport.(*http.Transport)
	if !ok {
		base = http.DefaultTransport.(*http.Transport)
	}
	t := base.Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

// readCounter counts the bytes of every response body read through it: a pull's progress
// (go-containerregistry's remote.WithProgress reports pushes only).
type readCounter struct {
	base   http.RoundTripper
	onRead func(int64)
}

func (t *readCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = &countingBody{rc: resp.Body, onRead: t.onRead}
	}
	return resp, err
}

type countingBody struct {
	rc     io.ReadCloser
	onRead func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.onRead(int64(n))
	}
	return n, err
}

func (b *countingBody) Close() error { return b.rc.Close() }

// pushCounter counts what a registry accepted: finished blob uploads and manifests (201 Created), and the bytes
// sent in blob uploads. That is what "pushed" means in mirror's report, measured on the wire.
type pushCounter struct {
	base                    http.RoundTripper
	blobs, manifests, bytes atomic.Int64
}

func (t *pushCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	upload := strings.Contains(req.URL.Path, "/blobs/uploads/")
	if upload && req.Body != nil && (req.Method == http.MethodPatch || req.Method == http.MethodPut) {
		req = req.Clone(req.Context())
		req.Body = &countingBody{rc: req.Body, onRead: func(n int64) { t.bytes.Add(n) }}
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusCreated || req.Method != http.MethodPut {
		return resp, err
	}
	switch {
	case upload:
		t.blobs.Add(1)
	case strings.Contains(req.URL.Path, "/manifests/"):
		t.manifests.Add(1)
	}
	return resp, err
}

// pushed is a snapshot of the counts.
type pushed struct{ blobs, manifests, bytes int64 }

func (t *pushCounter) snapshot() pushed {
	return pushed{t.blobs.Load(), t.manifests.Load(), t.bytes.Load()}
}

func (p pushed) minus(q pushed) pushed {
	return pushed{p.blobs - q.blobs, p.manifests - q.manifests, p.bytes - q.bytes}
}

func (p pushed) String() string {
	return fmt.Sprintf("%s (%s), %s", plural(p.blobs, "blob"), humanBytes(p.bytes), plural(p.manifests, "manifest"))
}

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// Transport is the HTTP transport for a registry whose TLS certificate a private CA signed (caFile, PEM), besides
// the system's CAs; empty caFile: go-containerregistry's default. `image push` shares it.
func Transport(caFile string) (http.RoundTripper, error) { return baseTransport(caFile) }
