package chart

import (
	corev1 "k8s.io/api/core/v1"
	"slices"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// TestCCManagerSeedsTheSwitchesItPauses: around a CC mode change k8s-cc-manager v0.4.3 pauses only the gpu.deploy.*
// switches that have a value (gpu_operator_eviction.py), and this chart runs an operand where its switch is absent.
// So on every fixture node where the CC manager runs (placed with the scheduler's affinity code), its init
// containers, read as `kube-gpu-stack seed-label` reads its flags, leave a value on the switch of each operand it
// pauses that runs there; and they seed nothing but those switches.
func TestCCManagerSeedsTheSwitchesItPauses(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("confidential")})
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		t.Fatal(err)
	}
	var nodes = nodefixtures.RoleMatrix()
	objects := make([]*corev1.Node, 0, len(nodes))
	for _, n := range nodes {
		objects = append(objects, n.Object())
	}
	got, err := placement.Place(dss, objects)
	if err != nil {
		t.Fatal(err)
	}
	inits := daemonSet(t, stream, "nvidia-cc-manager").Spec.Template.Spec.InitContainers
	checked := 0
	for _, n := range objects {
		if _, runs := got[n.Name]["cc-manager"]; !runs {
			continue
		}
		checked++
		labels := map[string]string{}
		for k, v := range n.Labels {
			labels[k] = v
		}
		for _, c := range inits {
			if !slices.Contains(c.Command, "seed-label") {
				continue
			}
			role, def := "", nodestate.RoleContainer
			var seeds []string
			for _, a := range c.Command[2:] {
				switch {
				case strings.HasPrefix(a, "--workload="):
					role = strings.TrimPrefix(a, "--workload=")
				case strings.HasPrefix(a, "--default-workload="):
					def = strings.TrimPrefix(a, "--default-workload=")
				case strings.HasPrefix(a, "--"):
				default:
					seeds = append(seeds, a)
				}
			}
			for _, s := range seeds {
				key, value, _ := strings.Cut(s, "=")
				if sw, ok := strings.CutPrefix(key, "nvidia.com/gpu.deploy."); !ok || !slices.Contains(nodefixtures.CCManagerSwitches, sw) || value != "true" {
					t.Errorf("init container %s seeds %s: want only the switches the CC manager pauses, true", c.Name, s)
				}
				if (role == "" || nodestate.Role(n, def) == role) && labels[key] == "" {
					labels[key] = value
				}
			}
		}
		for _, sw := range nodefixtures.CCManagerSwitches {
			if _, runs := got[n.Name][sw]; runs && labels["nvidia.com/gpu.deploy."+sw] == "" {
				t.Errorf("node %s runs %s and the CC manager, but its switch has no value after the seeds: a CC mode change would run under it", n.Name, sw)
			}
		}
	}
	if checked == 0 {
		t.Fatal("the CC manager runs on no fixture node")
	}
}
