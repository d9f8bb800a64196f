package airgap

import (
	"archive/tar"
	"bufio"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// archiveTime is every entry's modification time, so the same content makes the same bytes.
var archiveTime = time.Unix(0, 0).UTC()

// writeArchive writes every file under dir into the tarball out: paths sorted, fixed times and owners, and
// SumsFile last, listing each file's SHA-256, computed while the file is copied (one read of each). A blob of the
// OCI layout whose content does not match its name fails the archive. With a key, SignatureFile follows SumsFile.
// The tarball appears at out only when complete; on error nothing is left there.
func writeArchive(dir, out string, key ed25519.PrivateKey) (size int64, err error) {
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return 0, err
	}
	slices.Sort(files)

	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	buf := bufio.NewWriterSize(tmp, 1<<20)
	tw := tar.NewWriter(buf)
	var sums strings.Builder
	for _, rel := range files {
		sum, err := addFile(tw, filepath.Join(dir, filepath.FromSlash(rel)), rel)
		if err != nil {
			return 0, err
		}
		if want, ok := blobDigestHex(rel); ok && want != sum {
			return 0, fmt.Errorf("%s: content has SHA-256 %s, not the digest its name says", rel, sum)
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, rel)
	}
	if err := addBytes(tw, SumsFile, []byte(sums.String())); err != nil {
		return 0, err
	}
	if key != nil {
		if err := addBytes(tw, SignatureFile, signSums(key, []byte(sums.String()))); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := buf.Flush(); err != nil {
		return 0, err
	}
	if err := tmp.Chmod(0o644); err != nil { // CreateTemp makes it private; the bundle is for sharing
		return 0, err
	}
	if err := tmp.Sync(); err != nil {
		return 0, err
	}
	if size, err = tmp.Seek(0, io.SeekCurrent); err != nil {
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	return size, os.Rename(tmp.Name(), out)
}

func header(name string, size int64) *tar.Header {
	return &tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: archiveTime, Typeflag: tar.TypeReg}
}

// addFile copies one file into the archive and returns its SHA-256.
func addFile(tw *tar.Writer, file, name string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if err := tw.WriteHeader(header(name, st.Size())); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tw, h), f); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func addBytes(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(header(name, int64(len(data)))); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// blobDigestHex returns the SHA-256 a layout blob's path names.
func blobDigestHex(rel string) (string, bool) {
	return strings.CutPrefix(rel, LayoutDir+"/blobs/sha256/")
}

// bundleFiles reads a bundle, the tarball or the folder it was unpacked into, without unpacking it: files are
// read in place (a tarball entry is a section of the file), so mirroring needs no second copy on disk.
type bundleFiles struct {
	path string
	// tarball is the open tarball; nil for a folder.
	tarball *os.File
	entries map[string]section
	// digests is each file's SHA-256 (hex) as read when the bundle was opened.
	digests map[string]string
	// key, when set, must verify SignatureFile over SumsFile.
	key ed25519.PublicKey
}

type section struct{ offset, size int64 }

// Bounds on the files mirror reads whole into memory, so a hostile bundle cannot make it read gigabytes: beyond
// them a file is an error naming it, before it is read.
const (
	// maxManifestBytes bounds index.json and every manifest and index: registries refuse bigger manifests
	// (distribution's limit is 4 MiB).
	maxManifestBytes = 4 << 20
	// maxConfigBytes bounds an image's config, a JSON document of some kilobytes.
	maxConfigBytes = 8 << 20
	// maxSumsBytes bounds SHA256SUMS: about 100,000 files.
	maxSumsBytes = 16 << 20
)

// openBundle opens a bundle and checks every file against SumsFile before anything is read from it: a missing,
// extra or corrupt file is an error naming it, and so is a layout blob whose content is not the digest it is stored
// under. pin, when set, is the SHA-256 (hex) the whole tarball must have; it is computed from the very bytes the
// scan reads (one open, one read), so the files hashed are the tarball pinned, and nothing is used before it
// matched. key, when set, must verify SignatureFile over SumsFile before the sums are trusted. Every later read of
// a file is checked again against the digest this scan took (open): a file changed since is an error, never used.
func openBundle(p, pin string, key ed25519.PublicKey) (*bundleFiles, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	if pin != "" && st.IsDir() {
		return nil, fmt.Errorf("--sha256 pins a bundle tarball, and %s is a folder: mirror the tarball itself", p)
	}
	b := &bundleFiles{path: p, entries: map[string]section{}, key: key}
	if st.IsDir() {
		b.digests, err = b.hashFolder()
	} else {
		b.digests, err = b.scanTarball(pin)
	}
	if err == nil {
		err = b.verify()
	}
	if err == nil {
		err = b.checkBlobNames()
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// pinError: the tarball read is not the one --sha256 pins.
func pinError(p, got, pin string) error {
	return fmt.Errorf("bundle %s has SHA-256 %s, not the %s --sha256 pins: it is not the bundle you meant, "+
		"or it changed on the way; nothing used from it, nothing pushed", p, got, pin)
}

func (b *bundleFiles) Close() error {
	if b.tarball == nil {
		return nil
	}
	return b.tarball.Close()
}

// countingReader knows how far into the tarball the tar reader is, so each entry's data offset is known.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// scanTarball reads the tarball once, start to end: each entry's SHA-256 and place, and with pin the SHA-256 of
// the whole file from the same bytes, which must be pin (a mismatch is the error, whatever else the scan found).
func (b *bundleFiles) scanTarball(pin string) (map[string]string, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	b.tarball = f
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	var src io.Reader = f
	whole := sha256.New()
	if pin != "" {
		src = io.TeeReader(f, whole)
	}
	cr := &countingReader{r: src}
	buf := make([]byte, 1<<20)
	sums, err := b.scanEntries(cr, st.Size(), buf)
	if pin != "" {
		// the tar reader stops at the end-of-archive blocks: the rest of the file is pinned too
		if _, cerr := io.CopyBuffer(io.Discard, cr, buf); cerr != nil && err == nil {
			err = fmt.Errorf("bundle %s: %w", b.path, cerr)
		}
		if got := hex.EncodeToString(whole.Sum(nil)); got != pin {
			return nil, pinError(b.path, got, pin)
		}
	}
	return sums, err
}

// scanEntries reads the tarball's entries from cr, hashing each.
func (b *bundleFiles) scanEntries(cr *countingReader, fileSize int64, buf []byte) (map[string]string, error) {
	tr := tar.NewReader(cr)
	sums := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("bundle %s: not a complete tarball: %w", b.path, err)
		}
		if h.Typeflag == tar.TypeDir {
			continue
		}
		name := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || !fs.ValidPath(name) {
			return nil, fmt.Errorf("bundle %s: unexpected entry %q", b.path, h.Name)
		}
		if _, dup := b.entries[name]; dup {
			// A second copy would silently replace the first one: which is meant?
			return nil, fmt.Errorf("bundle %s holds %s twice", b.path, name)
		}
		// The tar reader reads exactly the header blocks, so the data starts where it stopped.
		start := cr.n
		// A sparse entry (PAX GNU.sparse records) reads as far more than it stores: a few bytes of a hostile bundle
		// could make a terabyte of zeros to hash. Files are read in place, so each must be stored whole.
		if left := fileSize - start; h.Size > left {
			return nil, fmt.Errorf("bundle %s: not a complete tarball: %s claims %d bytes, only %d follow (cut short, or a sparse file)",
				b.path, name, h.Size, left)
		}
		sum := sha256.New()
		if _, err := io.CopyBuffer(sum, tr, buf); err != nil {
			return nil, fmt.Errorf("bundle %s: not a complete tarball: %s: %w", b.path, name, err)
		}
		if cr.n-start != h.Size {
			return nil, fmt.Errorf("bundle %s: %s is not stored whole in the tarball (a sparse file?)", b.path, name)
		}
		b.entries[name] = section{start, h.Size}
		sums[name] = hex.EncodeToString(sum.Sum(nil))
	}
	return sums, nil
}

func (b *bundleFiles) hashFolder() (map[string]string, error) {
	sums := map[string]string{}
	err := filepath.WalkDir(b.path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(b.path, p)
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			// a link could name anything on this machine: a bundle folder holds the bundle's files only
			return fmt.Errorf("bundle %s: %s is not a regular file (%s): a bundle folder holds files only, and mirror follows no link",
				b.path, filepath.ToSlash(rel), d.Type())
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		sum := sha256.New()
		n, err := io.Copy(sum, f)
		if err != nil {
			return fmt.Errorf("bundle %s: %w", p, err)
		}
		name := filepath.ToSlash(rel)
		b.entries[name] = section{0, n}
		sums[name] = hex.EncodeToString(sum.Sum(nil))
		return nil
	})
	return sums, err
}

