package hostdriver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostdriver"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation/validationtest"
)

func script(t *testing.T, root, p, body string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestLookupLooksInEveryHostDirAndRunsWhatItFinds(t *testing.T) {
	for _, dir := range hostdriver.Dirs {
		root := t.TempDir()
		script(t, root, filepath.Join(dir, "nvidia-smi"), "echo NVIDIA-SMI 550.54.15\n")
		r, err := hostdriver.Lookup(t.Context(), hostfs.Root(root), hostdriver.Interpreted)
		if err != nil || !r.Present() || r.Dir != dir || !strings.Contains(string(r.Output), "550.54.15") {
			t.Errorf("%s: %+v, %v; want found there and run", dir, r, err)
		}
	}
	if r, err := hostdriver.Lookup(t.Context(), hostfs.Root(t.TempDir()), hostdriver.Interpreted); err != nil || r.Present() || r.Path != "" ||
		!strings.Contains(r.String(), "no nvidia-smi under") || !strings.Contains(r.String(), "opt/bin") {
		t.Errorf("empty root: %+v (%s), %v", r, r, err)
	}
}

// An nvidia-smi that fails, as a leftover of an uninstalled driver does with no module loaded, is no host driver.
func TestLookupALeftoverThatFailsIsNoHostDriver(t *testing.T) {
	root := t.TempDir()
	script(t, root, "usr/bin/nvidia-smi", "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
	r, err := hostdriver.Lookup(t.Context(), hostfs.Root(root), hostdriver.Interpreted)
	if err != nil || r.Present() || r.Path != filepath.Join(root, "usr/bin/nvidia-smi") {
		t.Fatalf("%+v, %v; want found and not present", r, err)
	}
	want := "nvidia-smi under " + root + "/usr/bin failed: exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (a leftover"
	if !strings.Contains(r.String(), want) {
		t.Fatalf("%q lacks %q", r.String(), want)
	}
}

// A dynamically linked host nvidia-smi runs through the host root's own loader and libraries, from an image that
// has neither, with the arguments given.
func TestInterpretedRunsAHostProgramThroughTheRootsLoader(t *testing.T) {
	root, err := validationtest.BuildFixtureDriverRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	run := func(ctx context.Context, r hostfs.Root, path string, args []string) ([]byte, error) {
		ran = append(ran, path+" "+strings.Join(args, " "))
		return hostdriver.Interpreted(ctx, r, path, args)
	}
	r, err := hostdriver.Lookup(t.Context(), hostfs.Root(root.Dir), run, "--version")
	if err != nil || !r.Present() {
		t.Fatalf("%+v, %v (%s)", r, err, r.Output)
	}
	loader := filepath.Join(root.Dir, root.Interpreter)
	if out := string(r.Output); !strings.Contains(out, "NVIDIA-SMI version") || !strings.Contains(out, validationtest.LoaderLine+loader+"\n") {
		t.Fatalf("not run through %s with --version:\n%s", loader, out)
	}
	if len(ran) != 1 || ran[0] != "/usr/bin/nvidia-smi --version" {
		t.Fatalf("ran %q", ran)
	}
	// without the root's loader it cannot start: not a host driver, and the reason says why
	if err := os.Remove(loader); err != nil {
		t.Fatal(err)
	}
	r, err = hostdriver.Lookup(t.Context(), hostfs.Root(root.Dir), hostdriver.Interpreted)
	if err != nil || r.Present() || !strings.Contains(r.String(), "needs the loader "+root.Interpreter) {
		t.Fatalf("%+v (%s), %v", r, r, err)
	}
}
