package runtimeconfig

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A node's containerd config before the toolkit, with comments and a layout a re-encoding would lose.
const before = `# managed by the node image
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"   # pinned
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
`

// afterToolkit is before as upstream's installer leaves it once stopped: re-encoded, with the import of its
// drop-in's folder.
const afterToolkit = `imports = ["/etc/containerd/conf.d/*.toml"]
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.10"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
`

type node struct {
	dir, config, state, spec string
	log                      *bytes.Buffer
}

func newNode(t *testing.T, config string) *node {
	t.Helper()
	dir := t.TempDir()
	n := &node{dir: dir, config: filepath.Join(dir, "etc/containerd/config.toml"), state: filepath.Join(dir, "run/state.json"),
		spec: filepath.Join(dir, "var/run/cdi/management.nvidia.com-gpu.yaml"), log: &bytes.Buffer{}}
	for _, d := range []string{filepath.Dir(n.config), filepath.Dir(n.state), filepath.Dir(n.spec)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if config != "" {
		n.write(t, config)
	}
	return n
}

func (n *node) keeper() Keeper {
	return Keeper{Config: n.config, DropIn: "/etc/containerd/conf.d/99-nvidia.toml", State: n.state, Specs: []string{n.spec},
		Log: slog.New(slog.NewTextHandler(n.log, nil))}
}

func (n *node) write(t *testing.T, content string) {
	t.Helper()
	if err := os.WriteFile(n.config, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
}

// toolkitRuns plays the toolkit's start (its config and spec) and stop (the drop-in goes, the import stays).
func (n *node) toolkitRuns(t *testing.T, after string) {
	t.Helper()
	n.write(t, after)
	if err := os.WriteFile(n.spec, []byte("kind: management.nvidia.com/gpu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (n *node) readConfig(t *testing.T) (string, bool) {
	t.Helper()
	raw, err := os.ReadFile(n.config)
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(raw), true
}

func TestRestoreGivesTheBytesBackAndRemovesTheSpec(t *testing.T) {
	n := newNode(t, before)
	k := n.keeper()
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	n.toolkitRuns(t, afterToolkit)
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != before {
		t.Errorf("config after restore:\n%s\nwant the bytes before the toolkit:\n%s", got, before)
	}
	info, err := os.Stat(n.config)
	if err != nil || info.Mode().Perm() != 0o640 {
		t.Errorf("config mode %v (%v), want 0640 as before", info.Mode().Perm(), err)
	}
	if _, err := os.Stat(n.spec); !os.IsNotExist(err) {
		t.Errorf("the toolkit's CDI spec is still there: %v", err)
	}
	if _, err := os.Stat(n.state); !os.IsNotExist(err) {
		t.Errorf("the record is still there after the restore: %v", err)
	}
}

// A restarted keeper (its container, or a new pod after a stop without restore) keeps the first record: the config
// it sees now may carry the toolkit's import already.
func TestKeepKeepsTheRecordTakenBeforeTheToolkit(t *testing.T) {
	n := newNode(t, before)
	k := n.keeper()
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	n.toolkitRuns(t, afterToolkit)
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != before {
		t.Errorf("config after a second Keep and the restore:\n%s\nwant the bytes before the toolkit", got)
	}
}

// An admin's change besides the toolkit's import is never undone: the config stays, and the log says what to remove.
func TestRestoreLeavesAConfigChangedBeyondTheToolkit(t *testing.T) {
	n := newNode(t, before)
	k := n.keeper()
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(afterToolkit, "runc", "crun", 1)
	n.toolkitRuns(t, edited)
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != edited {
		t.Errorf("a config changed beyond the toolkit was rewritten:\n%s", got)
	}
	if !strings.Contains(n.log.String(), "left as it is") || !strings.Contains(n.log.String(), "99-nvidia.toml") {
		t.Errorf("the log does not say the config was left and which import to remove:\n%s", n.log)
	}
	if _, err := os.Stat(n.spec); !os.IsNotExist(err) {
		t.Errorf("the spec goes whatever the config: %v", err)
	}
}

// The toolkit created the config (none before): a config of only its import and version goes again.
func TestRestoreRemovesAConfigTheToolkitCreated(t *testing.T) {
	n := newNode(t, "")
	k := n.keeper()
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	n.toolkitRuns(t, "version = 2\nimports = [\"/etc/containerd/conf.d/99-nvidia.toml\"]\n")
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, ok := n.readConfig(t); ok {
		t.Errorf("the config the toolkit created stays:\n%s", got)
	}
}

// An unchanged config is not written (the same file stays), and other imports of the node's own are kept by the check.
func TestRestoreWritesNothingOnAnUnchangedConfig(t *testing.T) {
	own := "version = 2\nimports = [\"/etc/containerd/site.toml\"]\n"
	n := newNode(t, own)
	k := n.keeper()
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	old, err := os.Stat(n.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	now, err := os.Stat(n.config)
	if err != nil || !os.SameFile(old, now) {
		t.Errorf("an unchanged config was written again (%v)", err)
	}
	// the toolkit's import added to the node's own: the node's own import is what stays
	n2 := newNode(t, own)
	k2 := n2.keeper()
	if err := k2.Keep(); err != nil {
		t.Fatal(err)
	}
	n2.toolkitRuns(t, "version = 2\nimports = [\"/etc/containerd/site.toml\", \"/etc/containerd/conf.d/*.toml\"]\n")
	if err := k2.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n2.readConfig(t); got != own {
		t.Errorf("config with the node's own import:\n%s\nwant\n%s", got, own)
	}
}

// A damaged record changes nothing and says which file to delete; no record (taken on a node that rebooted since:
// the state lives on /run) leaves the config too.
func TestRestoreWithoutAGoodRecordChangesNothing(t *testing.T) {
	n := newNode(t, afterToolkit)
	k := n.keeper()
	if err := os.WriteFile(n.state, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := k.Restore()
	if err == nil || !strings.Contains(err.Error(), n.state) || !strings.Contains(err.Error(), "delete the file") {
		t.Errorf("a damaged record: %v, want an error naming it", err)
	}
	if got, _ := n.readConfig(t); got != afterToolkit {
		t.Errorf("a damaged record changed the config:\n%s", got)
	}
	if err := os.Remove(n.state); err != nil {
		t.Fatal(err)
	}
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != afterToolkit {
		t.Errorf("no record changed the config:\n%s", got)
	}
	// not TOML now: left, with the reason
	n.write(t, "imports = [\n")
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != "imports = [\n" {
		t.Errorf("an unparsable config was rewritten:\n%s", got)
	}
}

// NRI: the toolkit changes no runtime config; only its spec goes.
func TestRestoreWithoutAConfigRemovesOnlyTheSpec(t *testing.T) {
	n := newNode(t, before)
	k := n.keeper()
	k.Config = ""
	if err := k.Keep(); err != nil {
		t.Fatal(err)
	}
	n.toolkitRuns(t, afterToolkit)
	if err := k.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.readConfig(t); got != afterToolkit {
		t.Errorf("with no config to keep, the config changed:\n%s", got)
	}
	if _, err := os.Stat(n.spec); !os.IsNotExist(err) {
		t.Errorf("the spec stays: %v", err)
	}
}
