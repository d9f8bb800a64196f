package admission

import (
	"context"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// The accounts that publish NodeFeatures (release "gpu"): nfd-worker, GFD.
const (
	workerSA = "gpu-node-feature-discovery-worker"
	gfdSA    = "nvidia-gpu-feature-discovery"
)

var nodeFeatures = schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeatures"}

// TestNodeFeatureWritersWriteOnlyTheirOwnNodes: nfd-master labels the node a NodeFeature names (its label
// nfd.node.kubernetes.io/node-name), so an account that publishes them (nfd-worker, GFD) may create, update and
// delete only those of the node its pod runs on: refused for another node, for moving one to or from another node,
// and with a token bound to no pod.
func TestNodeFeatureWritersWriteOnlyTheirOwnNodes(t *testing.T) {
	install(t)
	installNodeFeatureCRD(t)
	ctx := t.Context()
	nf := func(name, node string) *unstructured.Unstructured {
		return nodeFeature(name, node, map[string]string{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
	}
	admin := dynamic.NewForConfigOrDie(kube.Config).Resource(nodeFeatures).Namespace(ns)
	if _, err := admin.Create(ctx, nf("gfd-"+nodeB, nodeB), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	refused, allowed := 0, 0
	for _, sa := range []string{workerSA, gfdSA} {
		t.Run(sa, func(t *testing.T) {
			c := dynamic.NewForConfigOrDie(restConfigAs(t, sa, podOn(t, sa, nodeA))).Resource(nodeFeatures).Namespace(ns)
			// another node's labels, from a new object
			err := refusedByPolicy(t, func(ctx context.Context) error {
				_, err := c.Create(ctx, nf(sa+"-"+nodeB, nodeB), metav1.CreateOptions{})
				return err
			})
			if !strings.Contains(err.Error(), "may write only the NodeFeatures of the node its pod runs on ("+nodeA+"), not of "+nodeB) {
				t.Fatalf("refusal does not say why: %v", err)
			}
			refused++
			// its own node's: allowed; then moved to another node: refused
			own, err := c.Create(ctx, nf(sa+"-"+nodeA, nodeA), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("its own node's NodeFeature: %v", err)
			}
			allowed++
			own.SetLabels(map[string]string{"nfd.node.kubernetes.io/node-name": nodeB})
			refusedByPolicy(t, func(ctx context.Context) error { _, err := c.Update(ctx, own, metav1.UpdateOptions{}); return err })
			refused++
			if sa == gfdSA { // GFD may delete (its RBAC): not another node's
				refusedByPolicy(t, func(ctx context.Context) error { return c.Delete(ctx, "gfd-"+nodeB, metav1.DeleteOptions{}) })
				refused++
			}
			unbound := dynamic.NewForConfigOrDie(restConfigAs(t, sa, nil)).Resource(nodeFeatures).Namespace(ns)
			refusedByPolicy(t, func(ctx context.Context) error {
				_, err := unbound.Create(ctx, nf(sa+"-unbound", nodeA), metav1.CreateOptions{})
				return err
			})
			refused++
		})
	}
	t.Logf("NodeFeature writes: %d refused, %d allowed", refused, allowed)
}

// nodeFeature is a NodeFeature of node named name that asks nfd-master for labels.
func nodeFeature(name, node string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("nfd.k8s-sigs.io/v1alpha1")
	u.SetKind("NodeFeature")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(map[string]string{"nfd.node.kubernetes.io/node-name": node})
	_ = unstructured.SetNestedStringMap(u.Object, labels, "spec", "labels")
	return u
}

// TestNodeFeatureWritersPublishNoSwitches: nfd-master (v0.19.0) writes a NodeFeature's labels over any the node has
// (its restrictions.allowOverwrite=false refuses to update the labels it manages instead: the real-node tier saw
// it), so a compromised node's feature writer could turn its node's operands off, set its MIG or CC mode, or claim
// a GPU on a CPU node. The policy refuses, for each writer on its own node, a NodeFeature carrying a label the admin
// or the stack steers the node with (nvidia.com/gpu.deploy.*, mig.config, cc.mode, gpu.workload.config,
// gpu.present, kube-gpu-stack.io/...), on create and on update; the labels GFD publishes pass.
func TestNodeFeatureWritersPublishNoSwitches(t *testing.T) {
	install(t)
	installNodeFeatureCRD(t)
	ctx := t.Context()
	refused := 0
	for _, sa := range []string{workerSA, gfdSA} {
		t.Run(sa, func(t *testing.T) {
			c := dynamic.NewForConfigOrDie(restConfigAs(t, sa, podOn(t, sa, nodeA))).Resource(nodeFeatures).Namespace(ns)
			for _, label := range []string{"nvidia.com/gpu.deploy.driver", "nvidia.com/mig.config", "nvidia.com/cc.mode",
				"nvidia.com/gpu.workload.config", "nvidia.com/gpu.present", "kube-gpu-stack.io/driver-revert"} {
				err := refusedByPolicy(t, func(ctx context.Context) error {
					_, err := c.Create(ctx, nodeFeature(sa+"-switch", nodeA, map[string]string{label: "x"}), metav1.CreateOptions{})
					return err
				})
				if !strings.Contains(err.Error(), "may not publish the labels the admin and the stack steer a node with: "+label) {
					t.Fatalf("refusal does not name %s: %v", label, err)
				}
				refused++
			}
			own, err := c.Create(ctx, nodeFeature(sa+"-labels", nodeA, map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/mig.capable": "true"}), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("GFD's labels on its own node: %v", err)
			}
			_ = unstructured.SetNestedStringMap(own.Object, map[string]string{"nvidia.com/gpu.count": "8", "nvidia.com/gpu.deploy.device-plugin": "false"}, "spec", "labels")
			refusedByPolicy(t, func(ctx context.Context) error { _, err := c.Update(ctx, own, metav1.UpdateOptions{}); return err })
			refused++
		})
	}
	t.Logf("NodeFeature switch labels: %d writes refused", refused)
}

// installNodeFeatureCRD creates the rendered chart's NodeFeature CRD (kept when there) and waits until it is served.
func installNodeFeatureCRD(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	stream, err := chartrender.RenderRepo(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var crd *apiextensionsv1.CustomResourceDefinition
	for _, doc := range strings.Split(stream, "\n---") {
		if !strings.Contains(doc, "kind: CustomResourceDefinition") || !strings.Contains(doc, "name: nodefeatures.nfd.k8s-sigs.io") {
			continue
		}
		crd = &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal([]byte(doc), crd); err != nil {
			t.Fatal(err)
		}
	}
	if crd == nil {
		t.Fatal("no NodeFeature CRD in the render")
	}
	if _, err := kube.CreateCRD(ctx, crd); err != nil {
		t.Fatal(err)
	}
}
