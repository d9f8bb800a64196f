package validation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/metricsauth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// MetricsComponents are the checks the node status exporter reports, as gpu_operator_node_<check>_ready (the GPU
// Operator's names, so existing dashboards and alerts keep working). They apply on every node the exporter runs on
// (container nodes), so their kube_gpu_stack_node_validation_ready series are always there.
var MetricsComponents = []string{"driver", "toolkit", "plugin", "cuda"}

// ValidationStatusFiles maps each check to the status files that say it passed (any one of them): what
// kube_gpu_stack_node_validation_ready reports.
var ValidationStatusFiles = map[string][]string{
	"driver":       {"driver-ready"},
	"toolkit":      {"toolkit-ready"},
	"cuda":         {"cuda-ready"},
	"plugin":       {"plugin-ready"},
	"dra":          {"dra-ready"},
	"vfio-pci":     {"vfio-pci-ready"},
	"vgpu-manager": {"vgpu-manager-ready", "host-vgpu-manager-ready"},
	"vgpu-devices": {"vgpu-devices-ready"},
	"cc-manager":   {"cc-manager-ready"},
	"rdma":         {"nvidia-peermem-ready"},
	"gds":          {"nvidia-fs-ready"},
	"gdrcopy":      {"gdrcopy-ready"},
}

// Node labels the exporter reads the loaded driver's version from: gpu-feature-discovery's, which it takes from
// NVML (the legacy major/minor/rev triple on older GFD versions).
const (
	DriverVersionLabel        = "nvidia.com/cuda.driver-version.full"
	legacyDriverMajorLabel    = "nvidia.com/cuda.driver.major"
	legacyDriverMinorLabel    = "nvidia.com/cuda.driver.minor"
	legacyDriverRevisionLabel = "nvidia.com/cuda.driver.rev"
)

// The stack's own per-node metrics.
const (
	MetricValidationReady     = "kube_gpu_stack_node_validation_ready"
	MetricUpgradeState        = "kube_gpu_stack_node_driver_upgrade_state"
	MetricUpgradeStateSeconds = "kube_gpu_stack_node_driver_upgrade_state_seconds"
	MetricDriverInfo          = "kube_gpu_stack_node_driver_info"
	MetricDriverReverted      = "kube_gpu_stack_node_driver_reverted"
)

// StackMetricNames returns every metric name the node status exporter can emit, sorted: what dashboards and alert
// rules may reference.
func StackMetricNames() []string {
	names := []string{MetricValidationReady, MetricUpgradeState, MetricUpgradeStateSeconds, MetricDriverInfo, MetricDriverReverted}
	for _, c := range MetricsComponents {
		names = append(names, legacyReadyMetric(c))
	}
	slices.Sort(names)
	return names
}

func legacyReadyMetric(component string) string { return "gpu_operator_node_" + component + "_ready" }

// NodeGetter returns this node as last seen, or nil when it is not known (yet).
type NodeGetter func() *corev1.Node

// statusCollector reads the status files at each scrape (no watch to fall behind, nothing cached) and the Node
// from a watch (node), never from the API server during a scrape.
type statusCollector struct {
	dir      hostfs.Root
	nodeName string
	node     NodeGetter
	now      func() time.Time
	legacy   map[string]*prometheus.Desc

	validation, upgradeState, upgradeSeconds, driverInfo, driverReverted *prometheus.Desc
}

func newStatusCollector(dir, nodeName string, node NodeGetter, now func() time.Time) *statusCollector {
	if node == nil {
		node = func() *corev1.Node { return nil }
	}
	c := &statusCollector{dir: hostfs.Root(dir), nodeName: nodeName, node: node, now: now, legacy: map[string]*prometheus.Desc{}}
	for _, name := range MetricsComponents {
		c.legacy[name] = prometheus.NewDesc(legacyReadyMetric(name),
			fmt.Sprintf("1 when this node's %s validation passed (%s-ready exists), else 0.", name, name), nil, nil)
	}
	c.validation = prometheus.NewDesc(MetricValidationReady,
		"1 when the node's validation of component passed (its status file exists), else 0. Always reported for "+
			"driver, toolkit, plugin and cuda; for other checks once they ran on the node.", []string{"node", "component"}, nil)
	c.upgradeState = prometheus.NewDesc(MetricUpgradeState,
		"1 for the node's current "+nodestate.UpgradeStateLabel+" value, 0 for every other state.", []string{"node", "state"}, nil)
	c.upgradeSeconds = prometheus.NewDesc(MetricUpgradeStateSeconds,
		"Seconds since the node entered its current driver upgrade state ("+nodestate.UpgradeSinceAnnotation+").", []string{"node"}, nil)
	c.driverInfo = prometheus.NewDesc(MetricDriverInfo,
		"Always 1: the node's loaded driver version ("+DriverVersionLabel+") and the config digest of its driver ("+
			nodestate.DriverDigestAnnotation+").", []string{"node", "version", "config_digest"}, nil)
	c.driverReverted = prometheus.NewDesc(MetricDriverReverted,
		"1 while the node runs the driver it went back to (to) after its new driver config (from) failed validation "+
			"("+nodestate.RevertLabel+"); no series otherwise.", []string{"node", "from", "to"}, nil)
	return c
}

// Describe implements prometheus.Collector.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, name := range MetricsComponents {
		ch <- c.legacy[name]
	}
	ch <- c.validation
	ch <- c.upgradeState
	ch <- c.upgradeSeconds
	ch <- c.driverInfo
	ch <- c.driverReverted
}

