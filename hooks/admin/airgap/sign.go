package airgap

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
)

// SignatureFile is the detached Ed25519 signature of SumsFile, base64 on one line. SumsFile names every other file
// of the bundle with its SHA-256, so a good signature vouches for all of them; the signature itself is the one file
// SumsFile cannot list.
const SignatureFile = SumsFile + ".sig"

// maxSignatureBytes bounds SignatureFile: base64 of 64 bytes and a newline, with room for whitespace.
const maxSignatureBytes = 1 << 10

// LoadSigningKey reads an Ed25519 private key in PEM (PKCS #8, "PRIVATE KEY": what `openssl genpkey -algorithm
// ed25519` and `airgap keygen` write).
func LoadSigningKey(path string) (ed25519.PrivateKey, error) {
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	ed, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s: a %T, not an Ed25519 key (openssl genpkey -algorithm ed25519)", path, key)
	}
	return ed, nil
}

// LoadVerifyKey reads an Ed25519 public key in PEM (PKIX, "PUBLIC KEY": what `openssl pkey -pubout` and `airgap
// keygen` write).
func LoadVerifyKey(path string) (ed25519.PublicKey, error) {
	der, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("verify key %s: %w", path, err)
	}
	ed, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("verify key %s: a %T, not an Ed25519 key", path, key)
	}
	return ed, nil
}

func readPEM(path, blockType string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != blockType {
		return nil, fmt.Errorf("%s: not a PEM %q block", path, blockType)
	}
	return block.Bytes, nil
}

// GenerateKeys writes a new Ed25519 key pair: prefix.key (PKCS #8, readable by its owner only) and prefix.pub
// (PKIX). It refuses to overwrite either file.
func GenerateKeys(prefix string) (private, public string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", "", err
	}
	private, public = prefix+".key", prefix+".pub"
	for _, f := range []struct {
		path string
		mode os.FileMode
		typ  string
		der  []byte
	}{{private, 0o600, "PRIVATE KEY", privDER}, {public, 0o644, "PUBLIC KEY", pubDER}} {
		file, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.mode)
		if err != nil {
			return "", "", err
		}
		if err := errors.Join(pem.Encode(file, &pem.Block{Type: f.typ, Bytes: f.der}), file.Close()); err != nil {
			return "", "", err
		}
	}
	return private, public, nil
}

// signSums returns SignatureFile's content for sums.
func signSums(key ed25519.PrivateKey, sums []byte) []byte {
	return []byte(base64.StdEncoding.EncodeToString(ed25519.Sign(key, sums)) + "\n")
}

// verifySums checks SignatureFile's content against sums with key.
func verifySums(key ed25519.PublicKey, sums, sig []byte) error {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sig)))
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("%s is not an Ed25519 signature (base64 of %d bytes)", SignatureFile, ed25519.SignatureSize)
	}
	if !ed25519.Verify(key, sums, raw) {
		return fmt.Errorf("%s does not verify with the given key: the bundle was not signed by it, or %s changed since", SignatureFile, SumsFile)
	}
	return nil
}
