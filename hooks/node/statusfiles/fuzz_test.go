package statusfiles

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzStatusFileName: a status file name comes from the chart and the validator's flags; whatever it is, Write,
// Wait's validation and Cleanup never touch a file outside the validations directory, and a name they accept is
// one file directly in it.
func FuzzStatusFileName(f *testing.F) {
	parent := f.TempDir()
	dir := filepath.Join(parent, "validations")
	if err := os.Mkdir(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		if validNames([]string{name}) == nil && filepath.Dir(filepath.Join(dir, name)) != dir {
			t.Fatalf("%q is accepted but is not a file directly in the directory", name)
		}
		o := WaitOptions{Dir: dir, Files: []string{name}}
		o.Complete()
		_ = o.Validate()
		if err := Write(dir, name, data); err == nil {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || string(b) != string(data) {
				t.Fatalf("%q written, read back %q, %v", name, b, err)
			}
		}
		if _, err := Cleanup(dir, []string{name}); err != nil && validNames([]string{name}) == nil {
			t.Logf("cleanup %q: %v", name, err)
		}
		entries, err := os.ReadDir(parent)
		if err != nil || len(entries) != 1 || entries[0].Name() != "validations" {
			t.Fatalf("name %q: something was written next to the validations directory: %v %v", name, entries, err)
		}
		left, _ := os.ReadDir(dir)
		for _, e := range left {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	})
}