// verify compares the files' SHA-256 with SumsFile.
func (b *bundleFiles) verify() error {
	if _, ok := b.entries[SumsFile]; !ok {
		return fmt.Errorf("bundle %s has no %s: not an air-gapped bundle, or cut short", b.path, SumsFile)
	}
	listed, err := b.readFile(SumsFile, maxSumsBytes, "")
	if err != nil {
		return err
	}
	if b.key != nil {
		if _, ok := b.entries[SignatureFile]; !ok {
			return fmt.Errorf("bundle %s is not signed (no %s) and --verify-key asks for a signature; nothing pushed", b.path, SignatureFile)
		}
		sig, err := b.readFile(SignatureFile, maxSignatureBytes, "")
		if err != nil {
			return err
		}
		if err := verifySums(b.key, listed, sig); err != nil {
			return fmt.Errorf("bundle %s: %w; nothing pushed", b.path, err)
		}
	}
	want, err := parseSums(listed)
	if err != nil {
		return fmt.Errorf("bundle %s: %s %w", b.path, SumsFile, err)
	}
	var problems []string
	for name, sum := range want {
		got, ok := b.digests[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s is listed in %s but missing", name, SumsFile))
		case got != sum:
			problems = append(problems, fmt.Sprintf("%s is corrupt: its SHA-256 is %s, %s says %s", name, got, SumsFile, sum))
		}
	}
	for name := range b.digests {
		if _, ok := want[name]; !ok && name != SumsFile && name != SignatureFile {
			problems = append(problems, fmt.Sprintf("%s is not listed in %s", name, SumsFile))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return fmt.Errorf("bundle %s failed its checksums, nothing pushed: %s", b.path, strings.Join(problems, "; "))
	}
	return nil
}

// parseSums reads SHA256SUMS as sha256sum writes it: one `HEX  NAME` (or `HEX *NAME`) a line. It returns
// name -> lower-case hex; a malformed line, or a name listed twice, is an error naming the line.
func parseSums(data []byte) (map[string]string, error) {
	want := map[string]string{}
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			sum, name, ok = strings.Cut(line, " *")
		}
		sum = strings.ToLower(sum)
		if _, err := hex.DecodeString(sum); err != nil || !ok || len(sum) != sha256.Size*2 || name == "" {
			return nil, fmt.Errorf("line %d is not `SHA256  FILE`", i+1)
		}
		if _, dup := want[name]; dup {
			return nil, fmt.Errorf("line %d lists %s a second time", i+1, name)
		}
		want[name] = sum
	}
	return want, nil
}

