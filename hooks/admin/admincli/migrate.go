package admincli

import (
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/gpumigrate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

func migrateCommand(scope stackcli.Scope, out io.Writer) *cobra.Command {
	o := gpumigrate.Options{}
	cmd := &cobra.Command{
		Use:   "migrate (-f VALUES | --from-cluster) [--from-version VERSION] [-o FILE] [--report FILE]",
		Short: "Convert GPU Operator values, or a running operator's ClusterPolicy and NVIDIADrivers, into this chart's values",
		Long: "Reads a GPU Operator values file (-f; YAML with a ClusterPolicy and NVIDIADriver objects works too) and/or the\n" +
			"cluster (--from-cluster: the ClusterPolicy " + gpumigrate.ClusterPolicyName + ", else the cluster's only one, every NVIDIADriver, and\n" +
			"the labels the operator wrote on the nodes; it fails without a ClusterPolicy), and writes a values file for\n" +
			"`helm install -f` (-o) and a report (--report, else standard output) that accounts for every input key: mapped to\n" +
			"what, dropped and why, needing a decision, or with no place in kube-gpu-stack. NVIDIADrivers become driver.pools;\n" +
			"the one marked default becomes the top-level driver values. With -f and --from-cluster both, the file's values\n" +
			"refine the cluster's. Values equal to the defaults of the GPU Operator release they come from (--from-version,\n" +
			"else recognised by the operand image versions they carry) are dropped, so a full copy of an older release's\n" +
			"values.yaml pins none of its default images over this chart's. It changes nothing in the cluster.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Stderr = cmd.ErrOrStderr()
			if o.FromCluster {
				cfg, err := scope.Flags.ToRESTConfig()
				if err != nil {
					return err
				}
				if o.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
					return err
				}
				o.Server = cfg.Host
			}
			if err := o.Validate(); err != nil {
				return err
			}
			_, err := o.Run(cmd.Context(), out)
			return err
		},
	}
	cmd.Flags().StringVarP(&o.File, "values", "f", "", "GPU Operator values `FILE` (or a ClusterPolicy and NVIDIADriver objects as YAML)")
	cmd.Flags().BoolVar(&o.FromCluster, "from-cluster", false, "read the running operator's ClusterPolicy, NVIDIADrivers and node labels")
	cmd.Flags().StringVar(&o.FromVersion, "from-version", "", "the GPU Operator `VERSION` the values come from (one of "+
		strings.Join(gpumigrate.KnownVersions(), ", ")+"): values equal to its defaults are dropped (default: recognised from the operand image versions)")
	cmd.Flags().StringSliceVar(&o.Kernels, "kernel", nil, "a GPU node's kernel (feature.node.kubernetes.io/kernel-version.full) for precompiled drivers (repeatable; --from-cluster reads them from the nodes)")
	cmd.Flags().StringVarP(&o.Out, "output", "o", "", "write the values to `FILE` (default standard output, the report then goes to standard error)")
	cmd.Flags().StringVar(&o.Report, "report", "", "write the report to `FILE` (default standard output)")
	return cmd
}
