package validation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/hostfs"
)

// MetricsComponents are the checks the node status exporter reports, as gpu_operator_node_<check>_ready (the GPU
// Operator's names, so existing dashboards and alerts keep working).
var MetricsComponents = []string{"driver", "toolkit", "plugin", "cuda"}

// statusCollector reads the status files at each scrape: no watch to fall behind, nothing cached.
type statusCollector struct {
	dir   hostfs.Root
	descs map[string]*prometheus.Desc
}

func newStatusCollector(dir string) *statusCollector {
	c := &statusCollector{dir: hostfs.Root(dir), descs: map[string]*prometheus.Desc{}}
	for _, name := range MetricsComponents {
		c.descs[name] = prometheus.NewDesc("gpu_operator_node_"+name+"_ready",
			fmt.Sprintf("1 when this node's %s validation passed (%s-ready exists), else 0.", name, name), nil, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, name := range MetricsComponents {
		ch <- c.descs[name]
	}
}

// Collect implements prometheus.Collector.
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range MetricsComponents {
		ok, err := c.dir.Exists(name + "-ready")
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.descs[name], err)
			continue
		}
		v := 0.0
		if ok {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v)
	}
}

// serveMetrics serves the status files as gauges on MetricsAddr /metrics until ctx ends.
func (o *Options) serveMetrics(ctx context.Context, out io.Writer) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newStatusCollector(o.OutputDir))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", o.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", o.MetricsAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "metrics: serving the status files of %s on http://%s/metrics\n", o.OutputDir, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: shut down: %w", err)
	}
	return nil
}
