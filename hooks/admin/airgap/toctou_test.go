package airgap

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTarballChangedAfterVerificationIsNotUsed: the tarball changed in place (same file) after it was opened and
// verified: index.json and the chart are checked again as they are read, so the changed bytes are never used and no
// chart is copied out.
func TestTarballChangedAfterVerificationIsNotUsed(t *testing.T) {
	f := newFixture(t, 4<<10)
	bundle := f.mustBundle(t)
	files, err := openBundle(bundle, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	var chart string
	for _, name := range files.topLevel() {
		if strings.HasSuffix(name, ".tgz") {
			chart = name
		}
	}
	index := path.Join(LayoutDir, "index.json")
	if _, err := (bundleLayout{files}).index(); err != nil {
		t.Fatalf("the unchanged index: %v", err)
	}
	flip := func(name string) {
		t.Helper()
		s := files.entries[name]
		w, err := os.OpenFile(bundle, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		b := make([]byte, 1)
		if _, err := w.ReadAt(b, s.offset+s.size/2); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := w.WriteAt(b, s.offset+s.size/2); err != nil {
			t.Fatal(err)
		}
	}
	flip(index)
	if _, err := (bundleLayout{files}).index(); err == nil || !strings.Contains(err.Error(), index+" (changed since it was verified)") {
		t.Errorf("changed index.json: want an error naming it, got %v", err)
	}
	flip(chart)
	out := t.TempDir()
	o := MirrorOptions{Bundle: bundle, Out: out}
	if _, err := o.copyChart(files); err == nil || !strings.Contains(err.Error(), chart+" (changed since it was verified)") {
		t.Errorf("changed chart: want an error naming it, got %v", err)
	}
	if left, _ := os.ReadDir(out); len(left) != 0 {
		t.Errorf("a chart that changed after verification was copied out: %v", left)
	}
}

// TestFolderBundleFollowsNoLink: a bundle folder holding a symbolic link (to a file anywhere on the machine) is
// refused, naming it, before anything is read through it.
func TestFolderBundleFollowsNoLink(t *testing.T) {
	f := newFixture(t, 4<<10)
	folder := t.TempDir()
	var chart string
	for _, e := range readTar(t, f.mustBundle(t)) {
		p := filepath.Join(folder, filepath.FromSlash(e.name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.name, ".tgz") {
			chart = e.name
			elsewhere := filepath.Join(t.TempDir(), "chart.tgz")
			if err := os.WriteFile(elsewhere, e.data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, e.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := openBundle(folder, "", nil); err == nil || !strings.Contains(err.Error(), chart+" is not a regular file") {
		t.Fatalf("want the link refused naming %s, got %v", chart, err)
	}
}

// TestPinIsTheBytesScanned: --sha256 is computed from the same read as the files' sums, not from an earlier open of
// the file. A named pipe can be read once: the bundle is written into one, and the pin still matches (a second
// open would find nothing to read, and block).
func TestPinIsTheBytesScanned(t *testing.T) {
	f := newFixture(t, 4<<10)
	content, err := os.ReadFile(f.mustBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	pin := fmt.Sprintf("%x", sha256.Sum256(content))
	for _, c := range []struct {
		name, pin string
		pinErr    bool
	}{{"right pin", pin, false}, {"wrong pin", fmt.Sprintf("%x", sha256.Sum256(nil)), true}} {
		t.Run(c.name, func(t *testing.T) {
			fifo := filepath.Join(t.TempDir(), "bundle.tar")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Skipf("no named pipes here: %v", err)
			}
			go func() {
				w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err != nil {
					return
				}
				defer w.Close()
				_, _ = w.Write(content)
			}()
			done := make(chan error, 1)
			go func() {
				b, err := openBundle(fifo, c.pin, nil)
				if b != nil {
					b.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				isPinErr := err != nil && strings.Contains(err.Error(), "--sha256 pins")
				if isPinErr != c.pinErr {
					t.Errorf("err %v: want a pin error %v", err, c.pinErr)
				}
				// a pipe cannot be read again: what the scan hashed is all there was, and the later check of the
				// sums (a read at an offset) fails on it, which is no pin error
				if !c.pinErr && (err == nil || errors.Is(err, io.EOF)) {
					t.Errorf("err %v: want the re-read of a pipe refused", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("openBundle opened the tarball a second time to scan it (it blocked on the drained pipe)")
			}
		})
	}
}
