package validatorcli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

func TestWaitAndCleanupThroughTheCommand(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "toolkit-ready"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "wait", "--dir", dir, "--interval", "10ms", "toolkit-ready")
	if err != nil || !strings.Contains(out, "toolkit-ready is present") {
		t.Fatalf("wait: %v, %q", err, out)
	}
	out, err = run(t, "cleanup", "--dir", dir, "toolkit-ready", "cuda-ready")
	if err != nil || !strings.Contains(out, "removed 1 of 2") {
		t.Fatalf("cleanup: %v, %q", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "toolkit-ready")); !os.IsNotExist(err) {
		t.Fatalf("toolkit-ready still there: %v", err)
	}
}

func TestWaitWithoutFilesFails(t *testing.T) {
	if _, err := run(t, "wait", "--dir", t.TempDir()); err == nil {
		t.Fatal("wait with no file succeeded")
	}
}

func TestWaitTimesOutWithAClearError(t *testing.T) {
	_, err := run(t, "wait", "--dir", t.TempDir(), "--interval", "5ms", "--timeout", "20ms", "driver-ready")
	if err == nil || !strings.Contains(err.Error(), "driver-ready") {
		t.Fatalf("want a timeout naming driver-ready, got %v", err)
	}
}

// fakeRunner answers every command with success.
type fakeRunner struct{ calls []validation.Command }

func (f *fakeRunner) Run(_ context.Context, c validation.Command) ([]byte, error) {
	f.calls = append(f.calls, c)
	return nil, nil
}

// The chart's environment reaches the check: roots, the validations dir, skip-GPU-init.
func TestDriverComponentReadsTheChartsEnvironment(t *testing.T) {
	host, out := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "usr/bin/nvidia-smi"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "")
	t.Setenv("OUTPUT_DIR", out)
	t.Setenv("HOST_ROOT", host)
	t.Setenv("DRIVER_VALIDATION_SKIP_GPU_INIT", "true")
	t.Setenv("WITH_WAIT", "false")
	runner := &fakeRunner{}
	var buf bytes.Buffer
	cmd := NewCommandWith(&buf, func(o *validation.Options) { o.Runner = runner })
	cmd.SetArgs([]string{"driver"})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if len(runner.calls) != 1 || runner.calls[0].Root != host || strings.Join(runner.calls[0].Args, " ") != "--version" {
		t.Fatalf("ran %+v", runner.calls)
	}
	got, err := os.ReadFile(filepath.Join(out, "driver-ready"))
	if err != nil || !strings.Contains(string(got), "DRIVER_ROOT_CTR_PATH=/host\n") {
		t.Fatalf("driver-ready %q, %v", got, err)
	}
	if !strings.Contains(buf.String(), "driver: not recording the outcome on the Node") || !strings.Contains(buf.String(), "driver: ready") {
		t.Fatalf("log:\n%s", buf.String())
	}
}

func TestBadEnvironmentNamesTheVariable(t *testing.T) {
	for env, want := range map[string]string{
		"WITH_WAIT":                         `WITH_WAIT="sometimes": want true or false`,
		"SLEEP_INTERVAL_SECONDS":            `SLEEP_INTERVAL_SECONDS="sometimes": want a positive number of seconds`,
		"METRICS_PORT":                      `METRICS_PORT="sometimes": want a port number`,
		"DISABLE_DEV_CHAR_SYMLINK_CREATION": `DISABLE_DEV_CHAR_SYMLINK_CREATION="sometimes": want true or false`,
		"DEFAULT_GPU_WORKLOAD_CONFIG":       `DEFAULT_GPU_WORKLOAD_CONFIG "sometimes"`,
		"DRA_NODE_SELECTOR":                 `DRA_NODE_SELECTOR="sometimes": want a node selector as JSON`,
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			t.Setenv(env, "sometimes")
			_, err := run(t, "vfio-pci", "--dir", t.TempDir())
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err %v, want %q", err, want)
			}
		})
	}
}

func TestCUDAWithoutAPIAccessSaysWhatItNeeds(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("OPERATOR_NAMESPACE", "")
	_, err := run(t, "cuda", "--dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "needs API access (in-cluster config), NODE_NAME, OPERATOR_NAMESPACE") {
		t.Fatalf("err %v", err)
	}
}

func TestEveryComponentIsASubcommand(t *testing.T) {
	cmd := NewCommand(&bytes.Buffer{})
	for _, c := range validation.Components {
		sub, _, err := cmd.Find([]string{c})
		if err != nil || sub.Name() != c || componentHelp[c] == "" {
			t.Errorf("component %s: %v %v", c, sub, err)
		}
	}
}

func TestHealthReadsThePolicyFromTheEnvironment(t *testing.T) {
	t.Setenv("NODE_NAME", "gpu-node")
	t.Setenv("HEALTH_FATAL_XIDS", "48,79")
	t.Setenv("HEALTH_APPLICATION_XIDS", "13")
	t.Setenv("HEALTH_WATCHES", "eccDoubleBit, rowRemapFailure")
	t.Setenv("HEALTH_CONDITION_TYPE", "example.com/GPUOK")
	t.Setenv("HEALTH_TAINT", "nvidia.com/gpu-unhealthy:NoExecute")
	t.Setenv("HEALTH_SOURCE", "dcgm-exporter")
	t.Setenv("HEALTH_DCGM_EXPORTER_URL", "http://nvidia-dcgm-exporter-node.gpu-operator.svc:9400/metrics")
	o, err := HealthOptionsFromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	p := o.Policy
	if o.NodeName != "gpu-node" || len(p.Fatal) != 2 || p.Fatal[1] != 79 || len(p.Application) != 1 || len(p.Watches) != 2 ||
		p.ConditionType != "example.com/GPUOK" || p.Taint == nil || p.Taint.Effect != "NoExecute" ||
		o.Source != "dcgm-exporter" || o.ExporterURL != "http://nvidia-dcgm-exporter-node.gpu-operator.svc:9400/metrics" {
		t.Fatalf("options %+v, policy %+v", o, p)
	}
	t.Setenv("HEALTH_FATAL_XIDS", "48,seventy-nine")
	if _, err := HealthOptionsFromEnv(os.Getenv); err == nil || !strings.Contains(err.Error(), "HEALTH_FATAL_XIDS") {
		t.Fatalf("err %v", err)
	}
	t.Setenv("HEALTH_FATAL_XIDS", "48")
	t.Setenv("HEALTH_TAINT", "no-effect")
	if _, err := HealthOptionsFromEnv(os.Getenv); err == nil || !strings.Contains(err.Error(), "HEALTH_TAINT") {
		t.Fatalf("err %v", err)
	}
}
