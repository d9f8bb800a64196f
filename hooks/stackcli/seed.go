package stackcli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/nodestate"
)

// seedLabelCommand sets default labels on a node that has none: the MIG manager's init container seeds
// nvidia.com/mig.config with migManager.config.default, since the MIG manager acts on that label only; the CC
// manager's seeds the gpu.deploy.* switches of its node's sandbox operands, since it pauses only switches that have a
// value around a CC mode change.
func seedLabelCommand(flags *genericclioptions.ConfigFlags, out io.Writer) *cobra.Command {
	var node string
	var only Workload
	cmd := &cobra.Command{
		Use:   "seed-label --node NODE KEY=VALUE...",
		Short: "Set labels on a node where each is absent or empty (recorded, so cleanup removes them); a value is kept",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var labels [][2]string
			for _, a := range args {
				key, value, ok := strings.Cut(a, "=")
				if !ok || key == "" || value == "" {
					return fmt.Errorf("want KEY=VALUE, got %q", a)
				}
				labels = append(labels, [2]string{key, value})
			}
			if node == "" {
				return fmt.Errorf("--node is required")
			}
			if only.Role != "" && (!nodestate.ValidRole(only.Role) || !nodestate.ValidRole(only.Default)) {
				return fmt.Errorf("--workload %q and --default-workload %q: each must be container, vm-passthrough or vm-vgpu", only.Role, only.Default)
			}
			_, client, _, err := clients(flags)
			if err != nil {
				return err
			}
			return SeedLabels(cmd.Context(), client, node, labels, only, out)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node to label (in a pod: $(NODE_NAME) from spec.nodeName)")
	cmd.Flags().StringVar(&only.Role, "workload", "", "seed only on a node of this role (nvidia.com/gpu.workload.config)")
	cmd.Flags().StringVar(&only.Default, "default-workload", "container", "the role of a node without a valid nvidia.com/gpu.workload.config (global.sandboxWorkloads.defaultWorkload)")
	return cmd
}

// Workload limits seeding to nodes of one role: Role, read from the node's nvidia.com/gpu.workload.config, or Default
// where that label is absent or not a role. An empty Role seeds every node.
type Workload struct{ Role, Default string }

// Admits says whether n is a node of the role (every node, without one).
func (w Workload) Admits(n *corev1.Node) bool {
	if w.Role == "" {
		return true
	}
	return nodestate.Role(n, w.Default) == w.Role
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
			p, err := nodestate.Seed(u, l[0], l[1])
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
