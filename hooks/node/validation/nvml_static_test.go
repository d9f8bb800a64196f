//go:build !cgo

package validation

import (
	"strings"
	"testing"
)

// fakeNVML has nothing to fake in a static build: the checks get the build's own probe, as in the image.
type fakeNVML struct{}

func newFakeNVML() *fakeNVML { return &fakeNVML{} }

func (*fakeNVML) probe() NVMLProbe { return nil }

func TestStaticBuildDriverCheckRestsOnNvidiaSmi(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("driver")
	installDriver(t, e.host)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{out: "| NVIDIA-SMI 595.91.07 |"}
	if err := e.run(o); err != nil {
		t.Fatalf("driver check: %v\nlog:\n%s", err, e.log.String())
	}
	if got := e.annotation("driver"); got != "ready" {
		t.Fatalf("annotation %q", got)
	}
	if got, ok := e.status("driver-ready"); !ok || !strings.HasPrefix(got, "IS_HOST_DRIVER=true\n") {
		t.Fatalf("driver-ready %v: %q", ok, got)
	}
	if log := e.log.String(); !strings.Contains(log, "driver: NVML probe not built in (CGO_ENABLED=0); nvidia-smi result used") {
		t.Fatalf("the log does not say NVML was left out:\n%s", log)
	}

	// nvidia-smi is still the check: when it fails, so does the driver check
	e = newEnv(t, nil)
	installDriver(t, e.host)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{out: "NVIDIA-SMI has failed\n", err: exitError(9)}
	if err := e.run(e.options("driver")); err == nil || !strings.Contains(e.annotation("driver"), "failed: nvidia-smi under") {
		t.Fatalf("err %v, annotation %q", err, e.annotation("driver"))
	}
}

func TestStaticBuildToolkitCheckRestsOnNvidiaSmi(t *testing.T) {
	e := newEnv(t, nil)
	e.runner.answers[writeFile(t, e.ctr, "usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755)] = answer{out: "GPU 0: NVIDIA H100"}
	if err := e.run(e.options("toolkit")); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.status("toolkit-ready"); !ok || e.annotation("toolkit") != "ready" {
		t.Fatalf("toolkit-ready %v, annotation %q", ok, e.annotation("toolkit"))
	}
	if !strings.Contains(e.log.String(), ErrNVMLNotBuiltIn.Error()) {
		t.Fatalf("the log does not say NVML was left out:\n%s", e.log.String())
	}
}