// Collect implements prometheus.Collector.
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	node := c.node()
	for _, component := range slices.Sorted(maps.Keys(ValidationStatusFiles)) {
		ok, err := c.passed(component)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.validation, err)
			if d, legacy := c.legacy[component]; legacy {
				ch <- prometheus.NewInvalidMetric(d, err)
			}
			continue
		}
		if d, legacy := c.legacy[component]; legacy {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, gauge(ok))
		}
		// A check that never ran here (another role's, a feature that is off) has no series: absent is not failed.
		_, recorded := nodeAnnotation(node, nodestate.ValidationAnnotationPrefix+component)
		if ok || recorded || slices.Contains(MetricsComponents, component) {
			ch <- prometheus.MustNewConstMetric(c.validation, prometheus.GaugeValue, gauge(ok), c.nodeName, component)
		}
	}
	if node == nil {
		return
	}
	current, hasState := node.Labels[nodestate.UpgradeStateLabel]
	states := make([]string, 0, len(nodestate.UpgradeStates)+1)
	for _, s := range nodestate.UpgradeStates {
		states = append(states, string(s))
	}
	if hasState && current != "" && !slices.Contains(states, current) {
		states = append(states, current) // a value the stack does not write: still shown, not hidden
	}
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(c.upgradeState, prometheus.GaugeValue, gauge(s == current), c.nodeName, s)
	}
	if since, err := time.Parse(time.RFC3339, node.Annotations[nodestate.UpgradeSinceAnnotation]); hasState && err == nil {
		ch <- prometheus.MustNewConstMetric(c.upgradeSeconds, prometheus.GaugeValue, max(0, c.now().Sub(since).Seconds()), c.nodeName)
	}
	version, digest := driverVersion(node), node.Annotations[nodestate.DriverDigestAnnotation]
	if version != "" || digest != "" {
		ch <- prometheus.MustNewConstMetric(c.driverInfo, prometheus.GaugeValue, 1, c.nodeName, version, digest)
	}
	if nodestate.Reverted(node) {
		// a record nobody can read still says the node went back (its label does): shown, with digests unknown
		from, to := "unreadable", "unreadable"
		if r, err := nodestate.ReadRevert(node); err == nil {
			from, to = nodestate.ShortDigest(r.From), nodestate.ShortDigest(r.To)
		}
		ch <- prometheus.MustNewConstMetric(c.driverReverted, prometheus.GaugeValue, 1, c.nodeName, from, to)
	}
}

// passed reports whether any of component's status files exists.
func (c *statusCollector) passed(component string) (bool, error) {
	for _, f := range ValidationStatusFiles[component] {
		ok, err := c.dir.Exists(f)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// driverVersion is the loaded driver's version as gpu-feature-discovery labelled it; empty when unlabelled.
func driverVersion(node *corev1.Node) string {
	if v := node.Labels[DriverVersionLabel]; v != "" {
		return v
	}
	major, minor, rev := node.Labels[legacyDriverMajorLabel], node.Labels[legacyDriverMinorLabel], node.Labels[legacyDriverRevisionLabel]
	if major == "" || minor == "" {
		return ""
	}
	v := major + "." + minor
	if rev != "" {
		v += "." + rev
	}
	return v
}

func nodeAnnotation(node *corev1.Node, key string) (string, bool) {
	if node == nil {
		return "", false
	}
	v, ok := node.Annotations[key]
	return v, ok
}

func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// watchNode keeps the latest copy of this node from one watch on it alone (kwatch.Node: a field selector on its
// name), so a scrape reads memory, never the API server. Until the first list (the API server unreachable) and
// after a watch that cannot work (forbidden) it knows no node: only the status files are reported. Without a
// client or a node name it knows no node.
func (o *Options) watchNode(ctx context.Context, out io.Writer) NodeGetter {
	if o.Client == nil || o.NodeName == "" {
		return nil
	}
	var store atomic.Pointer[kwatch.Store[*corev1.Node]]
	go func() {
		s, err := kwatch.Start(ctx, kwatch.Node(o.Client, o.NodeName), &corev1.Node{})
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(out, "metrics: %v: reporting the status files only\n", err)
			}
			return
		}
		store.Store(s)
	}()
	return func() *corev1.Node {
		s := store.Load()
		if s == nil {
			return nil
		}
		n, ok := s.Get("", o.NodeName)
		if !ok {
			return nil
		}
		return n
	}
}

// serveMetrics serves the status files as gauges on MetricsAddr /metrics until ctx ends; with MetricsSecure over
// TLS and only to callers the API server lets GET /metrics. /healthz answers anyone (the readiness probe).
func (o *Options) serveMetrics(ctx context.Context, out io.Writer) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newStatusCollector(o.OutputDir, o.NodeName, o.watchNode(ctx, out), time.Now))
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	scheme := "http"
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	if o.MetricsSecure {
		if o.Client == nil {
			return errors.New("metrics: secure metrics need the API server (for token and access reviews), and there is no API access")
		}
		metrics = metricsauth.New(o.Client).Protect(metrics)
		var err error
		if srv.TLSConfig, err = metricsauth.SelfSignedTLS(o.NodeName); err != nil {
			return err
		}
		scheme = "https"
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv.Handler = mux
	ln, err := net.Listen("tcp", o.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", o.MetricsAddr, err)
	}
	if srv.TLSConfig != nil {
		ln = tls.NewListener(ln, srv.TLSConfig)
	}
	fmt.Fprintf(out, "metrics: serving the status files of %s on %s://%s/metrics\n", o.OutputDir, scheme, ln.Addr())
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
