package admincli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigrateCommand runs `kube-gpu-stack migrate -f ... -o ...` as a user would: the values go to the file, the
// report to standard output.
func TestMigrateCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "values.yaml")
	var stdout bytes.Buffer
	cmd := NewCommand(&stdout)
	cmd.SetArgs([]string{"migrate", "-f", "../gpumigrate/testdata/operator-typical.yaml", "-o", out})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tag: 570.195.03", "sandboxWorkloads:"} {
		if !strings.Contains(string(values), want) {
			t.Errorf("values lack %q:\n%s", want, values)
		}
	}
	for _, want := range []string{"driver.version", "-> driver.image.tag", "someOperatorOption", "no place in kube-gpu-stack"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, stdout.String())
		}
	}

	cmd = NewCommand(&stdout)
	cmd.SetArgs([]string{"migrate"})
	cmd.SetErr(&bytes.Buffer{})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--from-cluster") {
		t.Errorf("migrate without input: %v", err)
	}
}
