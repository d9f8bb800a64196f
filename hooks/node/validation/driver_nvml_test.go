//go:build cgo

package validation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The driver and toolkit checks with NVML (go-nvml and its mock need cgo; nvml_static_test.go covers the static
// build).

func TestDriverCheck(t *testing.T) {
	smiFailure := answer{
		out: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
		err: exitError(9),
	}
	tests := []struct {
		name  string
		setup func(e *env, o *Options)
		// want: the annotation; files: status files and their content ("*" any); absent: files that must not exist
		want   string
		files  map[string]string
		absent []string
	}{{
		name: "host driver",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{out: "| NVIDIA-SMI 595.91.07 |"}
			e.nvml.count = 2
		},
		want: "ready",
		files: map[string]string{"driver-ready": "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n" +
			"NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"},
		absent: []string{"nvidia-fs-ready", "gdrcopy-ready", "nvidia-peermem-ready"},
	}, {
		name: "containerized driver with GDS loaded and RDMA off",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			writeFile(e.t, e.out, DriverCtrReadyFile, "GPU_DIRECT_RDMA_ENABLED=false\nGDS_ENABLED=true\nGDRCOPY_ENABLED=false\n", 0o644)
			writeFile(e.t, e.host, "proc/modules", "nvidia_fs 270336 0 - Live 0x0\nnvidia 1 2 - Live 0x0\n", 0o644)
		},
		want: "ready",
		files: map[string]string{
			"driver-ready": "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=@driver\nDRIVER_ROOT_CTR_PATH=/driver-root\n" +
				"NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n",
			"nvidia-fs-ready": "",
		},
		absent: []string{"nvidia-peermem-ready", "gdrcopy-ready"},
	}, {
		name: "containerized driver keeping its own dev at another host path",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.driver)
			writeFile(e.t, e.driver, "dev/nvidiactl", "", 0o644)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			writeFile(e.t, e.out, DriverCtrReadyFile, "GDS_ENABLED=false\n", 0o644)
			o.DriverInstallDirHostPath = "/run/nvidia/driver"
		},
		want: "ready",
		files: map[string]string{"driver-ready": "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/driver-root\n" +
			"NVIDIA_DEV_ROOT=/run/nvidia/driver\nDEV_ROOT_CTR_PATH=/driver-root\n"},
	}, {
		name: "containerized driver whose peermem module is not loaded: driver-ready written, check not passed",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			writeFile(e.t, e.out, DriverCtrReadyFile, "GPU_DIRECT_RDMA_ENABLED=true\nGDRCOPY_ENABLED=true\n", 0o644)
			writeFile(e.t, e.host, "proc/modules", "gdrdrv 1 0 - Live 0x0\n", 0o644)
		},
		want:   "failed: driver ready; kernel module nvidia_peermem (GPU_DIRECT_RDMA_ENABLED=true) not loaded yet (@host/proc/modules)",
		files:  map[string]string{"driver-ready": "*", "gdrcopy-ready": ""},
		absent: []string{"nvidia-peermem-ready"},
	}, {
		name: "no driver anywhere",
		want: "failed: no host driver (no nvidia-smi under @host in usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin) " +
			"and the driver container is not ready (no .driver-ctr-ready in @out)",
		absent: []string{"driver-ready"},
	}, {
		name: "nvidia-smi cannot talk to the driver",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.driver)
			writeFile(e.t, e.out, DriverCtrReadyFile, "GDS_ENABLED=false\n", 0o644)
			e.runner.answers["/usr/bin/nvidia-smi"] = smiFailure
		},
		want:   "failed: nvidia-smi under @driver/usr/bin failed: exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
		absent: []string{"driver-ready"},
	}, {
		// the driver manager's lookup: a host nvidia-smi that fails is a leftover, and the containerized driver is
		// the node's
		name: "a host nvidia-smi that fails is no host driver",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			e.runner.answers[filepath.Join(e.host, "usr/bin/nvidia-smi")] = smiFailure
			installDriver(e.t, e.driver)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			writeFile(e.t, e.out, DriverCtrReadyFile, "GDS_ENABLED=false\n", 0o644)
		},
		want: "ready",
		files: map[string]string{"driver-ready": "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=@driver\nDRIVER_ROOT_CTR_PATH=/driver-root\n" +
			"NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"},
	}, {
		name: "Flatcar host driver in /opt/bin",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			writeFile(e.t, e.host, "opt/bin/nvidia-smi", "#!/bin/sh\n", 0o755)
			if err := os.Remove(filepath.Join(e.host, "usr/bin/nvidia-smi")); err != nil {
				e.t.Fatal(err)
			}
			e.runner.answers[filepath.Join(e.host, "opt/bin/nvidia-smi")] = answer{}
		},
		want: "ready",
		files: map[string]string{"driver-ready": "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n" +
			"NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"},
	}, {
		name: "NVML sees no GPU",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			e.nvml.count = 0
		},
		want:   "failed: NVML (@host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07) sees no GPU",
		absent: []string{"driver-ready"},
	}, {
		name: "NVML cannot initialise",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			e.nvml.initRet = nvml.ERROR_DRIVER_NOT_LOADED
		},
		want:   "failed: NVML (@host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07) init: ERROR_DRIVER_NOT_LOADED",
		absent: []string{"driver-ready"},
	}, {
		name: "driver container ready but its root has no nvidia-smi",
		setup: func(e *env, o *Options) {
			writeFile(e.t, e.out, DriverCtrReadyFile, "", 0o644)
		},
		want: "failed: the driver container is ready (.driver-ctr-ready) but its root has no nvidia-smi: no executable nvidia-smi under @driver in " +
			"usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin: file does not exist",
	}, {
		name: "skip GPU init: nvidia-smi --version only, no NVML",
		setup: func(e *env, o *Options) {
			installDriver(e.t, e.host)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			e.nvml.initRet = nvml.ERROR_UNKNOWN // would fail if used
			o.SkipGPUInit = true
		},
		want:  "ready",
		files: map[string]string{"driver-ready": "*"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			o := e.options("driver")
			// a stale result of an earlier run, removed before the check decides
			writeFile(t, e.out, "driver-ready", "IS_HOST_DRIVER=stale\n", 0o644)
			writeFile(t, e.out, "nvidia-peermem-ready", "", 0o644)
			if tc.setup != nil {
				tc.setup(e, o)
			}
			err := e.run(o)
			expand := strings.NewReplacer("@host", e.host, "@driver", e.driver, "@out", e.out).Replace
			want := expand(tc.want)
			if got := e.annotation("driver"); got != want {
				t.Fatalf("annotation:\n got %q\nwant %q\nlog:\n%s", got, want, e.log.String())
			}
			if (err != nil) != strings.HasPrefix(want, "failed") {
				t.Fatalf("Run error %v, annotation %q", err, want)
			}
			if err != nil && !strings.Contains(err.Error(), strings.TrimPrefix(want, "failed: ")) {
				t.Fatalf("error %q does not carry the reason", err)
			}
			for name, content := range tc.files {
				got, ok := e.status(name)
				if !ok {
					t.Fatalf("%s not written", name)
				}
				if content != "*" && got != expand(content) {
					t.Fatalf("%s:\n%s\nwant:\n%s", name, got, expand(content))
				}
			}
			for _, name := range tc.absent {
				if _, ok := e.status(name); ok {
					t.Fatalf("%s exists", name)
				}
			}
		})
	}
}

