package stackcli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/refusal"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

func preUpgradeCommand(flags *genericclioptions.ConfigFlags, release *string, out io.Writer, now *func() time.Time) *cobra.Command {
	o := upgradeplan.Options{}
	var pools, vgpuPools, job string
	cmd := &cobra.Command{
		Use:   "pre-upgrade",
		Short: "Plan a driver change and mark the nodes it touches upgrade-required, or refuse (the pre-upgrade hook)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, o.Namespace, o.Pools, err = releaseScope(flags, pools); err != nil {
				return err
			}
			if o.VGPUPools, err = driverpools.Parse(vgpuPools); err != nil {
				return fmt.Errorf("vGPU manager pools: %w", err)
			}
			o.Release, o.Now = *release, *now
			if err := o.Validate(); err != nil {
				return err
			}
			_, err = upgradeplan.Run(cmd.Context(), o, out)
			if err != nil && job != "" {
				// where `kubectl describe job` and `kube-gpu-stack status` show it (Helm prints only
				// BackoffLimitExceeded); the run's own deadline may have passed, so the record gets its own
				ctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 30*time.Second)
				defer cancel()
				if rerr := refusal.Record(ctx, o.Client, o.Namespace, job, err.Error(), o.Now()); rerr != nil {
					fmt.Fprintf(out, "could not record the refusal on the Job: %v\n", rerr)
				}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "the hook's own Job, in the release namespace: a refusal is recorded on it as an Event (reason "+refusal.Reason+")")
	cmd.Flags().StringVar(&pools, "driver-pools", os.Getenv("DRIVER_POOLS"), "driver pools as JSON (env DRIVER_POOLS)")
	cmd.Flags().StringVar(&vgpuPools, "vgpu-manager-pools", os.Getenv("VGPU_MANAGER_POOLS"), "vGPU manager pools as JSON, the driver pools' shape (env VGPU_MANAGER_POOLS)")
	cmd.Flags().BoolVar(&o.Evict, "evict", true, "the driver manager evicts GPU pods, so PDBs that never allow eviction block the upgrade")
	cmd.Flags().BoolVar(&o.Force, "force", false, "proceed although PDBs block eviction")
	return cmd
}

func upgradeCommand(flags *genericclioptions.ConfigFlags, release *string, out io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "upgrade", Short: "Driver upgrade progress per node, and retry of a failed node"}
	var watch bool
	var interval time.Duration
	status := &cobra.Command{
		Use:   "status",
		Short: "Print each GPU node's driver upgrade state, driver, since when and why",
		Long: "Prints each GPU node's driver upgrade state, driver (FROM -> TO while its DaemonSet installs another, DOWNGRADE\n" +
			"where it is older), since when and why, for the release's driver pods (of\n" +
			"every release in the namespace without --release). It fails when the namespace holds no such release.\n" + NamespaceHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ns, from, err := adminClients(flags)
			if err != nil {
				return err
			}
			if err := findRelease(cmd.Context(), client, ns, from, *release); err != nil {
				return err
			}
			if !watch {
				return upgradeplan.WriteStatus(cmd.Context(), client, ns, *release, out)
			}
			return upgradeplan.Watch(cmd.Context(), interval, out, time.Now, func(w io.Writer) error {
				if err := upgradeplan.WriteSummary(cmd.Context(), client, ns, GateJob, time.Now(), w); err != nil {
					return err
				}
				fmt.Fprintln(w)
				return upgradeplan.WriteStatus(cmd.Context(), client, ns, *release, w)
			})
		},
	}
	status.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every --interval, with the count of nodes per state, each pool's canary and the validation gate's time left, until Ctrl-C")
	status.Flags().DurationVar(&interval, "interval", DefaultWatchInterval, "how often --watch redraws")
	cmd.AddCommand(status, &cobra.Command{
		Use:   "retry NODE",
		Short: "Move a node out of upgrade-failed and restart its driver pod",
		Long:  "Moves a node out of upgrade-failed and restarts its driver pod of the release. " + NamespaceHelp,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ns, from, err := adminClients(flags)
			if err != nil {
				return err
			}
			// in the wrong namespace it would find no driver pod to restart, after marking the node
			if err := findRelease(cmd.Context(), client, ns, from, *release); err != nil {
				return err
			}
			return upgradeplan.Retry(cmd.Context(), client, ns, *release, args[0], time.Now(), out)
		},
	})
	return cmd
}
