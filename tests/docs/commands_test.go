// Package docs checks that the documentation's commands exist: every `kube-gpu-stack`, `helm` and `make` command
// the README and docs/ show, in code blocks and inline code, names a command, subcommand and flags that do.
package docs

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/admincli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/cmd/incluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanagercli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validatorcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// shown is one command as a doc shows it.
type shown struct {
	file string
	text string
}

var (
	fenced     = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inline     = regexp.MustCompile("`([^`\n]+)`")
	separators = regexp.MustCompile(`\s*(?:&&|\|\||;|\|)\s*`)
	commandRE  = regexp.MustCompile(`^(kube-gpu-stack|helm|make)( |$)`)
)

// docFiles are the README and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	root := chartrender.RepoRoot()
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// docCommands returns the kube-gpu-stack, helm and make commands of the README and docs/*.md: each line of a code
// block and each inline code span, split at shell separators, whose first word is one of the three.
func docCommands(t *testing.T) []shown {
	root := chartrender.RepoRoot()
	var out []shown
	for _, f := range docFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		var texts []string
		for _, m := range fenced.FindAllStringSubmatch(string(raw), -1) {
			for _, line := range strings.Split(m[1], "\n") {
				texts = append(texts, strings.TrimPrefix(strings.TrimSpace(line), "$ "))
			}
		}
		for _, m := range inline.FindAllStringSubmatch(fenced.ReplaceAllString(string(raw), ""), -1) {
			texts = append(texts, m[1])
		}
		for _, text := range texts {
			if i := strings.Index(text, " #"); i >= 0 {
				text = text[:i] // a shell comment
			}
			for _, seg := range separators.Split(text, -1) {
				seg = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(seg), `\`))
				if commandRE.MatchString(seg) {
					out = append(out, shown{rel, seg})
				}
			}
		}
	}
	return out
}

// words are a shown command's words up to the first placeholder or shell redirection: what follows (NODE, <node>,
// ..., > file) is the reader's to fill in.
func words(text string) []string {
	var out []string
	for _, w := range strings.Fields(text) {
		if w == "..." || strings.ContainsAny(w[:1], "<>") {
			break
		}
		out = append(out, w)
	}
	return out
}

// flagNames are the flag names among args (without dashes and values).
func flagNames(args []string) []string {
	var out []string
	for _, a := range args {
		if a == "-" || !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		out = append(out, name)
	}
	return out
}

// TestDocumentedCommandsExist: every documented kube-gpu-stack command is a command of the admin CLI (or of the
// image's node commands, `kube-gpu-stack validator ...`) with the flags shown; every make target is the Makefile's;
// every helm subcommand and flag is the pinned helm's (`go tool helm`, v3.22).
func TestDocumentedCommandsExist(t *testing.T) {
	cmds := docCommands(t)
	counts := map[string]int{}
	for _, c := range cmds {
		counts[strings.Fields(c.text)[0]]++
	}
	for _, tool := range []string{"kube-gpu-stack", "helm", "make"} {
		if counts[tool] == 0 {
			t.Fatalf("no %s command found in the docs: the extraction is broken", tool)
		}
	}
	t.Logf("checked %d documented commands: %v", len(cmds), counts)
	targets := makeTargets(t)
	help := helmHelp(t)
	for _, c := range cmds {
		w := words(c.text)
		switch w[0] {
		case "make":
			for _, target := range w[1:] {
				if !strings.Contains(target, "=") && !strings.HasPrefix(target, "-") && !targets[target] {
					t.Errorf("%s: `%s`: the Makefile has no target %q", c.file, c.text, target)
				}
			}
		case "kube-gpu-stack":
			if err := cliAccepts(w[1:]); err != "" {
				t.Errorf("%s: `%s`: %s", c.file, c.text, err)
			}
		case "helm":
			if err := help.accepts(w[1:]); err != "" {
				t.Errorf("%s: `%s`: %s", c.file, c.text, err)
			}
			// a helm built from source (go install, go tool helm) renders for Kubernetes v1.20 unless told, and
			// the chart refuses that version: a render shown (helm template NAME CHART ..., not the name of the
			// command in a sentence) must name one
			if len(w) > 3 && w[1] == "template" && !slices.ContainsFunc(flagNames(w[2:]), func(f string) bool { return f == "kube-version" }) {
				t.Errorf("%s: `%s`: helm template without --kube-version fails with a helm built from source (it assumes Kubernetes v1.20)", c.file, c.text)
			}
		}
	}
}

// cliAccepts says what of args the admin CLI (or, after validator or driver-manager, that node command) lacks: a
// subcommand named where its parent has none by that name, or a flag the command does not take; "" when it takes
// them all.
func cliAccepts(args []string) string {
	root := admincli.NewCommand(io.Discard)
	if len(args) > 0 && slices.Contains(incluster.Links, args[0]) {
		switch args[0] {
		case incluster.Validator:
			root = validatorcli.NewCommand(io.Discard)
		case incluster.DriverManager:
			root = drivermanagercli.NewCommand(io.Discard)
		}
		args = args[1:]
	}
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err.Error()
	}
	if len(rest) > 0 && cmd.HasAvailableSubCommands() && !strings.HasPrefix(rest[0], "-") {
		return cmd.CommandPath() + " has no subcommand " + rest[0]
	}
	for _, name := range flagNames(rest) {
		if !hasFlag(cmd, name) {
			return cmd.CommandPath() + " has no flag " + name
		}
	}
	return ""
}

func hasFlag(cmd *cobra.Command, name string) bool {
	if name == "h" || name == "help" {
		return true
	}
	if len(name) == 1 {
		return cmd.Flags().ShorthandLookup(name) != nil || cmd.InheritedFlags().ShorthandLookup(name) != nil
	}
	return cmd.Flags().Lookup(name) != nil || cmd.InheritedFlags().Lookup(name) != nil
}

// makeTargets are the Makefile's rule names.
func makeTargets(t *testing.T) map[string]bool {
	raw, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(raw), -1) {
		out[m[1]] = true
	}
	return out
}

// helmHelper answers from the pinned helm's own help: its subcommands, and each one's flags.
type helmHelper struct {
	bin  string
	mu   sync.Mutex
	seen map[string]string // subcommand path -> its --help
}

func helmHelp(t *testing.T) *helmHelper {
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-n", "helm")
	cmd.Dir = chartrender.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool -n helm: %v", err)
	}
	return &helmHelper{bin: strings.TrimSpace(string(out)), seen: map[string]string{}}
}

func (h *helmHelper) helpOf(path []string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	key := strings.Join(path, " ")
	if out, ok := h.seen[key]; ok {
		return out, nil
	}
	var stdout bytes.Buffer
	cmd := exec.CommandContext(context.Background(), h.bin, append(slices.Clone(path), "--help")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	err := cmd.Run()
	h.seen[key] = stdout.String()
	return stdout.String(), err
}

var helmCommandLine = regexp.MustCompile(`(?m)^  ([a-z][a-z-]*)\s{2,}`)

// accepts says what of args helm lacks: a subcommand where the parent has its own, or a flag its help does not
// list; "" when it has them all.
func (h *helmHelper) accepts(args []string) string {
	var path []string
	help, err := h.helpOf(nil)
	if err != nil {
		return "helm --help: " + err.Error()
	}
	i := 0
	for ; i < len(args) && !strings.HasPrefix(args[i], "-"); i++ {
		subs := map[string]bool{}
		if _, after, ok := strings.Cut(help, "Available Commands:"); ok {
			section, _, _ := strings.Cut(after, "\n\n")
			for _, m := range helmCommandLine.FindAllStringSubmatch(section, -1) {
				subs[m[1]] = true
			}
		}
		if len(subs) == 0 {
			break // the rest are arguments
		}
		if !subs[args[i]] {
			return strings.TrimSpace("helm "+strings.Join(path, " ")) + " has no subcommand " + args[i]
		}
		path = append(path, args[i])
		if help, err = h.helpOf(path); err != nil {
			return "helm " + strings.Join(path, " ") + " --help: " + err.Error()
		}
	}
	for _, name := range flagNames(args[i:]) {
		short := len(name) == 1 && strings.Contains(help, "  -"+name+", ")
		if name != "h" && name != "help" && !short && !strings.Contains(help, "--"+name+" ") && !strings.Contains(help, "--"+name+"\n") {
			return strings.TrimSpace("helm "+strings.Join(path, " ")) + " has no flag " + name
		}
	}
	return ""
}
