// Package rolloutbench measures a driver rollout across one large pool on the local control plane: the chart
// installed with the helm SDK on -nodes simulated GPU nodes (default 200), then a driver change rolled by the
// DaemonSet controller, with the real driver manager and upgrade gate run for every driver pod by the kubelet
// stand-in (internal/kubelet), whose driver container takes a fixed -install time. It reports the rollout's
// total time, the overhead beyond the install per batch and where it goes, and the API requests per node by
// component (client side for the stack's own code, server side from the audit log for everyone).
//
// It is a benchmark only: without -bench its TestMain starts nothing, so `make test` pays nothing for it.
//
//	go test ./tests/rolloutbench -run XXX -bench . -benchtime 1x -timeout 60m [-args -nodes 200 -install 30s -max-unavailable 20]
package rolloutbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
)

var (
	nodeCount      = flag.Int("nodes", 200, "GPU nodes in the pool")
	installTime    = flag.Duration("install", 30*time.Second, "how long each node's driver install takes")
	maxUnavailable = flag.Int("max-unavailable", 20, "the pool's driver.upgradePolicy.maxUnavailable")
	timeline       = flag.String("timeline", "", "write each node's phase times (seconds from the rollout's start) as CSV to this file")
	keepAudit      = flag.Bool("keep-audit", false, "keep the API server's audit log (JSON lines, every request) and print where")
)

var (
	kube     *cluster.Cluster
	stand    *kubelet.Kubelet
	nodes    []*corev1.Node
	auditDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark asked for: no cluster
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	for _, n := range nodefixtures.Rollout(*nodeCount) {
		nodes = append(nodes, n.Object())
	}
	opts := cluster.Options{Log: cluster.LogSink(), HarnessComponents: kubelet.Components(), HarnessTerminates: kubelet.Terminates(), ControllerManagerArgs: cluster.TolerateLateHeartbeats}
	var err error
	if auditDir, err = os.MkdirTemp("", "rolloutbench-audit-"); err != nil {
		fmt.Println("rolloutbench:", err)
		return 1
	}
	if *keepAudit {
		fmt.Println("rolloutbench: the API server's audit log is kept in", apiload.AuditLog(auditDir))
	} else {
		defer os.RemoveAll(auditDir)
	}
	if opts.APIServerArgs, err = apiload.Args(auditDir); err != nil {
		fmt.Println("rolloutbench:", err)
		return 1
	}
	c, skip, err := cluster.ForPackage(opts)
	switch {
	case skip:
		fmt.Printf("SKIP rolloutbench: %v\n", err)
		return 0
	case err != nil:
		fmt.Printf("rolloutbench: %v\n", err)
		return 1
	}
	defer c.Stop()
	kube = c
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// the stand-in's own writes (pod status, the validators' node labels) under a user agent of their own
	standClient, err := kubernetes.NewForConfig(withAgent(c.Config, "kubelet-stand-in"))
	if err != nil {
		fmt.Println("rolloutbench:", err)
		return 1
	}
	if stand, err = kubelet.Start(ctx, standClient, c.Kubeconfig); err != nil {
		fmt.Printf("rolloutbench: kubelet stand-in: %v\n", err)
		return 1
	}
	addCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := c.AddNodes(addCtx, nodes...); err != nil {
		fmt.Printf("rolloutbench: %v\n", err)
		return 1
	}
	fmt.Printf("rolloutbench: cluster with %d simulated nodes ready in %s\n", len(nodes), time.Since(start).Round(time.Millisecond))
	return m.Run()
}

// withAgent is cfg with its own user agent (the audit log's userAgent).
func withAgent(cfg *rest.Config, agent string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.UserAgent = agent
	return c
}
