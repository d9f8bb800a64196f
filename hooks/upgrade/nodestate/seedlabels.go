package nodestate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Workload limits seeding to nodes of one role: Role, read from the node's nvidia.com/gpu.workload.config, or Default
// where that label is absent or not a role. An empty Role seeds every node.
type Workload struct{ Role, Default string }

// Admits says whether n is a node of the role (every node, without one).
func (w Workload) Admits(n *corev1.Node) bool {
	if w.Role == "" {
		return true
	}
	return Role(n, w.Default) == w.Role
}

// SeedLabel sets key=value on node unless the label has a value (SeedLabels).
func SeedLabel(ctx context.Context, client kubernetes.Interface, node, key, value string, out io.Writer) error {
	return SeedLabels(ctx, client, node, [][2]string{{key, value}}, Workload{}, out)
}

// SeedLabels sets each key=value on node unless the label has a value, in one update, on a node of the role only
// admits. The write carries the node's resourceVersion, so a label someone sets between the read and the write is
// never overwritten (the conflict is retried).
func SeedLabels(ctx context.Context, client kubernetes.Interface, node string, labels [][2]string, only Workload, out io.Writer) error {
	var kept, set []string
	skipped := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kept, set, skipped = nil, nil, false
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !only.Admits(n) {
			skipped = true
			return nil
		}
		u := n.DeepCopy()
		changedLabels, changedAnnotations := map[string]string{}, map[string]string{}
		for _, l := range labels {
			p, err := Seed(u, l[0], l[1])
			if err != nil {
				return err
			}
			if p.Empty() {
				kept = append(kept, l[0]+"="+u.Labels[l[0]])
				continue
			}
			set = append(set, l[0]+"="+l[1])
			for k, v := range p.Labels {
				metav1.SetMetaDataLabel(&u.ObjectMeta, k, *v)
				changedLabels[k] = *v
			}
			for k, v := range p.Annotations {
				metav1.SetMetaDataAnnotation(&u.ObjectMeta, k, *v)
				changedAnnotations[k] = *v
			}
		}
		if len(set) == 0 {
			return nil
		}
		// a merge patch that carries the resourceVersion read: the write fails with a conflict (retried) when the
		// node changed since, as an update would, with the patch right the node's operands already hold
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion, "labels": changedLabels, "annotations": changedAnnotations}})
		if err != nil {
			return err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		keys := make([]string, 0, len(labels))
		for _, l := range labels {
			keys = append(keys, l[0])
		}
		return fmt.Errorf("seed %s on node %s: %w", strings.Join(keys, ", "), node, err)
	}
	if skipped {
		fmt.Fprintf(out, "node %s: not a %s node, nothing seeded\n", node, only.Role)
		return nil
	}
	for _, l := range slices.Sorted(slices.Values(kept)) {
		fmt.Fprintf(out, "node %s: %s kept\n", node, l)
	}
	for _, l := range set {
		fmt.Fprintf(out, "node %s: %s set (it had no value)\n", node, l)
	}
	return nil
}
