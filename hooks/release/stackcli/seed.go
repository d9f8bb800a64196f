package stackcli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// seedLabelCommand sets default labels on a node that has none: the MIG manager's init container seeds
// nvidia.com/mig.config with migManager.config.default, since the MIG manager acts on that label only; the CC
// manager's seeds the gpu.deploy.* switches of its node's sandbox operands, since it pauses only switches that have a
// value around a CC mode change.
func seedLabelCommand(flags *genericclioptions.ConfigFlags, out io.Writer) *cobra.Command {
	var node string
	var only nodestate.Workload
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
			return nodestate.SeedLabels(cmd.Context(), client, node, labels, only, out)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node to label (in a pod: $(NODE_NAME) from spec.nodeName)")
	cmd.Flags().StringVar(&only.Role, "workload", "", "seed only on a node of this role (nvidia.com/gpu.workload.config)")
	cmd.Flags().StringVar(&only.Default, "default-workload", "container", "the role of a node without a valid nvidia.com/gpu.workload.config (global.sandboxWorkloads.defaultWorkload)")
	return cmd
}
