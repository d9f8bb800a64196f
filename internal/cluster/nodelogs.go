package cluster

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/util/cert"
)

// ContainerLogs returns the log of a pod's container, and whether one is kept.
type ContainerLogs func(namespace, pod, container string) (string, bool)

// nodeEndpoint is the kubelet endpoint of every simulated node, for pod logs. The API server reads a pod's log
// from its node's kubelet (status.daemonEndpoints.kubeletEndpoint on the node's address), and kwok, which plays
// the simulated nodes, serves only logs its configuration names files for. So the cluster listens on one port of
// 127.0.0.1, which kwok writes into each simulated node's status (--node-port), and serves there what a
// ContainerLogs function keeps: `kubectl logs` and helm's hook logs show the output of the project's code the
// kubelet stand-in ran, as on a real cluster. Self-signed: without --kubelet-certificate-authority the API server
// does not verify a kubelet's certificate.
type nodeEndpoint struct {
	srv  *http.Server
	port int
	mu   sync.Mutex
	logs ContainerLogs
}

func startNodeEndpoint() (*nodeEndpoint, error) {
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return nil, fmt.Errorf("simulated nodes' kubelet endpoint: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("simulated nodes' kubelet endpoint: %w", err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, fmt.Errorf("simulated nodes' kubelet endpoint: %w", err)
	}
	e := &nodeEndpoint{port: ln.Addr().(*net.TCPAddr).Port}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", e.containerLogs)
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

func (e *nodeEndpoint) serve(logs ContainerLogs) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.logs = logs
}

// containerLogs answers the API server's GET /containerLogs/{namespace}/{pod}/{container}, honouring tailLines and
// limitBytes as a kubelet does; a log not kept is a 404 that says so.
func (e *nodeEndpoint) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	e.mu.Lock()
	logs := e.logs
	e.mu.Unlock()
	var out string
	ok := false
	if logs != nil {
		out, ok = logs(ns, pod, container)
	}
	if !ok {
		http.Error(w, fmt.Sprintf("simulated node: no log kept for container %q of pod %s/%s (only the pods the kubelet stand-in runs have one)", container, ns, pod), http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	if n, err := strconv.Atoi(q.Get("tailLines")); err == nil && n >= 0 {
		lines := strings.SplitAfter(out, "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		out = strings.Join(lines[max(0, len(lines)-n):], "")
	}
	if n, err := strconv.Atoi(q.Get("limitBytes")); err == nil && n >= 0 && n < len(out) {
		out = out[:n]
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, out)
}

func (e *nodeEndpoint) stop() { _ = e.srv.Close() }
