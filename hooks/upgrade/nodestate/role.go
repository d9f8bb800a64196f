package nodestate

import corev1 "k8s.io/api/core/v1"

// WorkloadConfigLabel is the node's GPU role, set by the admin: container, vm-passthrough or vm-vgpu.
const WorkloadConfigLabel = "nvidia.com/gpu.workload.config"

// The node roles (WorkloadConfigLabel values).
const (
	RoleContainer     = "container"
	RoleVMPassthrough = "vm-passthrough"
	RoleVMVGPU        = "vm-vgpu"
)

// ValidRole says whether s is a node role.
func ValidRole(s string) bool { return s == RoleContainer || s == RoleVMPassthrough || s == RoleVMVGPU }

// Role is n's role: its WorkloadConfigLabel when that is a role, else def (global.sandboxWorkloads.defaultWorkload).
func Role(n *corev1.Node, def string) string {
	if r := n.Labels[WorkloadConfigLabel]; ValidRole(r) {
		return r
	}
	return def
}
