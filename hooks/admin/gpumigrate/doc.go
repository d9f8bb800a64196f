// Package gpumigrate converts NVIDIA GPU Operator settings into kube-gpu-stack values: the operator chart's
// values, a ClusterPolicy's spec and NVIDIADriver resources. One table (table.go) says, for every key the operator
// knows, where it goes in this chart, or why it has no place here; the same table gives the values schemas the
// hints that name the replacement of an operator key.
//
// The table follows the GPU Operator at tag v26.7.0 (commit 10ee5b3638b89e11e949412aafa5ba99279c3721): its
// deployments/gpu-operator/values.yaml and the ClusterPolicy and NVIDIADriver CRDs. The values.yaml of older releases
// (testdata/gpu-operator-<tag>) are vendored beside it: an input is read against the defaults of the release it came
// from (--from-version, or recognised), and what equals them is dropped rather than converted (source.go).
package gpumigrate

// OperatorTag is the GPU Operator release the table follows.
const OperatorTag = "v26.7.0"
