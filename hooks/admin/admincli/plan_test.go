package admincli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/placementplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// `plan` on a file of nodes: -f and --set reach the render, -o json the output.
func TestPlanCommand(t *testing.T) {
	var docs []byte
	for _, n := range nodefixtures.Demo() {
		obj := n.Object()
		obj.APIVersion, obj.Kind = "v1", "Node"
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(append(docs, "---\n"...), b...)
	}
	nodes := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(nodes, docs, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "..")
	for set, want := range map[string]string{
		"":                                      "vm-passthrough",
		"global.sandboxWorkloads.enabled=false": "container",
	} {
		var out bytes.Buffer
		cmd := NewCommand(&out)
		args := []string{"plan", "--chart", filepath.Join(root, "charts", "kube-gpu-stack"), "-f", filepath.Join(root, "values", "mixed.yaml"),
			"--nodes", nodes, "-o", "json"}
		if set != "" {
			args = append(args, "--set", set)
		}
		cmd.SetArgs(args)
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		var p placementplan.Plan
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			t.Fatalf("%v:\n%s", err, out.String())
		}
		roles := map[string]string{}
		for _, n := range p.Nodes {
			roles[n.Name] = n.Role
		}
		if len(p.Nodes) != len(nodefixtures.Demo()) || roles["vm-passthrough"] != want || roles["cpu-only"] != "" {
			t.Errorf("--set %q: roles %v, want vm-passthrough's %s", set, roles, want)
		}
	}
}

// `plan` reads the release's driver pods in the namespace status and upgrade status read: -n, else the kubeconfig
// context's, else gpu-operator. It used to skip the context, so a release in the context's namespace was planned as
// a first install on every node.
func TestPlanTakesTheNamespaceOfTheKubeconfigContext(t *testing.T) {
	dir := t.TempDir()
	var nodes []byte
	for _, n := range nodefixtures.Demo() {
		obj := n.Object()
		obj.APIVersion, obj.Kind = "v1", "Node"
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(append(nodes, "---\n"...), b...)
	}
	// a running driver pod of release gpu on gpu-ubuntu2204, in namespace team-gpu
	pods := `apiVersion: v1
kind: Pod
metadata: {name: driver-gpu-ubuntu2204, namespace: team-gpu, labels: {app.kubernetes.io/instance: gpu, app.kubernetes.io/component: driver}}
spec:
  nodeName: gpu-ubuntu2204
  containers: [{name: manager, env: [{name: DRIVER_CONFIG_DIGEST, value: 0ld0ld0ld0ld0ld}]}]
status: {phase: Running}
`
	kubeconfig := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: team-gpu}}]
current-context: c
`
	for name, body := range map[string]string{"nodes.yaml": string(nodes), "pods.yaml": pods, "kubeconfig": kubeconfig} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join("..", "..", "..")
	for _, tc := range []struct {
		args []string
		want string // gpu-ubuntu2204's driver change
	}{
		{nil, placementplan.DriverChange},                                   // the context's namespace holds the pod
		{[]string{"-n", "gpu-operator"}, placementplan.DriverInstall},       // -n wins: no driver pod there
		{[]string{"--kubeconfig", os.DevNull}, placementplan.DriverInstall}, // no context: gpu-operator
	} {
		var out bytes.Buffer
		cmd := NewCommand(&out)
		args := []string{"plan", "--chart", filepath.Join(root, "charts", "kube-gpu-stack"), "--kubeconfig", filepath.Join(dir, "kubeconfig"),
			"--nodes", filepath.Join(dir, "nodes.yaml"), "--pods", filepath.Join(dir, "pods.yaml"), "-o", "json"}
		cmd.SetArgs(append(args, tc.args...))
		if err := cmd.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var p placementplan.Plan
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			t.Fatalf("%v:\n%s", err, out.String())
		}
		for _, n := range p.Nodes {
			if n.Name == "gpu-ubuntu2204" && n.DriverChange != tc.want {
				t.Errorf("plan %v: gpu-ubuntu2204's driver %q, want %q", tc.args, n.DriverChange, tc.want)
			}
		}
	}
}

// plan's help says which namespace it reads, as status's and upgrade status's do.
func TestPlanHelpNamesItsNamespace(t *testing.T) {
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"plan", "--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "kubeconfig context") || !strings.Contains(out.String(), "gpu-operator") {
		t.Errorf("plan --help does not say which namespace it reads:\n%s", out.String())
	}
}

// TestPlanSuggestsTheKeyATypoMeant: a key the chart's schema does not allow fails the plan as it fails helm, and
// the message names the closest key allowed there, in the umbrella's values and in an operand's.
func TestPlanSuggestsTheKeyATypoMeant(t *testing.T) {
	nodes := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(nodes, []byte("apiVersion: v1\nkind: List\nitems: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "..")
	var out bytes.Buffer
	cmd := NewCommand(&out)
	cmd.SetArgs([]string{"plan", "--chart", filepath.Join(root, "charts", "kube-gpu-stack"), "--nodes", nodes,
		"--set", "dcgm.imagee.tag=x", "--set", "driver.upgradePolicy.maxUnavailble=2"})
	err := cmd.ExecuteContext(t.Context())
	for _, want := range []string{`"imagee": did you mean "image"?`, `"maxUnavailble": did you mean "maxUnavailable"?`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("plan with typos: %v; want it to say %s", err, want)
		}
	}
}
