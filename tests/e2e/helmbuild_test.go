package e2e

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// TestHelmStrictBuildIsANoOp: Helm's "strict" OpenAPI validation of a manifest passes one with a field no schema
// has, on the local API server (which supports server-side field validation, so kubectl's validator leaves the
// check to the server, and Helm v3 never asks the server for it). The harness's Helm client skips that validation
// (internal/install's Build) on the strength of this: were Helm to start validating, this test would fail.
func TestHelmStrictBuildIsANoOp(t *testing.T) {
	e := useSmall(t)
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &e.kube.Kubeconfig
	const manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: strict-build\n  namespace: default\nnoSuchField: true\ndata:\n  a: b\n"
	client := kube.New(flags)
	strict, err := client.Build(strings.NewReader(manifest), true)
	if err != nil {
		t.Fatalf("Helm's strict Build rejected a manifest with an unknown field; the harness's Build, which skips it, is no longer equivalent: %v", err)
	}
	loose, err := client.Build(strings.NewReader(manifest), false)
	if err != nil || len(strict) != 1 || len(loose) != 1 {
		t.Fatalf("builds: strict %d objects, loose %d objects (err %v); want one each", len(strict), len(loose), err)
	}
}
