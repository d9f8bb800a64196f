package validation

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The exporter serves one gauge per check, read from the status files at each scrape.
func TestMetricsServeTheStatusFiles(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("metrics")
	o.MetricsAddr = "127.0.0.1:0"
	writeFile(t, e.out, "driver-ready", "IS_HOST_DRIVER=true\n", 0o644)
	writeFile(t, e.out, "toolkit-ready", "", 0o644)
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, pw); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // drain further log lines
	url := strings.TrimSpace(line[strings.Index(line, "http://"):])

	scrape := func() string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	body := scrape()
	for _, want := range []string{
		"gpu_operator_node_driver_ready 1", "gpu_operator_node_toolkit_ready 1",
		"gpu_operator_node_plugin_ready 0", "gpu_operator_node_cuda_ready 0",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Fatalf("scrape lacks %q:\n%s", want, body)
		}
	}
	if err := os.Remove(filepath.Join(e.out, "driver-ready")); err != nil {
		t.Fatal(err)
	}
	if body := scrape(); !strings.Contains(body, "gpu_operator_node_driver_ready 0\n") {
		t.Fatalf("a removed status file still reads ready:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("metrics did not stop with its context")
	}
}
