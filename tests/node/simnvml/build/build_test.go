package build

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/internal/stubs"
)

// childEnv makes the test binary, run again by a test, act as a child process instead of running the tests.
const childEnv = "SIMNVML_TEST_CHILD"

// built is the library every test loads, built once into a temporary folder the run removes.
var built struct {
	once sync.Once
	dir  string
	lib  string
	err  error
}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child(os.Getenv(childEnv)))
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// moduleDir is this module's root, seen from this package's folder (where go test runs it).
var moduleDir, _ = filepath.Abs(filepath.Join("..", "..", "..", ".."))

// library is the built library's path. Without cgo it skips, except under CI=true, where that is a failure.
func library(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "simnvml-test-")
		if built.err == nil {
			built.lib, built.err = Build(context.Background(), moduleDir, built.dir)
		}
	})
	if errors.Is(built.err, ErrNoCgo) && os.Getenv("CI") != "true" {
		t.Skipf("SKIP: the simulated NVML cannot be built here (CI=true makes this a failure): %v", built.err)
	}
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.lib
}

// TestLibraryFile checks the ELF: its soname is the name go-nvml loads, and it defines every function go-nvml's
// nvml.h declares, so no call through go-nvml reaches a missing symbol.
func TestLibraryFile(t *testing.T) {
	lib := library(t)
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	soname, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(soname) != 1 || soname[0] != config.LibraryName {
		t.Errorf("soname %v (%v), want %s", soname, err, config.LibraryName)
	}
	symbols, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, s := range symbols {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			defined[s.Name] = true
		}
	}
	h, err := stubs.FindHeader(".")
	if err != nil {
		t.Fatal(err)
	}
	header, err := os.ReadFile(h.Path)
	if err != nil {
		t.Fatal(err)
	}
	declared := stubs.Declared(header)
	if len(declared) < 400 {
		t.Fatalf("only %d functions found in %s", len(declared), h.Path)
	}
	for _, fn := range declared {
		if !defined[fn.Name] {
			t.Errorf("%s is declared in go-nvml %s's nvml.h but not defined by the library", fn.Name, h.Version)
		}
	}
}

// TestBuildReusesItsFolder: Build of unchanged sources returns the library it built before, without building.
func TestBuildReusesItsFolder(t *testing.T) {
	lib := library(t)
	before, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(context.Background(), moduleDir, built.dir)
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != lib || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("second Build: %s (modified %v), want %s untouched (modified %v)", again, after.ModTime(), lib, before.ModTime())
	}
	entries, err := os.ReadDir(built.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !entries[0].IsDir() || entries[0].Name() != filepath.Base(filepath.Dir(lib)) {
		t.Errorf("the cache folder holds %v; want only the library's folder (no build leftovers)", entries)
	}
}
