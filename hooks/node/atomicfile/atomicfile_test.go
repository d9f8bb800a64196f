package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Write replaces the file whole with the mode asked for, and leaves no temporary file, also when it fails.
func TestWriteReplacesWholeAndLeavesNothingBehind(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte("old, longer than the new content\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new\n" {
		t.Fatalf("content %q (%v), want the new content only", got, err)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", info.Mode().Perm())
	}
	if err := Write(filepath.Join(dir, "missing", "x"), []byte("x"), 0o644); err == nil {
		t.Error("a write into a missing folder succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("folder holds %d entries, want the file alone: %v", len(entries), entries)
	}
}
