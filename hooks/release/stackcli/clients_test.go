package stackcli

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// The release-level hooks walk every node; at client-go's default 5 requests/s a 1,000-node cleanup outlasts helm's
// hook timeout, so their client asks for more.
func TestReleaseHooksClientIsNotPacedAtClientGoDefaults(t *testing.T) {
	cfg, _, ns, err := clients(flagsFor(t, "https://127.0.0.1:6443"))
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

// The hooks' clientset asks for protobuf (a 1,000-node gate decodes thousands of pods and nodes), while the config
// handed to dynamic clients stays JSON, the only form custom resources have.
func TestHooksClientsetSpeaksProtobuf(t *testing.T) {
	var mu sync.Mutex
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = r.Header.Get("Accept")
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer srv.Close()
	cfg, client, _, err := clients(flagsFor(t, srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = client.CoreV1().Pods("gpu").Get(t.Context(), "p", metav1.GetOptions{})
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasPrefix(accept, "application/vnd.kubernetes.protobuf") {
		t.Errorf("the clientset asked for %q, want protobuf first", accept)
	}
	if strings.Contains(cfg.ContentType, "protobuf") || strings.Contains(cfg.AcceptContentTypes, "protobuf") {
		t.Errorf("the shared config asks for protobuf (%q, %q): dynamic clients would send it for custom resources", cfg.ContentType, cfg.AcceptContentTypes)
	}
}

// flagsFor are kubeconfig flags naming a kubeconfig for server, with namespace gpu.
func flagsFor(t *testing.T, server string) *genericclioptions.ConfigFlags {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: gpu}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	return flags
}
