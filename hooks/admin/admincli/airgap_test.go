package admincli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestAirgapCommandsMapFlags: the airgap commands reach their options' validation with the flags given.
func TestAirgapCommandsMapFlags(t *testing.T) {
	missingChart := filepath.Join(t.TempDir(), "no-chart")
	for args, want := range map[string]string{
		"airgap mirror bundle.tar":                                                                                       "--registry: name the private registry",
		"airgap mirror --registry reg.example:5000":                                                                      "accepts 1 arg(s), received 0",
		"airgap mirror --registry reg.example:5000 --out /nonexistent-dir b.tar":                                         "--out /nonexistent-dir: not a folder",
		"airgap mirror --registry reg.example:5000 missing.tar":                                                          "bundle: stat missing.tar",
		"airgap mirror --registry bad//reg missing.tar":                                                                  `--registry "bad//reg": want host[:port][/path], without empty`,
		"airgap mirror --registry https://reg.example missing.tar":                                                       "without a scheme",
		"airgap bundle --chart " + missingChart:                                                                          "chart " + missingChart,
		"airgap mirror --registry reg.example:5000 --sha256 abc b.tar":                                                   `--sha256 "abc": want the bundle's SHA-256, 64 hex digits`,
		"airgap mirror --registry reg.example:5000 --force --sha256 sha256:" + strings.Repeat("AB", 32) + " missing.tar": "bundle: stat missing.tar",
	} {
		var out bytes.Buffer
		cmd := NewCommand(&out)
		cmd.SetArgs(strings.Fields(args))
		cmd.SetErr(&out)
		err := cmd.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want an error containing %q, got %v", args, want, err)
		}
	}
}
