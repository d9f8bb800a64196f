package gpuhealth

import (
	"os"
	"path/filepath"
	"testing"
)

func writeLib(t *testing.T, root string) string {
	t.Helper()
	p := filepath.Join(root, "usr/lib/x86_64-linux-gnu", NVMLLibrary)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}
