package validation

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation/validationtest"
)

// toolkitEnv is a node whose driver is the fixture driver root (containerized, or the host's) and a validator
// container into which the runtime injected the stand-in nvidia-smi and libnvidia-ml, but no loader: the
// project's static image.
func toolkitEnv(t *testing.T, hostDriver bool) (*env, *validationtest.DriverRoot) {
	t.Helper()
	e := newEnv(t, nil)
	dir, ready := e.driver, "IS_HOST_DRIVER=false\n"
	if hostDriver {
		dir, ready = e.host, "IS_HOST_DRIVER=true\n"
	}
	root, err := validationtest.BuildFixtureDriverRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Inject(e.ctr); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.out, "driver-ready", ready, 0o644)
	return e, root
}

// The static image has no loader: the injected, dynamically linked nvidia-smi runs through the loader and libc of
// the driver root driver-ready names, with the injected libnvidia-ml first on the library path.
func TestToolkitCheckRunsTheInjectedNvidiaSMIThroughTheDriverRootsLoader(t *testing.T) {
	for _, hostDriver := range []bool{false, true} {
		e, root := toolkitEnv(t, hostDriver)
		loader := filepath.Join(root.Dir, root.Interpreter)
		e.runner.answers[loader] = answer{out: "GPU 0: " + validationtest.GPUName}
		if err := e.run(e.options("toolkit")); err != nil {
			t.Fatalf("host driver %v: %v\n%s", hostDriver, err, e.log.String())
		}
		want := []Command{{Path: loader, Args: []string{"--library-path",
			filepath.Join(e.ctr, root.LibDir) + ":" + filepath.Join(root.Dir, root.LibDir), filepath.Join(e.ctr, root.NvidiaSMI)}}}
		if !slices.EqualFunc(e.runner.calls, want, commandEqual) {
			t.Fatalf("host driver %v: ran %v, want %v", hostDriver, e.runner.calls, want)
		}
		if _, ok := e.status("toolkit-ready"); !ok {
			t.Fatal("toolkit-ready not written")
		}
	}
}

// execRecorder runs commands for real and keeps what they printed.
type execRecorder struct {
	calls []Command
	outs  []string
}

func (r *execRecorder) Run(ctx context.Context, c Command) ([]byte, error) {
	out, err := ExecRunner{}.Run(ctx, c)
	r.calls, r.outs = append(r.calls, c), append(r.outs, string(out))
	return out, err
}

// The same, run for real: the stand-in's output proves the fixture root's loader ran it and the injected NVML
// answered.
func TestToolkitCheckRunsTheStandInNvidiaSMI(t *testing.T) {
	e, root := toolkitEnv(t, false)
	o := e.options("toolkit")
	rec := &execRecorder{}
	o.Runner = rec
	if err := e.run(o); err != nil {
		t.Fatalf("%v\n%s", err, e.log.String())
	}
	loader := filepath.Join(root.Dir, root.Interpreter)
	if len(rec.outs) != 1 || !strings.Contains(rec.outs[0], "GPU 0: "+validationtest.GPUName) ||
		!strings.Contains(rec.outs[0], validationtest.LoaderLine+loader+"\n") {
		t.Fatalf("the stand-in did not run through %s: ran %v:\n%s", loader, rec.calls, rec.outs)
	}
	if !strings.Contains(e.log.String(), "GPU 0: "+validationtest.GPUName) {
		t.Fatalf("log:\n%s", e.log.String())
	}
	// without the driver root's loader, the injected program cannot start in the static image
	if err := os.Remove(loader); err != nil {
		t.Fatal(err)
	}
	if err := e.run(o); err == nil || !strings.Contains(e.annotation("toolkit"), "needs the loader "+root.Interpreter+", not found in the driver root") {
		t.Fatalf("err %v, annotation %q", err, e.annotation("toolkit"))
	}
}

// A static nvidia-smi, or an image that has the loader nvidia-smi names, runs directly.
func TestToolkitCheckRunsAStaticOrLoadableNvidiaSMIDirectly(t *testing.T) {
	e, root := toolkitEnv(t, false)
	if err := os.MkdirAll(filepath.Dir(filepath.Join(e.ctr, root.Interpreter)), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.ctr, root.Interpreter, "", 0o755) // the image has a loader
	smi := filepath.Join(e.ctr, root.NvidiaSMI)
	e.runner.answers[smi] = answer{out: "GPU 0"}
	if err := e.run(e.options("toolkit")); err != nil {
		t.Fatal(err)
	}
	if want := []Command{{Path: smi}}; !slices.EqualFunc(e.runner.calls, want, commandEqual) {
		t.Fatalf("ran %v, want %v", e.runner.calls, want)
	}

	e = newEnv(t, nil)
	smi = filepath.Join(e.ctr, "usr/bin/nvidia-smi")
	if err := os.MkdirAll(filepath.Dir(smi), 0o755); err != nil {
		t.Fatal(err)
	}
	src := writeFile(t, t.TempDir(), "smi.c", `#include <stdio.h>
int main(void) { puts("GPU 0: static"); return 0; }
`, 0o644)
	if out, err := exec.Command("gcc", "-static", "-o", smi, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc -static: %v\n%s", err, out)
	}
	o := e.options("toolkit")
	o.Runner = ExecRunner{}
	if err := e.run(o); err != nil || !strings.Contains(e.log.String(), smi+": GPU 0: static") {
		t.Fatalf("err %v\nlog:\n%s", err, e.log.String())
	}
}
