package dra

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestComputeDomainCRDOnTheAPIServer: the ComputeDomain CRD the chart ships (operands/dra-driver/files/crds) as
// the API server enforces it: a domain as workloads write it is accepted with the upstream defaults filled in
// (numNodes 0, allocationMode Single); one without a channel, with an unknown allocation mode or
// a negative node count is refused naming the field; and its spec cannot change once created (the CEL rule). No
// ComputeDomain controller runs here (it needs IMEX on NVLink hardware), so nothing acts on the domain.
func TestComputeDomainCRDOnTheAPIServer(t *testing.T) {
	ctx := t.Context()
	raw, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), "operands", "dra-driver", "files", "crds", "computedomains.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(raw, crd); err != nil {
		t.Fatal(err)
	}
	// created here only when no install left it behind, and then removed again, so a later install owns it
	ours, err := kube.CreateCRD(ctx, crd)
	if err != nil {
		t.Fatal(err)
	}
	if ours {
		ext := apiextensionsclient.NewForConfigOrDie(kube.Config)
		t.Cleanup(func() {
			_ = ext.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
			_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
		})
	}
	domains := dynamic.NewForConfigOrDie(kube.Config).Resource(schema.GroupVersionResource{Group: "resource.nvidia.com", Version: "v1beta1", Resource: "computedomains"}).Namespace("default")
	domain := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	channel := map[string]any{"resourceClaimTemplate": map[string]any{"name": "imex-channel"}}

	// accepted, with the defaults filled in; retried while the new resource's discovery settles
	var created *unstructured.Unstructured
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		created, err = domains.Create(ctx, domain("nvl72", map[string]any{"numNodes": int64(2), "channel": channel}), metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("a valid ComputeDomain refused: %v", err)
	}
	if mode, _, _ := unstructured.NestedString(created.Object, "spec", "channel", "allocationMode"); mode != "Single" {
		t.Errorf("allocationMode %q, want the default Single", mode)
	}
	defaulted, err := domains.Create(ctx, domain("any-size", map[string]any{"channel": channel}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, found, _ := unstructured.NestedInt64(defaulted.Object, "spec", "numNodes"); !found || n != 0 {
		t.Errorf("numNodes %d (set %v), want the default 0", n, found)
	}

	for name, tc := range map[string]struct {
		spec map[string]any
		want string
	}{
		"no-channel":   {map[string]any{"numNodes": int64(2)}, "spec.channel"},
		"unknown-mode": {map[string]any{"channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": "c"}, "allocationMode": "Many"}}, "spec.channel.allocationMode"},
		"negative":     {map[string]any{"numNodes": int64(-1), "channel": channel}, "spec.numNodes"},
		"no-template":  {map[string]any{"channel": map[string]any{}}, "spec.channel.resourceClaimTemplate"},
	} {
		_, err := domains.Create(ctx, domain(name, tc.spec), metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want refused naming %s, got %v", name, tc.want, err)
		}
	}

	if err := unstructured.SetNestedField(created.Object, int64(4), "spec", "numNodes"); err != nil {
		t.Fatal(err)
	}
	if _, err := domains.Update(ctx, created, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("spec change: want refused as immutable, got %v", err)
	}
	for _, n := range []string{"nvl72", "any-size"} {
		if err := domains.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
}
