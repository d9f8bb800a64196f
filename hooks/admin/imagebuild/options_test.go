package imagebuild

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsDefaultsAndValidation(t *testing.T) {
	o := &Options{ModuleDir: "../../.."}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	appVersion, err := ChartAppVersion("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if o.Version != appVersion || o.Reference != DefaultRepository+":"+appVersion || o.GoCommand != "go" ||
		strings.Join(o.Platforms, ",") != "linux/amd64,linux/arm64" {
		t.Fatalf("defaults: %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		change func(*Options)
		want   string
	}{
		{func(o *Options) { o.Platforms = []string{"windows/amd64"} }, `platform "windows/amd64": want linux/ARCH`},
		{func(o *Options) { o.Platforms = []string{"linux/amd64/v3"} }, "variant v3 of amd64 is not supported"},
		{func(o *Options) { o.Platforms = []string{"linux/arm64", "linux/arm64"} }, `platform "linux/arm64": listed twice`},
		{func(o *Options) { o.Reference = "ghcr.io/kube-gpu-stack/kube-gpu-stack" }, "reference"},
		{func(o *Options) { o.ModuleDir = t.TempDir() }, "no go.mod"},
		{func(o *Options) { o.SourceDateEpoch = -1 }, "must not be negative"},
	} {
		bad := *o
		tc.change(&bad)
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", bad, err, tc.want)
		}
	}

	missing := &Options{ModuleDir: t.TempDir()}
	if err := missing.Complete(); err == nil || !strings.Contains(err.Error(), "appVersion") {
		t.Fatalf("Complete without a chart: %v", err)
	}
}

func TestLayerDigestDependsOnContentAndEpochOnly(t *testing.T) {
	entries := func() []entry {
		return []entry{
			{path: "usr/local/bin/b", mode: 0o755, data: []byte("b")},
			{path: "usr", mode: 0o755, dir: true},
			{path: "usr/local/bin/a", mode: 0o755, data: []byte("a")},
		}
	}
	digest := func(es []entry, epoch int64) string {
		l, err := gzipLayer(es, time.Unix(epoch, 0))
		if err != nil {
			t.Fatal(err)
		}
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	reversed := entries()
	reversed[0], reversed[2] = reversed[2], reversed[0]
	if a, b := digest(entries(), 0), digest(reversed, 0); a != b {
		t.Fatalf("entry order changes the digest: %s vs %s", a, b)
	}
	if a, b := digest(entries(), 0), digest(entries(), 1); a == b {
		t.Fatal("the epoch does not reach the layer")
	}
	changed := entries()
	changed[0].data = []byte("B")
	if a, b := digest(entries(), 0), digest(changed, 0); a == b {
		t.Fatal("a changed file keeps the digest")
	}
}
