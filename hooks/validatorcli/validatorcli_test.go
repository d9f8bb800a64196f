package validatorcli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestWaitAndCleanupThroughTheCommand(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "toolkit-ready"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "wait", "--dir", dir, "--interval", "10ms", "toolkit-ready")
	if err != nil || !strings.Contains(out, "toolkit-ready is present") {
		t.Fatalf("wait: %v, %q", err, out)
	}
	out, err = run(t, "cleanup", "--dir", dir, "toolkit-ready", "cuda-ready")
	if err != nil || !strings.Contains(out, "removed 1 of 2") {
		t.Fatalf("cleanup: %v, %q", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "toolkit-ready")); !os.IsNotExist(err) {
		t.Fatalf("toolkit-ready still there: %v", err)
	}
}

func TestWaitWithoutFilesFails(t *testing.T) {
	if _, err := run(t, "wait", "--dir", t.TempDir()); err == nil {
		t.Fatal("wait with no file succeeded")
	}
}

func TestWaitTimesOutWithAClearError(t *testing.T) {
	_, err := run(t, "wait", "--dir", t.TempDir(), "--interval", "5ms", "--timeout", "20ms", "driver-ready")
	if err == nil || !strings.Contains(err.Error(), "driver-ready") {
		t.Fatalf("want a timeout naming driver-ready, got %v", err)
	}
}
