// Command driver-manager prepares a node for a driver change: the init container of the driver and vGPU-manager
// pods (uninstall-driver), and the step that uncordons the node once it validates (uncordon-when-valid).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/drivermanagercli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := drivermanagercli.NewCommand(os.Stdout).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "driver-manager:", err)
		os.Exit(1)
	}
}
