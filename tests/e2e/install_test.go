package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/draplugin"
)

// snapshotNodes records every node's state.
func snapshotNodes(t *testing.T) map[string]cluster.NodeState {
	t.Helper()
	s, err := cluster.SnapshotNodes(t.Context(), kube.Client)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// profileSets are what a profile needs on the fixture nodes, which run Ubuntu and RHEL: the openshift profile's
// driver serves RHCOS only (its RHCOS DaemonSets are placed on RHCOS fixtures by the role-matrix test), so here it
// also gets the fixtures' OS tags, or the gate would rightly fail every GPU node for want of a driver.
var profileSets = map[string][]string{
	"openshift.yaml": {"driver.os={rhcos4.16,rhcos4.17,rhcos4.18,ubuntu22.04,ubuntu24.04,rhel9}"},
}

// TestProfilesInstallAndPlaceOperands installs every values profile into the real API server with the helm SDK,
// waits for the rollout, and checks that each DaemonSet's pods run on exactly the simulated nodes the scheduler's
// affinity rules select (the role matrix), then that uninstall leaves every node as it was.
func TestProfilesInstallAndPlaceOperands(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "values", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no profiles: %v", err)
	}
	// the DRA profiles' kubelet plugin publishes each DRA node's ResourceSlice, which the gate waits for
	plugin, stopPlugin := context.WithCancel(t.Context())
	defer stopPlugin()
	go draplugin.Play(plugin, kube.Client, target().Namespace, make(chan error, 1))
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			before := snapshotNodes(t)
			start := time.Now()
			rel := installProfile(t, f, profileSets[filepath.Base(f)]...)
			waitForPlacement(t, expectedPlacement(t, rel))
			t.Logf("installed and rolled out in %s", time.Since(start).Round(time.Millisecond))
			uninstall(t)
			if changes := cluster.NodeChanges(before, snapshotNodes(t)); changes != "" {
				t.Errorf("uninstall left nodes changed:\n%s", changes)
			}
		})
	}
}

func setNodeLabel(t *testing.T, node, key string, value *string) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"` + key + `":null}}}`)
	if value != nil {
		patch = []byte(`{"metadata":{"labels":{"` + key + `":"` + *value + `"}}}`)
	}
	if _, err := kube.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ptr(s string) *string { return &s }

// TestNodeLabelsMoveOperands flips a node's switches and role on a live install: `false` and
// `paused-for-driver-upgrade` remove that operand's pod from the node, removing the label brings it back, and a
// role change moves the node's operands from the container set to the VM set and back.
func TestNodeLabelsMoveOperands(t *testing.T) {
	rel := installProfile(t, filepath.Join(chartrender.RepoRoot(), "values", "mixed.yaml"))
	defer uninstall(t)
	const node = "container-ubuntu2204"
	base := expectedPlacement(t, rel)
	waitForPlacement(t, base)

	for _, v := range []string{"false", "paused-for-driver-upgrade"} {
		setNodeLabel(t, node, "nvidia.com/gpu.deploy.device-plugin", ptr(v))
		want := expectedPlacement(t, rel)
		if _, still := want[node]["device-plugin"]; still {
			t.Fatalf("with gpu.deploy.device-plugin=%s the device plugin is still expected on %s", v, node)
		}
		waitForPlacement(t, want)
	}
	setNodeLabel(t, node, "nvidia.com/gpu.deploy.device-plugin", nil)
	waitForPlacement(t, base)

	setNodeLabel(t, node, "nvidia.com/gpu.workload.config", ptr("vm-passthrough"))
	moved := expectedPlacement(t, rel)
	if _, ok := moved[node]["vfio-manager"]; !ok {
		t.Fatalf("a vm-passthrough node should get the vfio-manager; expected %v", moved.Operands(node))
	}
	waitForPlacement(t, moved)
	setNodeLabel(t, node, "nvidia.com/gpu.workload.config", nil)
	waitForPlacement(t, base)
}
