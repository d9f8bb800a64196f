package stackcli

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// The release-level hooks walk every node; at client-go's default 5 requests/s a 1,000-node cleanup outlasts helm's
// hook timeout, so their client asks for more.
func TestReleaseHooksClientIsNotPacedAtClientGoDefaults(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: gpu}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	cfg, _, ns, err := clients(flags)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != hookQPS || cfg.Burst != hookBurst {
		t.Errorf("QPS/Burst = %v/%d, want %v/%d", cfg.QPS, cfg.Burst, float32(hookQPS), hookBurst)
	}
	if ns != "gpu" {
		t.Errorf("namespace = %q, want gpu", ns)
	}
}
