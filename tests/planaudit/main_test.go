// Package planaudit proves `kube-gpu-stack plan` against what happens: for each change of a matrix, the plan
// computed on the live local control plane before `helm upgrade` is compared with what the API server's audit log
// shows afterwards — the nodes cordoned, the GPU pods evicted and the release's pods deleted — on simulated GPU
// nodes whose driver pods run the real driver manager and upgrade gate (internal/kubelet).
package planaudit

import (
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
)

// auditPolicy logs node writes with their bodies (a cordon is a patch of spec.unschedulable), and every other request
// by who, verb and object.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: Request
  verbs: [patch, update]
  resources:
  - group: ""
    resources: [nodes]
- level: Metadata
`

var (
	kube     *cluster.Cluster
	stand    *kubelet.Kubelet
	nodes    []*corev1.Node
	auditLog string
)

func TestMain(m *testing.M) {
	// gpu-01 and gpu-02 in pool a, gpu-03 and gpu-04 in pool b, and a node without a GPU
	for i, n := range nodefixtures.Rollout(4) {
		obj := n.Object()
		if _, gpu := obj.Status.Capacity["nvidia.com/gpu"]; gpu {
			obj.Labels[nodefixtures.DriverPoolLabel] = []string{"a", "a", "b", "b"}[i]
		}
		// gpu-04's role label, which takes effect once sandbox workloads are turned on (the matrix's role change)
		if obj.Name == "gpu-04" {
			obj.Labels["nvidia.com/gpu.workload.config"] = "vm-passthrough"
		}
		nodes = append(nodes, obj)
	}
	dir, err := os.MkdirTemp("", "planaudit-")
	if err != nil {
		fmt.Println("planaudit:", err)
		os.Exit(1)
	}
	auditLog = apiload.AuditLog(dir)
	args, err := apiload.ArgsFor(dir, auditPolicy)
	if err != nil {
		fmt.Println("planaudit:", err)
		os.Exit(1)
	}
	code := kubelet.RunPackageWith(m, "planaudit", nodes, func(o *cluster.Options) { o.APIServerArgs = args },
		func(c *cluster.Cluster, k *kubelet.Kubelet) { kube, stand = c, k })
	os.RemoveAll(dir)
	os.Exit(code)
}