// checkBlobNames checks every file under the layout's blobs: it must be named by a SHA-256 digest, and its
// content must have that digest. SHA256SUMS cannot catch a blob changed together with it; this can.
func (b *bundleFiles) checkBlobNames() error {
	var problems []string
	for name, got := range b.digests {
		rest, ok := strings.CutPrefix(name, LayoutDir+"/blobs/")
		if !ok {
			continue
		}
		want, err := v1.NewHash(strings.Replace(rest, "/", ":", 1))
		switch {
		case err != nil || want.Algorithm != "sha256":
			problems = append(problems, fmt.Sprintf("%s is not named by a SHA-256 digest", name))
		case want.Hex != got:
			problems = append(problems, fmt.Sprintf("%s holds content with digest sha256:%s, not the %s its name says", name, got, want))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return fmt.Errorf("bundle %s failed verification, nothing pushed: %s", b.path, strings.Join(problems, "; "))
	}
	return nil
}

// open reads one file of the bundle, checking as it reads that it is still what the bundle's scan hashed and
// verified (its size and SHA-256): a file changed since fails the read at its end, so what is used is what was
// verified.
func (b *bundleFiles) open(name string) (io.ReadCloser, error) {
	s, ok := b.entries[name]
	if !ok {
		return nil, fmt.Errorf("bundle %s has no %s: %w", b.path, name, fs.ErrNotExist)
	}
	var rc io.ReadCloser
	if b.tarball == nil {
		p := filepath.Join(b.path, filepath.FromSlash(name))
		if st, err := os.Lstat(p); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("bundle %s: %s is no longer the regular file verified (%v)", b.path, name, err)
		}
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		rc = f
	} else {
		rc = io.NopCloser(io.NewSectionReader(b.tarball, s.offset, s.size))
	}
	want, err := v1.NewHash("sha256:" + b.digests[name])
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("bundle %s: %s was never verified", b.path, name)
	}
	return &verifyingReader{rc: rc, name: fmt.Sprintf("bundle %s: %s (changed since it was verified)", b.path, name),
		want: v1.Descriptor{Digest: want, Size: s.size}, hash: sha256.New()}, nil
}

func (b *bundleFiles) size(name string) (int64, bool) {
	s, ok := b.entries[name]
	return s.size, ok
}

// readFile reads one file of the bundle whole, refusing one over limit bytes; what names the kind of file in
// that error ("a manifest"), "" for none.
func (b *bundleFiles) readFile(name string, limit int64, what string) ([]byte, error) {
	tooBig := func(n int64) error {
		if what != "" {
			what = " " + what
		}
		return fmt.Errorf("bundle %s: %s is %d bytes, more than the %d bytes%s may be", b.path, name, n, limit, what)
	}
	if n, ok := b.size(name); ok && n > limit {
		return nil, tooBig(n)
	}
	rc, err := b.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// A folder's file can grow after it was hashed: read no more than the bound regardless.
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %s: %w", b.path, name, err)
	}
	if int64(len(data)) > limit {
		return nil, tooBig(int64(len(data)))
	}
	return data, nil
}

// topLevel lists the bundle's files at its top level (not in the layout), sorted.
func (b *bundleFiles) topLevel() []string {
	var out []string
	for name := range b.entries {
		if !strings.Contains(name, "/") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
