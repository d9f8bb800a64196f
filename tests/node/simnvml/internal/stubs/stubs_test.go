package stubs

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

const libraryDir = "../.."

// TestStubsCurrent fails when stubs_gen.c is not what the generator writes now: after a go-nvml upgrade (new
// functions in nvml.h) or a change to what the library implements.
func TestStubsCurrent(t *testing.T) {
	want, err := Generate(libraryDir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(libraryDir, "stubs_gen.c"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("tests/node/simnvml/stubs_gen.c is stale: run `make generate` (go-nvml's nvml.h or the library's exports changed)")
	}
}

// TestDeclaredCoversGoNVML checks the header parser against go-nvml's own bindings: every C function its
// generated code calls must be one Declared finds (else the library would lack it and a call would kill the
// caller), and the parser must tell nvmlErrorString's return type from nvmlReturn_t.
func TestDeclaredCoversGoNVML(t *testing.T) {
	h, err := FindHeader(libraryDir)
	if err != nil {
		t.Fatal(err)
	}
	header, err := os.ReadFile(h.Path)
	if err != nil {
		t.Fatal(err)
	}
	declared := Declared(header)
	names := map[string]Function{}
	for _, f := range declared {
		names[f.Name] = f
	}
	bindings, err := os.ReadFile(filepath.Join(filepath.Dir(h.Path), "nvml.go"))
	if err != nil {
		t.Fatal(err)
	}
	var called []string
	for _, m := range regexp.MustCompile(`C\.(nvml\w+)\(`).FindAllSubmatch(bindings, -1) {
		called = append(called, string(m[1]))
	}
	slices.Sort(called)
	called = slices.Compact(called)
	if len(called) < 300 {
		t.Fatalf("found only %d NVML functions called in go-nvml's nvml.go: the pattern no longer matches", len(called))
	}
	for _, c := range called {
		if _, ok := names[c]; !ok {
			t.Errorf("go-nvml calls %s, which Declared did not find in nvml.h", c)
		}
	}
	for name, status := range map[string]bool{"nvmlErrorString": false, "nvmlInit_v2": true, "nvmlInit": true,
		"nvmlDeviceGetTemperature": true, "nvmlDeviceGetHandleBySerial": true} {
		if f, ok := names[name]; !ok || f.ReturnsStatus != status {
			t.Errorf("%s: declared %v, returns nvmlReturn_t %v; want declared, %v", name, ok, f.ReturnsStatus, status)
		}
	}
}

func TestStubsRefuseWhatTheyCannotAnswer(t *testing.T) {
	h := Header{Version: "v0"}
	declared := []Function{{Name: "nvmlErrorString"}, {Name: "nvmlInit_v2", ReturnsStatus: true}}
	if _, err := Stubs(h, declared, []string{"nvmlInit_v2"}); err == nil {
		t.Error("a stub for nvmlErrorString, which returns a string, was written")
	}
	if _, err := Stubs(h, declared, []string{"nvmlErrorString", "nvmlInitt_v2"}); err == nil {
		t.Error("an export nvml.h does not declare (a typo) was accepted")
	}
	out, err := Stubs(h, declared, []string{"nvmlErrorString"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "nvmlReturn_t nvmlInit_v2(void) { return simnvml_not_supported(__func__); }\n"; !bytes.Contains(out, []byte(want)) {
		t.Errorf("no stub for nvmlInit_v2 in:\n%s", out)
	}
}
