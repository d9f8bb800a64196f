package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

// snapshotNodes records every node's state.
func (e *env) snapshotNodes(t *testing.T) map[string]cluster.NodeState {
	t.Helper()
	s, err := cluster.SnapshotNodes(t.Context(), e.kube.Client)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// setUnschedulable cordons or uncordons a node as an admin would and waits until the node lifecycle controller has
// added or removed its unschedulable taint, which it does asynchronously.
func (e *env) setUnschedulable(t *testing.T, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	if _, err := e.kube.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := e.kube.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeUnschedulable })
		return tainted == on, nil
	})
	if err != nil {
		t.Fatalf("node %s: unschedulable %t, but its %s taint never followed", node, on, corev1.TaintNodeUnschedulable)
	}
}

// profileSets are what a profile needs on the fixture nodes, which run Ubuntu and RHEL: the openshift profile's
// driver serves RHCOS only (its RHCOS DaemonSets are placed on RHCOS fixtures by the role-matrix test), so here it
// also gets the fixtures' OS tags, or the gate would rightly fail every GPU node for want of a driver.
var profileSets = map[string][]string{
	"openshift.yaml": {"driver.os={rhcos4.16,rhcos4.17,rhcos4.18,ubuntu22.04,ubuntu24.04,rhel9}"},
}

// TestProfilesInstallAndPlaceOperands installs every values profile into the real API server with the helm SDK,
// waits for the rollout, and checks that each DaemonSet's pods run on exactly the simulated nodes the scheduler's
// affinity rules select (the role matrix), then that uninstall leaves every node as it was. Each profile owns a
// control plane while it runs, so profiles run side by side. The mixed profile is TestMixedProfileLifecycle's,
// which makes the same checks around the rest of its install's life.
func TestProfilesInstallAndPlaceOperands(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(chartrender.RepoRoot(), "values", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no profiles: %v", err)
	}
	for _, f := range files {
		if f == mixedProfile() {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			e := use(t)
			e.serveExternalNFD(t, f)
			before := e.snapshotNodes(t)
			start := time.Now()
			rel := e.installProfile(t, f, profileSets[filepath.Base(f)]...)
			e.waitForPlacement(t, e.expectedPlacement(t, rel))
			t.Logf("installed and rolled out in %s", time.Since(start).Round(time.Millisecond))
			e.uninstall(t)
			e.nodesUnchangedSince(t, before)
		})
	}
}

