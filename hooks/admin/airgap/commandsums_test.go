package airgap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// commandSums writes a release's checksum list of two command binaries and returns its path and bytes.
func commandSums(t *testing.T) (string, []byte) {
	t.Helper()
	var b strings.Builder
	for _, name := range []string{"kube-gpu-stack-linux-amd64", "kube-gpu-stack-linux-arm64"} {
		sum := sha256.Sum256([]byte(name))
		b.WriteString(hex.EncodeToString(sum[:]) + "  " + name + "\n")
	}
	path := filepath.Join(t.TempDir(), "SHA256SUMS")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, []byte(b.String())
}

// TestBundleCarriesTheCommandsChecksumsUnderItsSignature: --command-sums puts the release's checksums of its
// command into the bundle, listed in its SHA256SUMS and so under its signature; the mirror writes them out
// unchanged and says how to check the command; a bundle whose list was changed (sums rewritten to match) fails its
// signature with nothing pushed.
func TestBundleCarriesTheCommandsChecksumsUnderItsSignature(t *testing.T) {
	f := newFixture(t, 4<<10)
	sumsPath, sums := commandSums(t)
	bundle, _, public := signedBundle(t, f, func(o *BundleOptions) { o.CommandSums = sumsPath })
	files := map[string][]byte{}
	for _, e := range readTar(t, bundle) {
		files[e.name] = e.data
	}
	if !bytes.Equal(files[CommandSumsFile], sums) {
		t.Fatalf("the bundle's %s = %q, want the file given, unchanged", CommandSumsFile, files[CommandSumsFile])
	}
	if got := sha256.Sum256(sums); !strings.Contains(string(files[SumsFile]), hex.EncodeToString(got[:])+"  "+CommandSumsFile+"\n") {
		t.Fatalf("the bundle's %s does not list %s:\n%s", SumsFile, CommandSumsFile, files[SumsFile])
	}

	out := t.TempDir()
	log, err := mirror(t, bundle, startRegistry(t), verifyWith(public), func(o *MirrorOptions) { o.Out = out })
	if err != nil {
		t.Fatalf("mirror: %v\n%s", err, log)
	}
	if got, err := os.ReadFile(filepath.Join(out, CommandSumsFile)); err != nil || !bytes.Equal(got, sums) {
		t.Errorf("the mirror wrote %q (%v), want the bundle's %s unchanged", got, err, CommandSumsFile)
	}
	if !strings.Contains(log, "sha256sum -c") {
		t.Errorf("the mirror does not say how to check the command:\n%s", log)
	}

	changed := rewriteBundle(t, bundle, func(files map[string][]byte) {
		files[CommandSumsFile] = bytes.Replace(files[CommandSumsFile], []byte("a"), []byte("b"), 1)
	})
	private2 := startRegistry(t)
	if _, err := mirror(t, changed, private2, verifyWith(public)); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("a changed command checksum list: %v, want the signature refused", err)
	}
	if repos := catalog(t, private2); len(repos) != 0 {
		t.Errorf("a bundle with a changed command checksum list pushed to %v", repos)
	}
}

// TestBundleRefusesABadCommandChecksumList: a list that is not sha256sum's format, names a path, names a file twice,
// or is empty fails Validate, naming the flag and the line, before anything is pulled or written.
func TestBundleRefusesABadCommandChecksumList(t *testing.T) {
	f := newFixture(t, 4<<10)
	good := strings.Repeat("ab", 32)
	cases := map[string]struct{ content, want string }{
		"not hex":      {"xyz  kube-gpu-stack-linux-amd64\n", ":1: "},
		"short sum":    {"abcd  kube-gpu-stack-linux-amd64\n", "is not a SHA-256"},
		"a path":       {good + "  ../bin/kube-gpu-stack\n", "is not a plain file name"},
		"listed twice": {good + "  a\n" + good + "  a\n", ":2: a is listed twice"},
		"empty":        {"", "is empty"},
	}
	for name, tc := range cases {
		path := filepath.Join(t.TempDir(), "SHA256SUMS")
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "bundle.tar")
		o := BundleOptions{ChartDir: f.chartDir, OwnImageLayout: f.ownLayout, Upstream: f.upstream, Out: out, CommandSums: path}
		if err := o.Complete(); err != nil {
			t.Fatal(err)
		}
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "--command-sums") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want --command-sums and %q", name, err, tc.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: the bundle was written", name)
		}
	}
	// sha256sum's binary-mode marker is its own format too
	if names, err := ParseCommandSums([]byte(good+" *kube-gpu-stack-darwin-arm64\n"), "SHA256SUMS"); err != nil || len(names) != 1 || names[0] != "kube-gpu-stack-darwin-arm64" {
		t.Errorf("binary-mode line: %v %v", names, err)
	}
}
