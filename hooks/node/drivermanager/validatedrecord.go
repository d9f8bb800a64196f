package drivermanager

import (
	"context"
	"fmt"
	"log/slog"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// What validated on a node is also kept on its driver-manager Lease: the Node object's record
// (nodestate.ValidatedDigestAnnotation) goes with the object when the Node is deleted and registered again, and a
// new driver that then fails validation had nothing to revert to. The Lease outlives the Node object (only the
// pre-delete cleanup removes it).

// rememberValidated records digest as the driver that last validated on node, on its Lease (the same annotation key
// as the Node's). No Lease (a run outside a driver pod that never took one) records nothing; a failure only logs:
// the Node's own record stands.
func rememberValidated(ctx context.Context, client kubernetes.Interface, namespace, node, digest string, log *slog.Logger) {
	if digest == "" {
		return
	}
	leases := client.CoordinationV1().Leases(namespace)
	// a conflict is the Lease's renewal by its holder: read again and write on top of it
	err := apiretry.OnConflict(ctx, func(ctx context.Context) error {
		l, err := leases.Get(ctx, LeaseName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if l.Annotations[nodestate.ValidatedDigestAnnotation] == digest {
			return nil
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[nodestate.ValidatedDigestAnnotation] = digest
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		log.Info("could not record the validated driver on the node's Lease; the Node's record stands", "err", err)
	}
}

// restoreValidated gives a Node registered again (known: its Lease was there; no validated record on the Node) the
// record of the driver that last validated on it, from its Lease, before the run decides anything: a change that
// fails validation then goes back to that driver as on any node.
func (m *manager) restoreValidated(ctx context.Context) error {
	if !m.known || m.node.Annotations[nodestate.ValidatedDigestAnnotation] != "" {
		return nil
	}
	l, err := apiretry.Value(ctx, func(ctx context.Context) (*coordinationv1.Lease, error) {
		return m.o.Client.CoordinationV1().Leases(m.o.Namespace).Get(ctx, LeaseName(m.o.NodeName), metav1.GetOptions{})
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node %s: read what last validated on it from its Lease: %w", m.o.NodeName, err)
	}
	digest := l.Annotations[nodestate.ValidatedDigestAnnotation]
	if digest == "" {
		return nil
	}
	if err := m.apply(ctx, func(n *corev1.Node) (nodestate.Patch, error) {
		if n.Annotations[nodestate.ValidatedDigestAnnotation] != "" {
			return nodestate.Patch{}, nil
		}
		return nodestate.SetValidated(n, digest), nil
	}); err != nil {
		return err
	}
	m.log.Info("the Node object had lost the record of the driver that last validated on it: restored from its Lease", "validated", nodestate.ShortDigest(digest))
	return nil
}
