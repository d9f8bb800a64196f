package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

// RunPackage is a test package's TestMain body: it starts a node (and its control plane), hands it to use, runs
// the tests, stops the node and fails the package when the machine was not put back as it was (every difference
// named). Without root or control-plane binaries it reports a skip, except under CI=true, where a missing piece is a
// failure.
func RunPackage(m *testing.M, name string, opts Options, use func(*Node) error) int {
	ci := os.Getenv("CI") == "true"
	if _, err := cluster.BinDir(); err == nil {
		err = (&opts).Validate()
		if err != nil && !ci {
			fmt.Printf("SKIP %s: %v\n", name, err)
			return 0
		}
	} else if !ci {
		fmt.Printf("SKIP %s: %v\n", name, err)
		return 0
	}
	if opts.Log == nil {
		opts.Log = cluster.LogSink()
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	n, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Printf("%s: start node: %v\n", name, err)
		return 1
	}
	n.StopOnSignal()
	if len(n.Cleared) > 0 {
		fmt.Printf("%s: cleared what an earlier run that died left on the machine:\n  %s\n", name, strings.Join(n.Cleared, "\n  "))
	}
	fmt.Printf("%s: node %s Ready in %s\n", name, n.Name, time.Since(start).Round(100*time.Millisecond))
	code := 1
	if err := use(n); err != nil {
		fmt.Printf("%s: %v\n", name, err)
	} else {
		code = m.Run()
	}
	if err := n.Stop(); err != nil {
		fmt.Printf("%s: %v\n", name, err)
		code = 1
	}
	if err := n.CheckRestored(); err != nil {
		fmt.Printf("%s: %v\n", name, err)
		code = 1
	}
	return code
}

// CheckRestored compares the host now with Before and names every difference.
func (n *Node) CheckRestored() error {
	after, err := Snapshot()
	if err != nil {
		return err
	}
	if diff := n.Before.Diff(after); len(diff) > 0 {
		return errors.New("the node left the machine changed:\n  " + strings.Join(diff, "\n  "))
	}
	return nil
}