// serveExternalNFD gives a profile with nfd.mode=external the NFD API its NodeFeatureRule needs, as the NFD that
// the admin installed first (on OpenShift, Red Hat's NFD Operator) serves it: the NFD CRDs, marked as this release's
// as a bundled install leaves them once uninstalled (they are kept), so that a bundled profile on the same control
// plane later adopts them. A profile with external NFD on a cluster without them fails its install, naming the kind.
func (e *env) serveExternalNFD(t *testing.T, profile string) {
	t.Helper()
	vals, err := chartrender.Values(profileFiles(t, profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if nfd, _ := vals["nfd"].(map[string]any); nfd["mode"] != "external" {
		return
	}
	crds, err := filepath.Glob(filepath.Join(chartrender.ChartDir(), "charts", "node-feature-discovery", "files", "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("the NFD CRDs: %v", err)
	}
	for _, path := range crds {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		crd.Labels = map[string]string{"app.kubernetes.io/managed-by": "Helm"}
		crd.Annotations = map[string]string{"meta.helm.sh/release-name": e.target().Release, "meta.helm.sh/release-namespace": releaseNamespace}
		if _, err := e.kube.CreateCRD(t.Context(), crd); err != nil {
			t.Fatal(err)
		}
	}
}

// nodesUnchangedSince fails t when any node differs from the snapshot before.
func (e *env) nodesUnchangedSince(t *testing.T, before map[string]cluster.NodeState) {
	t.Helper()
	if changes := cluster.NodeChanges(before, e.snapshotNodes(t)); changes != "" {
		t.Errorf("uninstall left nodes changed:\n%s", changes)
	}
}

func (e *env) setNodeLabel(t *testing.T, node, key string, value *string) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"` + key + `":null}}}`)
	if value != nil {
		patch = []byte(`{"metadata":{"labels":{"` + key + `":"` + *value + `"}}}`)
	}
	if _, err := e.kube.Client.CoreV1().Nodes().Patch(t.Context(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ptr(s string) *string { return &s }

// nodeLabelsMoveOperands flips a node's switches and role on the live install rel: `false` and
// `paused-for-driver-upgrade` remove that operand's pod from the node, removing the label brings it back, and a
// role change moves the node's operands from the container set to the VM set and back.
func (e *env) nodeLabelsMoveOperands(t *testing.T, rel *release.Release) {
	const node = "container-ubuntu2204"
	base := e.expectedPlacement(t, rel)
	e.waitForPlacement(t, base)

	for _, v := range []string{"false", "paused-for-driver-upgrade"} {
		e.setNodeLabel(t, node, "nvidia.com/gpu.deploy.device-plugin", ptr(v))
		want := e.expectedPlacement(t, rel)
		if _, still := want[node]["device-plugin"]; still {
			t.Fatalf("with gpu.deploy.device-plugin=%s the device plugin is still expected on %s", v, node)
		}
		e.waitForPlacement(t, want)
	}
	e.setNodeLabel(t, node, "nvidia.com/gpu.deploy.device-plugin", nil)
	e.waitForPlacement(t, base)

	e.setNodeLabel(t, node, "nvidia.com/gpu.workload.config", ptr("vm-passthrough"))
	moved := e.expectedPlacement(t, rel)
	if _, ok := moved[node]["vfio-manager"]; !ok {
		t.Fatalf("a vm-passthrough node should get the vfio-manager; expected %v", moved.Operands(node))
	}
	e.waitForPlacement(t, moved)
	e.setNodeLabel(t, node, "nvidia.com/gpu.workload.config", nil)
	e.waitForPlacement(t, base)
}

// TestExternalNFDWithoutItsAPIFailsBeforeCreatingAnything: a profile with nfd.mode=external on a cluster whose NFD
// is not installed (no NodeFeatureRule API) fails its install naming the kind, before it creates any object, and
// leaves no release behind.
func TestExternalNFDWithoutItsAPIFailsBeforeCreatingAnything(t *testing.T) {
	e := use(t) // (runs in parallel: the pool's Use calls t.Parallel)
	ext, err := apiextensionsclient.NewForConfig(e.kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds := ext.ApiextensionsV1().CustomResourceDefinitions()
	for _, name := range []string{"nodefeaturerules.nfd.k8s-sigs.io", "nodefeatures.nfd.k8s-sigs.io", "nodefeaturegroups.nfd.k8s-sigs.io"} {
		if err := crds.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		// a later test on this control plane gets them back from a bundled install or serveExternalNFD
		if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := crds.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Fatalf("CRD %s not gone: %v", name, err)
		}
	}
	profile := filepath.Join(chartrender.RepoRoot(), "values", "nfd-external.yaml")
	_, err = e.target().Install(t.Context(), []string{profile})
	if err == nil {
		e.uninstall(t)
		t.Fatal("the install passed on a cluster without the NodeFeatureRule API")
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), "NodeFeatureRule") {
		t.Errorf("install error %q does not name the kind NodeFeatureRule", err)
	}
	dss, err := e.kube.Client.AppsV1().DaemonSets(releaseNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := e.kube.Client.CoreV1().Secrets(releaseNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "owner=helm"})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if len(dss.Items) > 0 || secrets != nil && len(secrets.Items) > 0 {
		t.Errorf("the refused install left %d DaemonSets and %d release records", len(dss.Items), len(secrets.Items))
	}
}
