package install

import (
	"io"

	"helm.sh/helm/v3/pkg/kube"
)

// Build is kube.Client.Build without Helm's "strict" OpenAPI validation, which validates nothing on the API
// servers the harness installs into. Given an API server that supports server-side field validation (every one
// since Kubernetes 1.27, the local control plane included), kubectl's validator only checks that support, by
// fetching and parsing each group version's OpenAPI v3 document on every Build, and then leaves validation to the
// server; Helm v3 never asks the server for it (its requests carry no fieldValidation). The parse was a fifth to
// a third of each control-plane suite's CPU: every install, upgrade and hook builds. TestHelmStrictBuildIsANoOp
// (tests/e2e) proves on the local API server that a manifest with an unknown field passes Helm's strict Build.
func (c quickClient) Build(reader io.Reader, _ bool) (kube.ResourceList, error) {
	return c.Client.Build(reader, false)
}
