// Command validator runs the per-node checks and the status-file barrier of kube-gpu-stack operands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/validatorcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := validatorcli.NewCommand(os.Stdout).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "validator:", err)
		os.Exit(1)
	}
}
