// Package faults is the driver upgrade state machine under ordinary faults, on the local control plane (its tests),
// and Proxy, the faulty network between the stack's code and the API server that some of them put in the way.
package faults

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// Faults says which fraction of the requests through a Proxy fails, and how. The fractions add up to at most 1;
// a request gets at most one failure, and independently of it Delay with probability Slow.
type Faults struct {
	// ServerError answers 500 "etcdserver: request timed out" or 503, half each, without Retry-After (what an API
	// server says when etcd is slow or it is shutting down; client-go does not retry these by itself).
	ServerError float64
	// TooMany answers 429 with Retry-After: 1 (API Priority and Fairness rejecting a request).
	TooMany float64
	// Reset closes the client's connection with a TCP reset before any answer.
	Reset float64
	// Slow is the fraction of requests held back by Delay before they go on.
	Slow  float64
	Delay time.Duration
}

// Proxy is a TLS reverse proxy on loopback in front of the API server that injects Faults. Clients built from
// Config reach the API server through it, authenticated as the proxy's upstream identity.
type Proxy struct {
	// Config is a client config for the proxy.
	Config *rest.Config

	srv    *httptest.Server
	mu     sync.Mutex
	faults Faults
	rng    *rand.Rand
	counts map[string]int
}

// StartProxy serves a proxy to the API server that upstream reaches (with upstream's credentials), injecting
// nothing until Set.
func StartProxy(upstream *rest.Config) (*Proxy, error) {
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	p := &Proxy{rng: rand.New(rand.NewPCG(14, 14)), counts: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     transport,
		FlushInterval: -1, // watches stream
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.inject(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	}))
	p.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	p.srv.StartTLS()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	p.Config = &rest.Config{Host: p.srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: upstream.QPS, Burst: upstream.Burst}
	return p, nil
}

// Set makes the proxy inject f from now on (Faults{} stops injecting).
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
}

// Counts says how many requests the proxy saw ("requests") and how many got each fault ("500", "503", "429",
// "reset", "delayed").
func (p *Proxy) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
}

// inject decides a request's fault and, when it answers the request itself, answers it.
func (p *Proxy) inject(w http.ResponseWriter, r *http.Request) bool {
	p.mu.Lock()
	f := p.faults
	roll, slow, half := p.rng.Float64(), p.rng.Float64() < f.Slow, p.rng.IntN(2) == 0
	p.counts["requests"]++
	fault := ""
	switch {
	case roll < f.ServerError && half:
		fault = "500"
	case roll < f.ServerError:
		fault = "503"
	case roll < f.ServerError+f.TooMany:
		fault = "429"
	case roll < f.ServerError+f.TooMany+f.Reset:
		fault = "reset"
	}
	if fault != "" {
		p.counts[fault]++
	}
	if slow {
		p.counts["delayed"]++
	}
	p.mu.Unlock()
	if slow {
		select {
		case <-r.Context().Done():
			return true
		case <-time.After(f.Delay):
		}
	}
	switch fault {
	case "500":
		status(w, http.StatusInternalServerError, "InternalError", "etcdserver: request timed out")
	case "503":
		status(w, http.StatusServiceUnavailable, "ServiceUnavailable", "the server is currently unable to handle the request")
	case "429":
		w.Header().Set("Retry-After", "1")
		status(w, http.StatusTooManyRequests, "TooManyRequests", "too many requests, please try again later")
	case "reset":
		reset(w)
	default:
		return false
	}
	return true
}

// status answers with a metav1.Status as the API server writes it.
func status(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
		"message": fmt.Sprintf("fault injected: %s", message),
	})
}

// reset closes the client's TCP connection with RST (SO_LINGER 0) before any answer.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		status(w, http.StatusBadGateway, "InternalError", "connection reset")
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	raw := conn
	if nc, ok := conn.(interface{ NetConn() net.Conn }); ok {
		raw = nc.NetConn()
	}
	if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = raw.Close()
}
