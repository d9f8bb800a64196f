package drivermanager

import (
	"context"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// AdoptStep is where Options.AfterStep is called on the adoption path: the node is validation-required, and our
// digest is not yet recorded on the host.
const AdoptStep = "adopt"

// ourDigest is the form of the chart's DRIVER_CONFIG_DIGEST (a sha256). The GPU Operator's driver container writes
// its own DRIVER_CONFIG_DIGEST to the same state file, a decimal FNV-32a hash (gpu-operator v26.7.0,
// internal/utils.GetObjectHashIgnoreEmptyKeys), which this never matches.
var ourDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// foreignDriver: the loaded driver was installed by someone else: no digest of ours in the host's state file (none,
// or the GPU Operator's), and none on the node, where every run of ours records it. A driver of ours with another
// config (a recorded sha256) is a driver change, never an adoption.
func foreignDriver(n *corev1.Node, recorded string) bool {
	return !ourDigest.MatchString(recorded) && n.Annotations[nodestate.DriverDigestAnnotation] == ""
}

// foreignState: the upgrade-state label was written by another installer. The GPU Operator's upgrade controller
// uses the same key and the same values (upgrade-done, upgrade-failed, ...), and its own annotations
// (nvidia.com/gpu-driver-upgrade-*); every state we write carries nodestate.UpgradeSinceAnnotation, and a failure
// of ours nodestate.UpgradeReasonAnnotation, neither of which it writes.
func foreignState(n *corev1.Node) bool {
	_, since := n.Annotations[nodestate.UpgradeSinceAnnotation]
	_, reason := n.Annotations[nodestate.UpgradeReasonAnnotation]
	return n.Labels[nodestate.UpgradeStateLabel] != "" && !since && !reason
}

// adoptable says why the loaded driver cannot be adopted ("" when it can). It must be the version this pod's
// driver container installs: on the fast path that container installs only its userspace over the loaded modules,
// and a userspace of another version does not talk to them. It must be the flavour the pod installs: our digest
// names it (nvidia-fs builds only against the open modules). With KERNEL_MODULE_TYPE auto either flavour is: the
// driver container asks the installer of that same version for the GPUs' recommended flavour
// (nvidia-installer --print-recommended-kernel-module-type), and so did the GPU Operator's, whose default is auto
// too. What the host does not show is not checked: module parameters, licensing and repository files (userspace,
// rewritten by the driver container), so a change there needs FORCE_REINSTALL once.
func (m *manager) adoptable() string {
	if m.o.DriverVersion == "" || m.o.KernelModuleType == "" {
		return "this pod does not say which driver version and module type it installs (DRIVER_VERSION, KERNEL_MODULE_TYPE)"
	}
	d, err := m.o.Host.LoadedDriver()
	if err != nil {
		return err.Error()
	}
	if d.Version != m.o.DriverVersion {
		return fmt.Sprintf("loaded driver %s, this pod installs %s", d.Version, m.o.DriverVersion)
	}
	if m.o.KernelModuleType != "auto" && d.Flavour != m.o.KernelModuleType {
		return fmt.Sprintf("loaded %s kernel modules, this pod installs %s ones", d.Flavour, m.o.KernelModuleType)
	}
	return ""
}

// adopt takes over a driver another installer loaded, as the fast path keeps ours: no cordon, no eviction, no
// unload. The node goes validation-required first, so that the gate (the validator turning Ready with this driver)
// vouches for it before it is upgrade-done; only then is our digest written to the host, where the driver
// container reads it and installs its userspace only. A run killed between the two adopts again; one killed after
// finds our digest and takes the fast path, the node still validation-required.
func (m *manager) adopt(ctx context.Context) (string, error) {
	d, _ := m.o.Host.LoadedDriver()
	cleared, err := m.clearStale()
	if err != nil {
		return "", err
	}
	if err := m.apply(ctx, nodestate.Resume, m.state(nodestate.ValidationRequired, ""), fixed(nodestate.DriverInstalls(m.now())), m.allocation()); err != nil {
		return "", err
	}
	if err := m.step(ctx, AdoptStep); err != nil {
		return "", err
	}
	if err := m.o.Host.RecordDigest(m.o.Digest); err != nil {
		return "", err
	}
	if err := m.apply(ctx, m.recordDigest()); err != nil {
		return "", err
	}
	m.log.Info("adopted the driver another installer loaded", "version", d.Version, "flavour", d.Flavour, "digest", nodestate.ShortDigest(m.o.Digest))
	return fmt.Sprintf("adopted the loaded driver %s (%s kernel modules, loaded by another installer): digest %s recorded, evicted nothing%s; the node validates it before it is upgrade-done",
		d.Version, d.Flavour, nodestate.ShortDigest(m.o.Digest), cleared), nil
}
