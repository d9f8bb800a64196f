// Package admincli is the `kube-gpu-stack` command users run on their own machine: every command of the in-cluster
// binary (hooks/release/stackcli: status, upgrade status / retry, and the hooks) plus the ones that render the chart with
// the helm SDK or talk to registries: plan, migrate, image build / push and airgap. Those stay out of the image the
// chart runs, which keeps it small.
package admincli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

// NewCommand returns the root command writing its output to out.
func NewCommand(out io.Writer) *cobra.Command {
	root, scope := stackcli.NewRoot(out)
	root.Short = "Install, plan, migrate and follow the kube-gpu-stack chart: its image, air-gapped bundles, and the release's hooks"
	if status, _, err := root.Find([]string{"status"}); err == nil && status != root {
		withFleetView(status, scope, out)
	}
	for _, c := range []*cobra.Command{planCommand(scope, out), migrateCommand(scope, out), imageCommand(out), airgapCommand(out)} {
		c.GroupID = stackcli.AdminGroup
		root.AddCommand(c)
	}
	hideHooks(root)
	return root
}

// hideHooks keeps the commands the chart's Jobs and pods run off the admin's first screen of --help (they stay
// runnable, and the in-cluster binary lists them): `kube-gpu-stack hooks` lists them instead.
func hideHooks(root *cobra.Command) {
	var lines []string
	for _, c := range root.Commands() {
		if c.GroupID == stackcli.HookGroup {
			c.Hidden = true
			lines = append(lines, fmt.Sprintf("  %-20s %s", c.Name(), c.Short))
		}
	}
	list := "The chart's Jobs and pods run these; an admin rarely does (each has --help):\n\n" + strings.Join(lines, "\n")
	root.AddCommand(&cobra.Command{
		Use:     "hooks",
		Short:   "List the commands the chart's hooks and pods run",
		Long:    list,
		Args:    cobra.NoArgs,
		GroupID: stackcli.HookGroup,
		Run:     func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), list) },
	})
}
