package validation

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func commandEqual(a, b Command) bool {
	return a.Root == b.Root && a.Path == b.Path && slices.Equal(a.Args, b.Args)
}

func TestDriverReadyIsSourceableByShell(t *testing.T) {
	d := &driverInfo{root: "/run/nvidia/driver", rootHostPath: "/run/nvidia/my driver's", devRootHostPath: "/", devRootCtr: "/host",
		consumerRoot: ConsumerDriverRoot, consumerDevRoot: ConsumerHostRoot}
	got := string(d.env())
	want := "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT='/run/nvidia/my driver'\\''s'\nDRIVER_ROOT_CTR_PATH=/driver-root\nNVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n"
	if got != want {
		t.Fatalf("driver-ready:\n%s\nwant:\n%s", got, want)
	}
}

// driver-ready is sourced by the toolkit, device plugin and MIG manager, which mount the driver install dir at
// /driver-root and the host's / at /host: the container paths it names are theirs, not the validator's mounts.
func TestDriverReadyNamesTheConsumersMounts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(e *env)
		driver  string
		devRoot string
	}{
		{"host driver", func(e *env) { installDriver(e.t, e.host) }, "/host", "/host"},
		{"containerized driver", func(e *env) {
			installDriver(e.t, e.driver)
			writeFile(e.t, e.out, DriverCtrReadyFile, "", 0o644)
		}, "/driver-root", "/host"},
		{"containerized driver with its own dev", func(e *env) {
			installDriver(e.t, e.driver)
			writeFile(e.t, e.driver, "dev/nvidiactl", "", 0o644)
			writeFile(e.t, e.out, DriverCtrReadyFile, "", 0o644)
		}, "/driver-root", "/driver-root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			o := e.options("driver")
			o.SkipGPUInit = true
			tc.setup(e)
			e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
			if err := e.run(o); err != nil {
				t.Fatalf("%v\n%s", err, e.log.String())
			}
			got, _ := e.status("driver-ready")
			env := parseEnv([]byte(got))
			if env["DRIVER_ROOT_CTR_PATH"] != tc.driver || env["DEV_ROOT_CTR_PATH"] != tc.devRoot {
				t.Fatalf("driver-ready:\n%s\nwant DRIVER_ROOT_CTR_PATH=%s DEV_ROOT_CTR_PATH=%s", got, tc.driver, tc.devRoot)
			}
		})
	}
}

func TestModuleChecks(t *testing.T) {
	for _, tc := range []struct {
		component, file, modules, want string
	}{
		{"rdma", "nvidia-peermem-ready", "nvidia_peermem 1 0 - Live 0x0\n", "ready"},
		{"gds", "nvidia-fs-ready", "nvidia_fs 1 0 - Live 0x0\n", "ready"},
		{"gdrcopy", "gdrcopy-ready", "gdrdrv 1 0 - Live 0x0\n", "ready"},
		{"gdrcopy", "gdrcopy-ready", "nvidia 1 0 - Live 0x0\n", "failed: kernel module gdrdrv is not loaded (@host/proc/modules)"},
	} {
		e := newEnv(t, nil)
		writeFile(t, e.host, "proc/modules", tc.modules, 0o644)
		err := e.run(e.options(tc.component))
		want := strings.ReplaceAll(tc.want, "@host", e.host)
		if got := e.annotation(tc.component); got != want || (err == nil) != (want == "ready") {
			t.Fatalf("%s: annotation %q, err %v; want %q", tc.component, got, err, want)
		}
		if _, ok := e.status(tc.file); ok != (want == "ready") {
			t.Fatalf("%s: %s written = %v", tc.component, tc.file, ok)
		}
	}
}

func TestParseEnv(t *testing.T) {
	got := parseEnv([]byte("# written by the startup probe\nexport GDS_ENABLED=\"true\"\nGDRCOPY_ENABLED='false'\n\nbroken line\n"))
	if len(got) != 2 || got["GDS_ENABLED"] != "true" || got["GDRCOPY_ENABLED"] != "false" {
		t.Fatalf("parseEnv = %v", got)
	}
	// a GPU Operator driver's startup probe writes YAML (met during a takeover); a KEY=VALUE value may hold a colon
	got = parseEnv([]byte("GDRCOPY_ENABLED: false\nGDS_ENABLED: \"true\"\nGPU_DIRECT_RDMA_ENABLED: true\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver:x\nURL=http://a\n"))
	want := map[string]string{"GDRCOPY_ENABLED": "false", "GDS_ENABLED": "true", "GPU_DIRECT_RDMA_ENABLED": "true",
		"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver:x", "URL": "http://a"}
	if !maps.Equal(got, want) {
		t.Fatalf("parseEnv = %v, want %v", got, want)
	}
}

func TestDescribeRun(t *testing.T) {
	if got := describeRun([]byte("\n  first line\nsecond\n"), exitError(3)); got != "exit 3: first line" {
		t.Fatalf("got %q", got)
	}
	if got := describeRun(nil, exitError(1)); got != "exit 1" {
		t.Fatalf("got %q", got)
	}
	if got := describeRun(nil, errors.New("fork/exec /usr/bin/nvidia-smi: permission denied")); got != "fork/exec /usr/bin/nvidia-smi: permission denied" {
		t.Fatalf("got %q", got)
	}
}

func TestExecRunnerReportsExitCodeAndOutput(t *testing.T) {
	out, err := ExecRunner{}.Run(t.Context(), Command{Path: "sh", Args: []string{"-c", "echo NVIDIA-SMI has failed; exit 9"}})
	if got := describeRun(out, err); got != "exit 9: NVIDIA-SMI has failed" {
		t.Fatalf("got %q", got)
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Fatal(err)
	}
}

// probeFunc is an NVMLProbe from a function: any build can inject its own probe.
type probeFunc func(string) (int, string, error)

func (f probeFunc) Probe(lib string) (int, string, error) { return f(lib) }

func TestDriverCheckReportsTheInjectedProbe(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("driver")
	var probed []string
	o.NVML = probeFunc(func(lib string) (int, string, error) {
		probed = append(probed, lib)
		return 0, "", errors.New("NVML (" + lib + ") init: ERROR_NO_PERMISSION")
	})
	installDriver(t, e.host)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
	lib := filepath.Join(e.host, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07")
	if err := e.run(o); err == nil {
		t.Fatal("driver check passed although NVML failed")
	}
	if want := "failed: NVML (" + lib + ") init: ERROR_NO_PERMISSION"; e.annotation("driver") != want {
		t.Fatalf("annotation %q, want %q", e.annotation("driver"), want)
	}
	if !slices.Equal(probed, []string{lib}) {
		t.Fatalf("probed %v, want [%s]", probed, lib)
	}

	e = newEnv(t, nil)
	o = e.options("driver")
	o.NVML = probeFunc(func(string) (int, string, error) { return 4, "595.91.07", nil })
	installDriver(t, e.host)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.log.String(), "host driver under "+e.host+", version 595.91.07, 4 GPU(s) answers") {
		t.Fatalf("log:\n%s", e.log.String())
	}
}
