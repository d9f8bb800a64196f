// Package validatorcli is the `validator` command: the per-node checks run as init containers of the operand
// DaemonSets. This release carries the status-file barrier every operand uses (wait, cleanup); the component
// checks (driver, toolkit, cuda, plugin, vfio-pci, vgpu-manager, vgpu-devices, cc-manager, metrics) follow.
package validatorcli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/statusfiles"
)

// NewCommand returns the validator root command writing its summary lines to out.
func NewCommand(out io.Writer) *cobra.Command {
	dir := os.Getenv("OUTPUT_DIR")
	if dir == "" {
		dir = statusfiles.DefaultDir
	}
	root := &cobra.Command{
		Use:           "validator",
		Short:         "Per-node GPU stack checks and the status files operands wait on",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&dir, "dir", dir, "validations directory (env OUTPUT_DIR)")

	wait := statusfiles.WaitOptions{}
	waitCmd := &cobra.Command{
		Use:   "wait FILE...",
		Short: "Block until one of the status files exists (e.g. toolkit-ready)",
		RunE: func(cmd *cobra.Command, args []string) error {
			wait.Dir, wait.Files = dir, args
			wait.Complete()
			if err := wait.Validate(); err != nil {
				return err
			}
			found, err := statusfiles.Wait(cmd.Context(), wait, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s is present: continuing\n", found)
			return nil
		},
	}
	waitCmd.Flags().DurationVar(&wait.Interval, "interval", 0, "time between checks (default 5s)")
	waitCmd.Flags().DurationVar(&wait.Timeout, "timeout", 0, "give up after this long (0: wait until stopped)")

	cleanupCmd := &cobra.Command{
		Use:   "cleanup FILE...",
		Short: "Remove the named status files (run from preStop, so no stale \"ready\" outlives its check)",
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := statusfiles.Cleanup(dir, args)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "removed %d of %d status files from %s\n", n, len(args), dir)
			return nil
		},
	}
	root.AddCommand(waitCmd, cleanupCmd)
	return root
}
