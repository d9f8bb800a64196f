// Package node holds nothing itself: its packages are the code that runs on a GPU node, in the stack's pods there.
//   - drivermanager, drivermanagercli: the driver pods' init container (the node's driver change) and their upgrade
//     gate sidecar; gpudrain evicts the node's GPU pods for them;
//   - kmod, hostfs, hostdriver: the node's kernel modules, its filesystems seen through a mount, a host-installed driver;
//   - validation, validatorcli: the validator's checks; statusfiles: the per-node barrier files they write;
//   - gpuhealth, nodecondition, metricsauth: the GPU health agent, the node condition it writes, its metrics' auth;
//   - runtimeconfig: the toolkit pod's keeper of the container runtime's config; atomicfile: whole-or-nothing writes.
package node
