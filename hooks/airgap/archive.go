package airgap

import (
	"archive/tar"
	"bufio"
	"bytes"
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
)

// archiveTime is every entry's modification time, so the same content makes the same bytes.
var archiveTime = time.Unix(0, 0).UTC()

// writeArchive writes every file under dir into the tarball out: paths sorted, fixed times and owners, and
// SumsFile last, listing each file's SHA-256, computed while the file is copied (one read of each). A blob of the
// OCI layout whose content does not match its name fails the archive. The tarball appears at out only when
// complete; on error nothing is left there.
func writeArchive(dir, out string) (size int64, err error) {
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
}

type section struct{ offset, size int64 }

// openBundle opens a bundle and checks every file against SumsFile before anything is read from it: a missing,
// extra or corrupt file is an error naming it.
func openBundle(p string) (*bundleFiles, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	b := &bundleFiles{path: p, entries: map[string]section{}}
	var sums map[string]string
	if st.IsDir() {
		sums, err = b.hashFolder()
	} else {
		sums, err = b.scanTarball()
	}
	if err == nil {
		err = b.verify(sums)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
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

func (b *bundleFiles) scanTarball() (map[string]string, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	b.tarball = f
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	sums := map[string]string{}
	buf := make([]byte, 1<<20)
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
		// The tar reader reads exactly the header blocks, so the data starts where it stopped.
		start := cr.n
		sum := sha256.New()
		if _, err := io.CopyBuffer(sum, tr, buf); err != nil {
			return nil, fmt.Errorf("bundle %s: not a complete tarball: %s: %w", b.path, name, err)
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
func (b *bundleFiles) verify(actual map[string]string) error {
	listed, err := b.readFile(SumsFile)
	if err != nil {
		return fmt.Errorf("bundle %s has no %s: not an air-gapped bundle, or cut short", b.path, SumsFile)
	}
	want := map[string]string{}
	for i, line := range strings.Split(strings.TrimRight(string(listed), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			sum, name, ok = strings.Cut(line, " *")
		}
		if !ok || len(sum) != sha256.Size*2 {
			return fmt.Errorf("bundle %s: %s line %d is not `SHA256  FILE`", b.path, SumsFile, i+1)
		}
		want[name] = sum
	}
	var problems []string
	for name, sum := range want {
		got, ok := actual[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s is listed in %s but missing", name, SumsFile))
		case got != sum:
			problems = append(problems, fmt.Sprintf("%s is corrupt: its SHA-256 is %s, %s says %s", name, got, SumsFile, sum))
		}
	}
	for name := range actual {
		if _, ok := want[name]; !ok && name != SumsFile {
			problems = append(problems, fmt.Sprintf("%s is not listed in %s", name, SumsFile))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return fmt.Errorf("bundle %s failed its checksums, nothing pushed: %s", b.path, strings.Join(problems, "; "))
	}
	return nil
}

// open reads one file of the bundle.
func (b *bundleFiles) open(name string) (io.ReadCloser, error) {
	s, ok := b.entries[name]
	if !ok {
		return nil, fmt.Errorf("bundle %s has no %s: %w", b.path, name, fs.ErrNotExist)
	}
	if b.tarball == nil {
		return os.Open(filepath.Join(b.path, filepath.FromSlash(name)))
	}
	return io.NopCloser(io.NewSectionReader(b.tarball, s.offset, s.size)), nil
}

func (b *bundleFiles) size(name string) (int64, bool) {
	s, ok := b.entries[name]
	return s.size, ok
}

func (b *bundleFiles) readFile(name string) ([]byte, error) {
	rc, err := b.open(name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var buf bytes.Buffer
	_, err = io.Copy(&buf, rc)
	return buf.Bytes(), err
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
