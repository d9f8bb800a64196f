package stackcli

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/runtimeconfig"
)

// keepRuntimeConfigCommand is the toolkit pod's native sidecar: it records the runtime's main config before the
// toolkit starts, waits for its own stop (a native sidecar stops after the pod's containers, so after the toolkit's
// own cleanup), and then gives the config back and removes the toolkit's CDI spec (package runtimeconfig).
func keepRuntimeConfigCommand(out io.Writer) *cobra.Command {
	var k runtimeconfig.Keeper
	cmd := &cobra.Command{
		Use:   "keep-runtime-config --state FILE [--config FILE --drop-in HOSTPATH] [--cdi-spec FILE]...",
		Short: "Record the container runtime's config before the toolkit, and give it back, without the toolkit's import and CDI spec, when stopped",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if k.State == "" || (k.Config != "") != (k.DropIn != "") {
				return fmt.Errorf("--state is required, and --config and --drop-in go together")
			}
			k.Log = slog.New(slog.NewTextHandler(out, nil))
			if err := k.Keep(); err != nil {
				return err
			}
			<-cmd.Context().Done() // SIGTERM: the pod stops, its toolkit container has ended
			return k.Restore()
		},
	}
	cmd.Flags().StringVar(&k.State, "state", "", "the record of the config from before the toolkit, on a host folder that outlives the pod")
	cmd.Flags().StringVar(&k.Config, "config", "", "the runtime's main config, as this container sees it (empty: the toolkit changes none)")
	cmd.Flags().StringVar(&k.DropIn, "drop-in", "", "the toolkit's drop-in as the host names it, which the config imports (RUNTIME_DROP_IN_CONFIG_HOST_PATH)")
	cmd.Flags().StringArrayVar(&k.Specs, "cdi-spec", nil, "a CDI spec the toolkit writes at its start, removed at the stop (repeatable)")
	return cmd
}
