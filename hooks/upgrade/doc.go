// Package upgrade holds nothing itself: its packages coordinate a driver change between the nodes of a pool.
//   - nodestate: the vocabulary the stack writes on Nodes (the upgrade states, marks, cordons) and its patches;
//   - driverpools: which driver pool, and which of its DaemonSets, a node belongs to;
//   - canary: the canary first, then the pool widening, and its failure threshold;
//   - slots: the pool's bound on nodes out of service at once;
//   - revertset: the copy of a driver DaemonSet a node whose new driver failed goes back to.
//
// # The upgrade machine
//
// A node's driver change is one state machine, written on the Node (nodestate.UpgradeStateLabel, the GPU
// Operator's names, with the reason in nodestate.UpgradeReasonAnnotation) by four processes: the pre-upgrade Job
// (hooks/release/upgradeplan, also pre-rollback), a driver pod's init container (the driver manager,
// hooks/node/drivermanager), the same pod's upgrade gate sidecar (`driver-manager uncordon-when-valid`, the same
// package), and the admin's `kube-gpu-stack upgrade retry`. A pod stopped (SIGTERM) moves nothing: the next run
// resumes from the state it left.
//
//	from                    to                      when                                        written by
//	(none), upgrade-done    upgrade-required        the node's driver will change               pre-upgrade Job; a gate
//	                                                                                            or init container whose
//	                                                                                            node no plan marked
//	upgrade-required        cordon-required         the canary, the pool's threshold and a      the old pod's gate (its
//	                                                slot let it go                              DaemonSet changed, or
//	                                                                                            its pod is deleted); the
//	                                                                                            new pod's init container
//	cordon-required         pod-deletion-required   cordoned (or by the admin already), the GPU the same
//	                                                operands paused
//	pod-deletion-required   pod-restart-required    GPU pods evicted, the paused operands gone  the same
//	pod-deletion-required   drain-required          eviction blocked, full drain on             the same
//	drain-required          pod-restart-required    node drained                                the same
//	pod-restart-required    validation-required     the DRA plugin gone and late GPU pods       the same, then the new
//	                                                evicted; then the modules unloaded and the  pod's init container
//	                                                old driver root unmounted
//	validation-required     uncordon-required       the validator passed with the new driver    the new pod's gate
//	uncordon-required       upgrade-done            the stack's cordon lifted, operands resumed the new pod's gate
//	any                     upgrade-failed          a step failed (the reason says which)       whichever ran it
//	upgrade-failed          upgrade-required        the admin asks again                        `upgrade retry NODE`
//	any but upgrade-done    validation-required     the pod's driver is loaded already (fast    the init container
//	                                                path), or none is (fresh node, reboot)
//
// The old pod's gate empties its node before its own driver container may stop (hooks/node/drivermanager
// stopguard.go), so no GPU pod runs when the old driver's daemons stop; the new pod's init container waits until
// the old pod is gone, then carries the change on from where the gate left it.
package upgrade
