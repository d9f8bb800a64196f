package admincli

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMigrateCommand runs `kube-gpu-stack migrate -f ... -o ...` as a user would: the values go to the file, the
// report to standard output.
func TestMigrateCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "values.yaml")
	var stdout bytes.Buffer
	cmd := NewCommand(&stdout)
	cmd.SetArgs([]string{"migrate", "-f", "../gpumigrate/testdata/operator-typical.yaml", "-o", out})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tag: 570.195.03", "sandboxWorkloads:"} {
		if !strings.Contains(string(values), want) {
			t.Errorf("values lack %q:\n%s", want, values)
		}
	}
	for _, want := range []string{"driver.version", "-> driver.image.tag", "someOperatorOption", "no place in kube-gpu-stack"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, stdout.String())
		}
	}

	cmd = NewCommand(&stdout)
	cmd.SetArgs([]string{"migrate"})
	cmd.SetErr(&bytes.Buffer{})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--from-cluster") {
		t.Errorf("migrate without input: %v", err)
	}
}

// `migrate --from-cluster` on a cluster where no GPU Operator runs used to exit 0 with values made from nothing. It
// fails, naming the ClusterPolicy it looked for and the cluster it asked.
func TestMigrateFromClusterWithoutTheOperator(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/nodes" {
			fmt.Fprint(w, `{"apiVersion":"v1","kind":"NodeList","items":[]}`)
			return
		}
		w.WriteHeader(http.StatusNotFound) // no nvidia.com resources: the operator's CRDs are not installed
		fmt.Fprintf(w, `{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404,"message":"%s not found"}`, r.URL.Path)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cmd := NewCommand(&stdout)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"migrate", "--from-cluster", "--kubeconfig", kubeconfig, "-o", filepath.Join(t.TempDir(), "values.yaml")})
	err := cmd.Execute()
	if err == nil {
		t.Fatalf("exit 0 on a cluster without a ClusterPolicy; report:\n%s", stdout.String())
	}
	for _, want := range []string{`ClusterPolicy "cluster-policy"`, "nvidia.com/v1", srv.URL} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// A full copy of an older GPU Operator release's values.yaml is recognised, and its defaults (v25.10.1's CUDA base
// image for the VFIO manager among them) are dropped, not pinned; --from-version names the release, and an unknown
// one fails naming those migrate knows.
func TestMigrateFromVersion(t *testing.T) {
	const v25 = "../gpumigrate/testdata/gpu-operator-v25.10.1/values.yaml"
	for args, want := range map[string][]string{
		"":                       {"GPU Operator release: v25.10.1 (recognised: ", "vfioManager", "the GPU Operator v25.10.1 default"},
		"--from-version=25.10.1": {"GPU Operator release: v25.10.1 (given with --from-version)", "the GPU Operator v25.10.1 default"},
		"--from-version=v24.9.2": {"GPU Operator release: v24.9.2 (given with --from-version; mind that its operand image versions look like v25.10.1's"},
	} {
		out := filepath.Join(t.TempDir(), "values.yaml")
		var stdout bytes.Buffer
		cmd := NewCommand(&stdout)
		cmd.SetArgs(append([]string{"migrate", "-f", v25, "-o", out}, strings.Fields(args)...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("migrate %s: %v", args, err)
		}
		for _, w := range want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("migrate %s: the report lacks %q:\n%s", args, w, stdout.String())
			}
		}
		if values, _ := os.ReadFile(out); args != "--from-version=v24.9.2" && strings.Contains(string(values), "cuda") {
			t.Errorf("migrate %s: the values name the v25.10.1 default CUDA image:\n%s", args, values)
		}
	}

	cmd := NewCommand(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"migrate", "-f", v25, "--from-version", "25.3.2"})
	err := cmd.Execute()
	if err == nil {
		t.Fatal("--from-version 25.3.2, a release migrate has no defaults of, was accepted")
	}
	for _, w := range []string{"--from-version 25.3.2", "v24.6.2, v24.9.2, v25.3.4, v25.10.1, v26.3.3, v26.7.0"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q: %v", w, err)
		}
	}
}
