package tests

import (
	"fmt"
	"strings"
	"testing"
)

// projectImageRepo is the repository of the project's image (global.stackImage); a registry override keeps it.
const projectImageRepo = "kube-gpu-stack/kube-gpu-stack"

// runAsUser is the container's user as the kubelet resolves it: the container's runAsUser, else the pod's, else
// the image's (nil: the project's image says USER 65532).
func runAsUser(pod, c map[string]any) any {
	for _, sc := range []any{c["securityContext"], pod["securityContext"]} {
		if m, ok := sc.(map[string]any); ok {
			if u, ok := m["runAsUser"]; ok {
				return u
			}
		}
	}
	return nil
}

// needsPrivileges: privileged, or capabilities added.
func needsPrivileges(c map[string]any) bool {
	sc, _ := c["securityContext"].(map[string]any)
	if p, _ := sc["privileged"].(bool); p {
		return true
	}
	caps, _ := sc["capabilities"].(map[string]any)
	add, _ := caps["add"].([]any)
	return len(add) > 0
}

// TestProjectImagePrivilegesRunAsRoot: a non-root process has no effective capabilities even in a privileged
// container (CapEff 0), so every container of the project's image (USER 65532) that is privileged or adds
// capabilities must run as root; every other one runs as the image's non-root user.
func TestProjectImagePrivilegesRunAsRoot(t *testing.T) {
	seen := map[string]int{}
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, []string{p.file}, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					img, _ := c["image"].(string)
					if !strings.Contains(img, "/"+projectImageRepo) {
						continue
					}
					name := fmt.Sprintf("%s: %s container %s", p.name, where, c["name"])
					user := runAsUser(ps, c)
					if needsPrivileges(c) {
						seen["privileged"]++
						if fmt.Sprint(user) != "0" {
							t.Errorf("%s is privileged or adds capabilities but runs as user %v: it gets no capabilities; set runAsUser: 0", name, orImage(user))
						}
						continue
					}
					seen["unprivileged"]++
					if fmt.Sprint(user) == "0" {
						t.Errorf("%s needs no privileges but runs as root; keep the image's user 65532", name)
					}
				}
			}
		}
	}
	if seen["privileged"] == 0 || seen["unprivileged"] == 0 {
		t.Fatalf("found %d privileged and %d unprivileged containers of the project's image: is the image matched?", seen["privileged"], seen["unprivileged"])
	}
}

func orImage(u any) any {
	if u == nil {
		return "65532 (the image's)"
	}
	return u
}
