package hostfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, root, rel string, mode os.FileMode, data string) string {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFindExecutableTakesTheFirstExecutableInOrder(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "usr/bin/nvidia-smi", 0o644, "not executable")
	want := write(t, dir, "sbin/nvidia-smi", 0o755, "#!/bin/sh")
	write(t, dir, "opt/bin/nvidia-smi", 0o755, "#!/bin/sh")
	d, p, err := Root(dir).FindExecutable("nvidia-smi", BinDirs)
	if err != nil {
		t.Fatal(err)
	}
	if d != "sbin" || p != want {
		t.Fatalf("got %s %s, want sbin %s", d, p, want)
	}
}

func TestFindExecutableNamesWhereItLooked(t *testing.T) {
	_, _, err := Root(t.TempDir()).FindExecutable("nvidia-smi", BinDirs)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want ErrNotExist, got %v", err)
	}
	if want := "usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not list %q", err, want)
	}
}

func TestAbsoluteSymlinksResolveInsideTheRoot(t *testing.T) {
	dir := t.TempDir()
	lib := write(t, dir, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07", 0o755, "elf")
	// an absolute link, as some distributions install it: it must point into the root, not this container
	if err := os.Symlink("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07", filepath.Join(dir, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	got, err := Root(dir).FindLibrary("libnvidia-ml.so.1")
	if err != nil {
		t.Fatal(err)
	}
	if got != lib {
		t.Fatalf("FindLibrary = %s, want %s", got, lib)
	}
	if p, _ := Root(dir).Path("../../etc/passwd"); p != filepath.Join(dir, "etc/passwd") {
		t.Fatalf("Path escaped the root: %s", p)
	}
}

func TestLoadedModules(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "proc/modules", 0o444, "nvidia_peermem 16384 0 - Live 0x0000000000000000\nnvidia 56713216 2 nvidia_peermem, Live 0x0\n")
	mods, err := Root(dir).LoadedModules()
	if err != nil {
		t.Fatal(err)
	}
	if !mods["nvidia_peermem"] || !mods["nvidia"] || mods["nvidia_fs"] || len(mods) != 2 {
		t.Fatalf("modules = %v", mods)
	}
	if _, err := Root(t.TempDir()).LoadedModules(); err == nil {
		t.Fatal("a root without proc/modules gave no error")
	}
}

func TestExistsAndReadDirNames(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "sys/class/mdev_bus/0000:3b:00.0/x", 0o644, "")
	if ok, err := Root(dir).Exists("sys/class/mdev_bus"); !ok || err != nil {
		t.Fatalf("Exists = %v, %v", ok, err)
	}
	if ok, err := Root(dir).Exists("sys/bus/mdev/devices"); ok || err != nil {
		t.Fatalf("Exists(missing) = %v, %v", ok, err)
	}
	names, err := Root(dir).ReadDirNames("sys/class/mdev_bus")
	if err != nil || !slices.Equal(names, []string{"0000:3b:00.0"}) {
		t.Fatalf("ReadDirNames = %v, %v", names, err)
	}
	if names, err := Root(dir).ReadDirNames("nope"); names != nil || err != nil {
		t.Fatalf("ReadDirNames(missing) = %v, %v", names, err)
	}
}

func TestInterpreter(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Interpreter(script); got != "" || err != nil {
		t.Fatalf("script: %q, %v", got, err)
	}
	self, err := os.Executable() // the test binary: dynamic with cgo, static without
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Interpreter(self); err != nil || (got != "" && !strings.HasPrefix(got, "/")) {
		t.Fatalf("test binary: %q, %v", got, err)
	}
	if _, err := Interpreter(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file: no error")
	}
}
