// Package demo runs the README's demo: a local control plane with simulated GPU nodes, the chart installed with
// the helm SDK (its hooks run by the kubelet stand-in, validators passing), and a node x operand table of what runs
// where, followed by the post-install gate's own report.
package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/nodefixtures"
)

// Options of the demo.
type Options struct {
	// Profile is the values file to install (relative to the repository root).
	Profile string
	// Keep leaves the cluster running until interrupted and prints its kubeconfig.
	Keep bool
}

// Run starts the cluster, registers the demo nodes, installs the chart and prints the table.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{HarnessComponents: kubelet.Components()})
	if err != nil {
		return err
	}
	defer c.Stop()
	stand, err := kubelet.Start(ctx, c.Client, c.Kubeconfig)
	if err != nil {
		return err
	}
	var nodes []*corev1.Node
	var names []string
	for _, n := range nodefixtures.Demo() {
		nodes = append(nodes, n.Object())
		names = append(names, n.Name)
	}
	if err := c.AddNodes(ctx, nodes...); err != nil {
		return err
	}
	fmt.Fprintf(out, "control plane with %d simulated nodes up in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))

	t := install.Target{Kubeconfig: c.Kubeconfig, Release: "gpu", Namespace: "gpu-operator", Timeout: 3 * time.Minute}
	start = time.Now()
	profile := filepath.Join(chartrender.RepoRoot(), opts.Profile)
	if _, err := t.Install(ctx, []string{profile}); err != nil {
		return err
	}
	running, err := t.Running(ctx, c.Client, names)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "helm install %s: rolled out in %s; operand pods running per node:\n\n%s",
		opts.Profile, time.Since(start).Round(time.Millisecond), running.Table(names))
	for _, r := range stand.Runs() {
		if r.Component == "validation-gate" {
			fmt.Fprintf(out, "\npost-install gate (kube-gpu-stack check):\n%s", r.Output)
		}
	}
	if opts.Keep {
		fmt.Fprintf(out, "\ncluster kept running: export KUBECONFIG=%s  (Ctrl-C stops it)\n", c.Kubeconfig)
		<-ctx.Done()
	}
	return nil
}
