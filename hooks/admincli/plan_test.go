package admincli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/placementplan"
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
	root := filepath.Join("..", "..")
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
