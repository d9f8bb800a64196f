package incluster

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// forbidden are the module paths the image's binary must not link: the helm SDK and the registry client are most
// of the admin CLI's size, and nothing in the cluster renders a chart or pulls an image.
var forbidden = []string{"helm.sh/helm/", "github.com/google/go-containerregistry/"}

// linked lists the forbidden packages in pkg's import graph, as the image builds it (static, linux, each of its
// architectures).
func linked(t *testing.T, pkg string) []string {
	t.Helper()
	var found []string
	for _, arch := range []string{"amd64", "arm64"} {
		cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", pkg)
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s (%s): %v\n%s", pkg, arch, err, stderr.String())
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if strings.HasPrefix(dep, f) {
					found = append(found, arch+": "+dep)
				}
			}
		}
	}
	return found
}

func TestImageBinaryLinksNoHelmNorRegistryClient(t *testing.T) {
	const module = "github.com/kube-gpu-stack/kube-gpu-stack/hooks/cmd/"
	if found := linked(t, module+"in-cluster"); len(found) > 0 {
		t.Fatalf("the image's binary (hooks/cmd/in-cluster) links %d forbidden packages; move the command that needs them to hooks/admin/admincli:\n%s",
			len(found), strings.Join(found, "\n"))
	}
	// the admin CLI does link both: the check above would see them
	admin := strings.Join(linked(t, module+"kube-gpu-stack"), "\n")
	for _, f := range forbidden {
		if !strings.Contains(admin, f) {
			t.Errorf("the admin CLI links nothing under %s: the check has nothing to find", f)
		}
	}
}

func TestSelectByNameOrFirstArgument(t *testing.T) {
	for _, tc := range []struct {
		argv     []string
		want     string
		wantArgs string
	}{
		{[]string{"/usr/local/bin/validator", "wait", "toolkit-ready"}, "validator", "wait toolkit-ready"},
		{[]string{"driver-manager", "uninstall-driver"}, "driver-manager", "uninstall-driver"},
		{[]string{"kube-gpu-stack", "validator", "health"}, "validator", "health"},
		{[]string{"/usr/local/bin/kube-gpu-stack", "driver-manager", "detect"}, "driver-manager", "detect"},
		{[]string{"kube-gpu-stack", "check", "--timeout", "1m"}, "kube-gpu-stack", "check --timeout 1m"},
		{[]string{"kube-gpu-stack"}, "kube-gpu-stack", ""},
		{nil, "kube-gpu-stack", ""},
		// a link's own arguments are never taken as a command name
		{[]string{"validator", "driver-manager"}, "validator", "driver-manager"},
		// any other name (go run, a renamed copy) is the release-level binary
		{[]string{"/tmp/go-build/exe/in-cluster", "seed-label"}, "kube-gpu-stack", "seed-label"},
	} {
		name, args := Select(tc.argv)
		if name != tc.want || strings.Join(args, " ") != tc.wantArgs || args == nil {
			t.Errorf("%q: %s with %q, want %s with %q", tc.argv, name, args, tc.want, tc.wantArgs)
		}
	}
}
