package admincli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/placementplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

func planCommand(scope stackcli.Scope, out io.Writer) *cobra.Command {
	o := placementplan.Options{}
	cmd := &cobra.Command{
		Use:   "plan [-f values.yaml] [--set k=v] [--nodes FILE [--pods FILE]]",
		Short: "Print, per node, what the chart with these values will run there and what a driver change would evict (read-only)",
		Long: "Renders the chart with the values you would install or upgrade to and evaluates every node of the cluster, or\n" +
			"of --nodes FILE: its role (ROLE CHANGE where the release's operands there serve another role), its driver\n" +
			"pool, the operands that will run, the driver DaemonSet and whether the\n" +
			"driver changes (its running driver pod's config digest against the rendered one), whether its GPU allocation\n" +
			"switches, the GPU pods that change evicts and the PodDisruptionBudgets that hold them; then the GPU nodes no\n" +
			"pool or OS tag covers. The CHANGE column gives the driver versions first (a downgrade called out), then the\n" +
			"config digests. On a live cluster it ends with the pre-upgrade hook's own plan (each pool's canary, the\n" +
			"batches, held nodes, allocation switches) and its verdict: the upgrade proceeds, or is refused and\n" +
			"why. It only reads (nodes, pods, PodDisruptionBudgets, resource claims, DaemonSets).\n" +
			"The release is --release, else gpu. " + stackcli.NamespaceHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Release = *scope.Release
			var err error
			if o.Namespace, _, err = scope.Namespace(); err != nil {
				return err
			}
			if o.NodesFile == "" {
				if _, o.Client, _, err = scope.Clients(); err != nil {
					return err
				}
			}
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			_, err = placementplan.Run(cmd.Context(), o, out)
			return err
		},
	}
	cmd.Flags().StringVar(&o.ChartDir, "chart", "charts/kube-gpu-stack", "the chart `DIR` to render")
	cmd.Flags().StringArrayVarP(&o.ValueFiles, "values", "f", nil, "values `FILE` (repeatable, as helm -f)")
	cmd.Flags().StringArrayVar(&o.Set, "set", nil, "a value `KEY=VAL` (repeatable, as helm --set)")
	cmd.Flags().StringVar(&o.KubeVersion, "kube-version", "", "Kubernetes version to render for (default: the cluster's, or v1.37.0 with --nodes)")
	cmd.Flags().StringVar(&o.NodesFile, "nodes", "", "read Node objects from `FILE` (a List or YAML documents) instead of the cluster")
	cmd.Flags().StringVar(&o.PodsFile, "pods", "", "with --nodes: Pods, PodDisruptionBudgets and ResourceClaims from `FILE`")
	cmd.Flags().StringVarP(&o.Output, "output", "o", "table", "table or json")
	return cmd
}
