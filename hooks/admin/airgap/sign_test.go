package airgap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// signedBundle bundles the fixture signed with a new key, after edit changes the options; it returns the bundle and
// the key pair's files.
func signedBundle(t *testing.T, f *fixture, edit ...func(*BundleOptions)) (bundle, private, public string) {
	t.Helper()
	private, public, err := GenerateKeys(filepath.Join(t.TempDir(), "release"))
	if err != nil {
		t.Fatal(err)
	}
	bundle = filepath.Join(t.TempDir(), "bundle.tar")
	o := BundleOptions{ChartDir: f.chartDir, OwnImageLayout: f.ownLayout, Upstream: f.upstream, Out: bundle, SigningKey: private}
	for _, e := range edit {
		e(&o)
	}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := o.Run(t.Context(), &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	return bundle, private, public
}

func verifyWith(key string) func(*MirrorOptions) { return func(o *MirrorOptions) { o.VerifyKey = key } }

// TestMirrorRefusesABadSignatureAndPushesNothing: with --verify-key, a bundle whose signature does not verify with
// that key is refused before anything is pushed: signed by another key, SHA256SUMS rewritten to match changed
// files (what checksums alone cannot catch), the signature dropped, or a signature that is not one.
func TestMirrorRefusesABadSignatureAndPushesNothing(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle, _, public := signedBundle(t, f)
	_, otherPublic, err := GenerateKeys(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	private := startRegistry(t)
	cases := map[string]struct {
		bundle, key, want string
	}{
		"other key": {bundle, otherPublic, "does not verify with the given key"},
		"sums rewritten": {rewriteBundle(t, bundle, func(files map[string][]byte) {
			files[ValuesFile] = append(files[ValuesFile], []byte("# changed\n")...)
		}), public, "does not verify with the given key"},
		"signature dropped": {rewriteBundle(t, bundle, func(files map[string][]byte) {
			delete(files, SignatureFile)
		}), public, "is not signed"},
		"not a signature": {rewriteBundle(t, bundle, func(files map[string][]byte) {
			files[SignatureFile] = []byte("c2lnbmVk\n")
		}), public, "is not an Ed25519 signature"},
	}
	for name, tc := range cases {
		_, err := mirror(t, tc.bundle, private, verifyWith(tc.key))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing pushed") {
			t.Errorf("%s: want %q and nothing pushed, got %v", name, tc.want, err)
		}
	}
	if repos := catalog(t, private); len(repos) != 0 {
		t.Errorf("a bundle failing its signature pushed to %v", repos)
	}
	if _, err := mirror(t, bundle, private, verifyWith(filepath.Join(t.TempDir(), "missing.pub"))); err == nil || !strings.Contains(err.Error(), "--verify-key") {
		t.Errorf("a missing key file: %v", err)
	}
}

// TestSignedBundleMirrorsAndTheUnsignedPathStays: a signed bundle mirrors with its public key, and says it checked;
// mirrored without a key it goes through as before, saying its signature was not checked; an unsigned bundle
// mirrors without a key exactly as before. A key of the wrong kind is refused by bundle before it pulls anything.
func TestSignedBundleMirrorsAndTheUnsignedPathStays(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle, private, public := signedBundle(t, f)
	log, err := mirror(t, bundle, startRegistry(t), verifyWith(public))
	if err != nil || !strings.Contains(log, SignatureFile+" verified with "+public) {
		t.Fatalf("signed bundle with its key: %v\n%s", err, log)
	}
	log, err = mirror(t, bundle, startRegistry(t))
	if err != nil || !strings.Contains(log, "its signature is not checked") {
		t.Fatalf("signed bundle without a key: %v\n%s", err, log)
	}
	log, err = mirror(t, f.mustBundle(t), startRegistry(t))
	if err != nil || strings.Contains(log, SignatureFile) {
		t.Fatalf("unsigned bundle: %v\n%s", err, log)
	}
	for _, e := range readTar(t, f.mustBundle(t)) {
		if e.name == SignatureFile {
			t.Fatal("an unsigned bundle carries a signature file")
		}
	}
	// the public key is no signing key; a second keygen to the same prefix refuses to overwrite
	o := BundleOptions{ChartDir: f.chartDir, OwnImageLayout: f.ownLayout, Upstream: f.upstream, Out: filepath.Join(t.TempDir(), "b.tar"), SigningKey: public}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--sign-key") {
		t.Errorf("a public key as signing key: %v", err)
	}
	if _, _, err := GenerateKeys(strings.TrimSuffix(private, ".key")); !os.IsExist(err) {
		t.Errorf("keygen over existing keys: %v", err)
	}
}
