package admincli

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

// helpSections splits the root's --help into its command sections: heading -> the commands listed under it.
func helpSections(t *testing.T, help string) map[string][]string {
	t.Helper()
	sections := map[string][]string{}
	heading := ""
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "":
			heading = ""
		case !strings.HasPrefix(line, " ") && strings.HasSuffix(line, ":"):
			heading = line
		case heading != "" && strings.HasPrefix(line, "  ") && !strings.HasPrefix(strings.TrimSpace(line), "-"):
			sections[heading] = append(sections[heading], strings.Fields(line)[0])
		}
	}
	return sections
}

// The top-level help listed the chart's hook commands (pre-upgrade, cleanup, ...) among the admin's, in one
// alphabetical list, and then under their own heading, still within the first screen: the admin's commands come
// first, and the hooks' are one line, `hooks`, which lists them; each stays runnable.
func TestHelpListsTheAdminsCommandsAndOnlyPointsAtTheHooks(t *testing.T) {
	run := func(args ...string) string {
		var out bytes.Buffer
		root := NewCommand(&out)
		root.SetOut(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	help := run("--help")
	sections := helpSections(t, help)
	admin, hooks := sections["Commands:"], sections["Run by the chart's hooks and pods (rarely by hand):"]
	for _, want := range []string{"status", "upgrade", "plan", "migrate", "airgap", "image", "help"} {
		if !strings.Contains(" "+strings.Join(admin, " ")+" ", " "+want+" ") {
			t.Errorf("the admin's commands %v lack %s", admin, want)
		}
	}
	if !slices.Equal(hooks, []string{"hooks"}) {
		t.Errorf("the hooks' section %v, want the one command that lists them", hooks)
	}
	delete(sections, "Usage:")
	if len(sections) != 2 {
		t.Errorf("command sections %v, want the admin's and the hooks' alone", sections)
	}
	if a, h := strings.Index(help, "\nCommands:"), strings.Index(help, "\nRun by the chart's hooks"); a < 0 || h < a {
		t.Errorf("the hooks' section comes before the admin's:\n%s", help)
	}
	listed := run("hooks")
	for _, want := range []string{"check", "cleanup", "keep-runtime-config", "pre-upgrade", "seed-label"} {
		if !strings.Contains(listed, "\n  "+want+" ") {
			t.Errorf("`kube-gpu-stack hooks` does not list %s:\n%s", want, listed)
		}
		if strings.Contains(help, "\n  "+want+" ") {
			t.Errorf("the first screen lists the hook command %s:\n%s", want, help)
		}
		if out := run(want, "--help"); !strings.Contains(out, "Usage:") {
			t.Errorf("%s --help: %s", want, out)
		}
	}
}

// The image's binary has the same root without the admin's own commands: its help groups them the same way.
func TestInClusterHelpGroupsTheHooks(t *testing.T) {
	var out bytes.Buffer
	root := stackcli.NewCommand(&out)
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	sections := helpSections(t, out.String())
	if got := sections["Run by the chart's hooks and pods (rarely by hand):"]; !slices.Equal(got, []string{"check", "cleanup", "keep-runtime-config", "pre-upgrade", "seed-label"}) {
		t.Errorf("the hooks' commands %v, want check, cleanup, keep-runtime-config, pre-upgrade and seed-label", got)
	}
}
