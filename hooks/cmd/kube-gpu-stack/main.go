// Command kube-gpu-stack is the admin's CLI: the release's status and upgrade views, plan, migrate, the image build
// and push, and the air-gapped bundle (hooks/admin/admincli). The image the chart runs carries hooks/cmd/in-cluster
// under this name instead, without the commands that need the helm SDK or a registry client.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/admincli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := admincli.NewCommand(os.Stdout).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kube-gpu-stack:", err)
		os.Exit(1)
	}
}