func TestDriverCheckRunsTheRootsOwnNvidiaSmiAndNVML(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("driver")
	installDriver(t, e.driver)
	writeFile(t, e.out, DriverCtrReadyFile, "", 0o644)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if want := []Command{{Root: e.driver, Path: "/usr/bin/nvidia-smi"}}; !slices.EqualFunc(e.runner.calls, want, commandEqual) {
		t.Fatalf("ran %v, want %v", e.runner.calls, want)
	}
	if want := filepath.Join(e.driver, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07"); !slices.Equal(e.nvml.opened, []string{want}) {
		t.Fatalf("NVML opened %v, want %s", e.nvml.opened, want)
	}

	e = newEnv(t, nil)
	o = e.options("driver")
	o.SkipGPUInit = true
	installDriver(t, e.host)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if want := []Command{{Root: e.host, Path: "/usr/bin/nvidia-smi", Args: []string{"--version"}}}; !slices.EqualFunc(e.runner.calls, want, commandEqual) {
		t.Fatalf("ran %v, want %v", e.runner.calls, want)
	}
	if len(e.nvml.opened) != 0 {
		t.Fatalf("NVML opened with DRIVER_VALIDATION_SKIP_GPU_INIT: %v", e.nvml.opened)
	}
}

func TestToolkitCheck(t *testing.T) {
	e := newEnv(t, nil)
	smi := writeFile(t, e.ctr, "usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755) // a script runs as it is
	e.runner.answers[smi] = answer{out: "GPU 0: NVIDIA H100"}
	e.nvml.count = 8
	if err := e.run(e.options("toolkit")); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.status("toolkit-ready"); !ok || e.annotation("toolkit") != "ready" {
		t.Fatalf("toolkit-ready %v, annotation %q", ok, e.annotation("toolkit"))
	}
	if !slices.Equal(e.nvml.opened, []string{"libnvidia-ml.so.1"}) || !strings.Contains(e.log.String(), "8 GPU(s), driver 595.91.07") {
		t.Fatalf("NVML opened %v; log %s", e.nvml.opened, e.log.String())
	}

	e = newEnv(t, nil) // nvidia-smi was not injected into the container
	err := e.run(e.options("toolkit"))
	want := "failed: nvidia-smi was not injected into this container of the nvidia runtime (no executable nvidia-smi under " + e.ctr +
		" in usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin: file does not exist): the container toolkit did not inject the driver"
	if err == nil || e.annotation("toolkit") != want {
		t.Fatalf("err %v, annotation %q", err, e.annotation("toolkit"))
	}
	if _, ok := e.status("toolkit-ready"); ok {
		t.Fatal("toolkit-ready written")
	}
}
