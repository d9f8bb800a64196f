// Package apiretrytest holds the API errors that may pass, for the tests of every package that retries them
// (apiretry itself, the driver manager, the drain, the node state writes): one table, so each retries the same kinds.
package apiretrytest

import (
	"errors"
	"net"
	"net/url"
	"os"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Transient returns the errors a client sees while the API server or etcd restarts, or the connection drops, by a
// name for the test's subtests. Throttling (429) is left to the tests that mean it: on an eviction it is a
// disruption budget's refusal, not an error that passes.
func Transient() map[string]error {
	nodes := schema.GroupResource{Resource: "nodes"}
	return map[string]error{
		"etcd request timed out": apierrors.NewInternalError(errors.New("etcdserver: request timed out")),
		"503":                    apierrors.NewServiceUnavailable("the server is shutting down"),
		"504":                    apierrors.NewServerTimeout(nodes, "patch", 1),
		"connection refused": &url.Error{Op: "Patch", URL: "https://10.0.0.1/api", Err: &net.OpError{Op: "dial", Net: "tcp",
			Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}},
		"connection reset": &url.Error{Op: "Post", URL: "https://10.0.0.1/api", Err: &net.OpError{Op: "read", Net: "tcp",
			Err: os.NewSyscallError("read", syscall.ECONNRESET)}},
	}
}
