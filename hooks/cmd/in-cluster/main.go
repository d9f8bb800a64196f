// Command in-cluster is the one binary of the project's image, installed there as /usr/local/bin/kube-gpu-stack
// with validator and driver-manager linked to it; the name it is started as picks the command (hooks/cmd/incluster).
// A cgo build needs -ldflags=-extldflags=-Wl,-z,lazy (see hooks/cmd/incluster); the image's is static, without cgo.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/cmd/incluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/drivermanagercli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validatorcli"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	name, args := incluster.Select(os.Args)
	var cmd *cobra.Command
	switch name {
	case incluster.Validator:
		cmd = validatorcli.NewCommand(os.Stdout)
	case incluster.DriverManager:
		cmd = drivermanagercli.NewCommand(os.Stdout)
	default:
		cmd = stackcli.NewCommand(os.Stdout)
		cmd.Long = cmd.Short + ".\n\n" + incluster.About
	}
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
