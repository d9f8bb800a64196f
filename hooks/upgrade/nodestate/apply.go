package nodestate

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
)

// Apply sends p to the named node as one merge patch (nothing when p is empty) and returns the node as the API
// server has it afterwards. Use it only for a patch that does not depend on the node (a validation result, a
// time); a patch computed from the node goes through Update. Transient errors are retried (apiretry) until ctx's
// deadline.
func Apply(ctx context.Context, client kubernetes.Interface, name string, p Patch) (*corev1.Node, error) {
	if p.Empty() {
		return Get(ctx, client, name)
	}
	var node *corev1.Node
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		node, err = client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, p.JSON(), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("patch node %s: %w", name, err)
	}
	return node, nil
}

// Get reads the node, retrying transient errors until ctx's deadline.
func Get(ctx context.Context, client kubernetes.Interface, name string) (*corev1.Node, error) {
	var node *corev1.Node
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		node, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	return node, nil
}

// Update writes what compute makes of the node as the API server has it now. It reads the node, calls compute
// on that read, and sends the patch with the read's resourceVersion, so the server refuses it (409 Conflict) when
// anyone changed the node in between; then it reads and computes again. A patch is thus never computed from a
// stale node: a switch an admin set to false while an eviction ran is seen, and kept. Transient errors are
// retried until ctx's deadline (apiretry); an error of compute ends it at once. It returns the node as written
// (as read, when the patch is empty).
func Update(ctx context.Context, client kubernetes.Interface, name string, compute func(*corev1.Node) (Patch, error)) (*corev1.Node, error) {
	var node *corev1.Node
	var computeErr error
	err := apiretry.OnConflict(ctx, func(ctx context.Context) error {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p, err := compute(n.DeepCopy())
		if err != nil {
			computeErr = err
			return err
		}
		if p.Empty() {
			node = n
			return nil
		}
		node, err = client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, p.jsonAt(n.ResourceVersion), metav1.PatchOptions{})
		return err
	})
	switch {
	case computeErr != nil && err == computeErr:
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("update node %s: %w", name, err)
	}
	return node, nil
}

// UpdateFrom is Update that first tries the patch compute makes of known, the node as its caller last read or
// wrote it, with known's resourceVersion: when nobody wrote the node since, that one request does what Update's
// read and patch do. The server refuses it when anyone did (409 Conflict), and Update takes over, as it does for an
// empty patch (nothing to write is only known from a fresh read), an error of compute, or any other error.
func UpdateFrom(ctx context.Context, client kubernetes.Interface, name string, known *corev1.Node, compute func(*corev1.Node) (Patch, error)) (*corev1.Node, error) {
	if known != nil && known.Name == name && known.ResourceVersion != "" {
		if p, err := compute(known.DeepCopy()); err == nil && !p.Empty() {
			node, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, p.jsonAt(known.ResourceVersion), metav1.PatchOptions{})
			if err == nil {
				return node, nil
			}
		}
	}
	return Update(ctx, client, name, compute)
}

// jsonAt renders the merge patch with a resourceVersion precondition (none when rv is empty).
func (p Patch) jsonAt(rv string) []byte {
	if rv == "" {
		return p.JSON()
	}
	var doc map[string]any
	_ = json.Unmarshal(p.JSON(), &doc) // JSON always renders an object
	meta, _ := doc["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["resourceVersion"] = rv
	doc["metadata"] = meta
	b, _ := json.Marshal(doc)
	return b
}
