package nodestate

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Apply sends p to the named node as one merge patch (nothing when p is empty) and returns the node as the API
// server has it afterwards. Transient server errors are retried with client-go's default backoff.
func Apply(ctx context.Context, client kubernetes.Interface, name string, p Patch) (*corev1.Node, error) {
	if p.Empty() {
		return client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	var node *corev1.Node
	err := retry.OnError(retry.DefaultBackoff, transient, func() error {
		var err error
		node, err = client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, p.JSON(), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("patch node %s: %w", name, err)
	}
	return node, nil
}

func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
}
