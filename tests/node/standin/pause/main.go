// Command pause is the node's sandbox image: it holds the pod's namespaces open until it is told to stop, as
// registry.k8s.io/pause does, so the test node never pulls one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}
