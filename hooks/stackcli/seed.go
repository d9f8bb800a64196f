package stackcli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/nodestate"
)

// seedLabelCommand sets a default label on a node that has none: the MIG manager's init container seeds
// nvidia.com/mig.config with migManager.config.default, since the MIG manager acts on that label only.
func seedLabelCommand(flags *genericclioptions.ConfigFlags, out io.Writer) *cobra.Command {
	var node string
	cmd := &cobra.Command{
		Use:   "seed-label --node NODE KEY=VALUE",
		Short: "Set a label on a node where it is absent or empty (recorded, so cleanup removes it); a value is kept",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, value, ok := strings.Cut(args[0], "=")
			if !ok || key == "" || value == "" {
				return fmt.Errorf("want KEY=VALUE, got %q", args[0])
			}
			if node == "" {
				return fmt.Errorf("--node is required")
			}
			_, client, _, err := clients(flags)
			if err != nil {
				return err
			}
			return SeedLabel(cmd.Context(), client, node, key, value, out)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node to label (in a pod: $(NODE_NAME) from spec.nodeName)")
	return cmd
}

// SeedLabel sets key=value on node unless the label has a value. The update carries the node's resourceVersion, so
// a label someone sets between the read and the write is never overwritten (the conflict is retried).
func SeedLabel(ctx context.Context, client kubernetes.Interface, node, key, value string, out io.Writer) error {
	var kept string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p, err := nodestate.Seed(n, key, value)
		if err != nil {
			return err
		}
		if p.Empty() {
			kept = n.Labels[key]
			return nil
		}
		u := n.DeepCopy()
		for k, v := range p.Labels {
			metav1.SetMetaDataLabel(&u.ObjectMeta, k, *v)
		}
		for k, v := range p.Annotations {
			metav1.SetMetaDataAnnotation(&u.ObjectMeta, k, *v)
		}
		_, err = client.CoreV1().Nodes().Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("seed %s on node %s: %w", key, node, err)
	}
	if kept != "" {
		fmt.Fprintf(out, "node %s: %s=%s kept\n", node, key, kept)
	} else {
		fmt.Fprintf(out, "node %s: %s=%s set (it had no value)\n", node, key, value)
	}
	return nil
}
