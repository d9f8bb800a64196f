package statusfiles

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWaitReturnsTheFileThatAppears(t *testing.T) {
	dir := t.TempDir()
	o := WaitOptions{Dir: dir, Files: []string{"vfio-pci-ready", "vgpu-devices-ready"}, Interval: 10 * time.Millisecond}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(dir, "vgpu-devices-ready"), nil, 0o644)
	}()
	var out bytes.Buffer
	got, err := Wait(t.Context(), o, &out)
	if err != nil {
		t.Fatal(err)
	}
	if got != "vgpu-devices-ready" {
		t.Fatalf("Wait returned %q, want vgpu-devices-ready", got)
	}
	if !strings.Contains(out.String(), "waiting for vfio-pci-ready or vgpu-devices-ready") {
		t.Fatalf("no start line: %q", out.String())
	}
}

func TestWaitGivesUpAtTheTimeoutNamingTheFile(t *testing.T) {
	o := WaitOptions{Dir: t.TempDir(), Files: []string{"toolkit-ready"}, Interval: 5 * time.Millisecond, Timeout: 30 * time.Millisecond}
	_, err := Wait(context.Background(), o, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "toolkit-ready") {
		t.Fatalf("want a timeout naming toolkit-ready, got %v", err)
	}
}

func TestValidateRejectsPathsAndEmptyLists(t *testing.T) {
	for _, files := range [][]string{nil, {"../etc/passwd"}, {"a/b"}, {".."}, {""}} {
		o := WaitOptions{Files: files}
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%q) accepted it", files)
		}
	}
}

func TestCleanupRemovesOnlyTheNamedFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"driver-ready", "toolkit-ready", "workload-type"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := Cleanup(dir, []string{"driver-ready", "toolkit-ready", "cuda-ready"})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("removed %d files, want 2", n)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 || left[0].Name() != "workload-type" {
		t.Fatalf("left %v, want only workload-type", left)
	}
	if _, err := Cleanup(dir, []string{"../x"}); err == nil {
		t.Fatal("Cleanup accepted a path")
	}
}

func TestWriteReplacesAtomicallyAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, "driver-ready", []byte("IS_HOST_DRIVER=false\n")); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir, "driver-ready", []byte("IS_HOST_DRIVER=true\n")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "driver-ready"))
	if err != nil || string(got) != "IS_HOST_DRIVER=true\n" {
		t.Fatalf("driver-ready = %q, %v", got, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1 {
		t.Fatalf("left %v, want only driver-ready", left)
	}
	if err := Write(dir, "../escape", nil); err == nil {
		t.Fatal("Write accepted a path")
	}
	if err := Write(filepath.Join(dir, "missing"), "x", nil); err == nil || !strings.Contains(err.Error(), "write x") {
		t.Fatalf("Write into a missing dir: %v", err)
	}
}
