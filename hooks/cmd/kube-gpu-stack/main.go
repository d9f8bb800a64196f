// Command kube-gpu-stack runs the chart's release-level hooks (check, cleanup) and shows their report (status).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/stackcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := stackcli.NewCommand(os.Stdout).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kube-gpu-stack:", err)
		os.Exit(1)
	}
}
