// Command placement-demo renders the chart for a values profile through the helm SDK and prints which operand
// runs on which simulated node, as the scheduler's affinity and taint rules decide it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/placement"
)

func main() {
	profile := flag.String("values", "values/mixed.yaml", "values profile to render")
	flag.Parse()
	if err := run(*profile); err != nil {
		fmt.Fprintln(os.Stderr, "placement-demo:", err)
		os.Exit(1)
	}
}

func run(profile string) error {
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		return err
	}
	vals, err := chartrender.Values([]string{profile}, nil)
	if err != nil {
		return err
	}
	stream, err := chartrender.Render(context.Background(), chrt, vals, chartrender.KubeVersions[len(chartrender.KubeVersions)-1])
	if err != nil {
		return err
	}
	dss, err := placement.DaemonSets(stream)
	if err != nil {
		return err
	}
	var nodes []*corev1.Node
	var names []string
	for _, n := range nodefixtures.RoleMatrix() {
		nodes = append(nodes, n.Object())
		names = append(names, n.Name)
	}
	p, err := placement.Place(dss, nodes)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d operand DaemonSets on %d simulated nodes\n\n%s", profile, len(dss), len(nodes), p.Table(names))
	return nil
}
