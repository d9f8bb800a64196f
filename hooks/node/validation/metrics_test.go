package validation

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// The exporter serves one gauge per check, read from the status files at each scrape.
func TestMetricsServeTheStatusFiles(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("metrics")
	o.MetricsAddr = "127.0.0.1:0"
	writeFile(t, e.out, "driver-ready", "IS_HOST_DRIVER=true\n", 0o644)
	writeFile(t, e.out, "toolkit-ready", "", 0o644)
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, pw); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // drain further log lines
	url := strings.TrimSpace(line[strings.Index(line, "http://"):])

	scrape := func() string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	body := scrape()
	for _, want := range []string{
		"gpu_operator_node_driver_ready 1", "gpu_operator_node_toolkit_ready 1",
		"gpu_operator_node_plugin_ready 0", "gpu_operator_node_cuda_ready 0",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Fatalf("scrape lacks %q:\n%s", want, body)
		}
	}
	if err := os.Remove(filepath.Join(e.out, "driver-ready")); err != nil {
		t.Fatal(err)
	}
	if body := scrape(); !strings.Contains(body, "gpu_operator_node_driver_ready 0\n") {
		t.Fatalf("a removed status file still reads ready:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("metrics did not stop with its context")
	}
}

// metricsNode is a GPU node in the middle of a driver change, with the driver recorded by GFD and the driver manager.
func metricsNode() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: testNode,
		Labels: map[string]string{
			nodestate.UpgradeStateLabel: string(nodestate.ValidationRequired),
			DriverVersionLabel:          "580.95.05",
			nodestate.RevertLabel:       "1111aaaa2222",
		},
		Annotations: map[string]string{
			nodestate.UpgradeSinceAnnotation:                 "2026-09-01T12:00:00Z",
			nodestate.DriverDigestAnnotation:                 "sha256:0123abcd",
			nodestate.ValidationAnnotationPrefix + "dra":     "waiting: no ResourceSlice yet",
			nodestate.ValidationAnnotationPrefix + "toolkit": "ready",
			nodestate.RevertedAnnotation:                     `{"from":"3333bbbb4444cccc","to":"1111aaaa2222dddd","daemonSet":"nvidia-driver-revert-1111aaaa2222","reason":"validation timed out","at":"2026-09-01T11:59:00Z"}`,
		},
	}}
}

// Every series the exporter emits for a node and its status files, exactly: the legacy gauges, one validation
// series per check that applies (the four always, dra because the node records an outcome for it, gds because
// its file exists), one upgrade state series per known state, the seconds in the state and the driver.
func TestMetricsExactSeries(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "driver-ready", "", 0o644)
	writeFile(t, dir, "toolkit-ready", "", 0o644)
	writeFile(t, dir, "nvidia-fs-ready", "", 0o644)
	node := metricsNode()
	now := time.Date(2026, 9, 1, 12, 1, 30, 0, time.UTC)
	c := newStatusCollector(dir, testNode, func() *corev1.Node { return node }, func() time.Time { return now })
	want := `
# HELP gpu_operator_node_cuda_ready 1 when this node's cuda validation passed (cuda-ready exists), else 0.
# TYPE gpu_operator_node_cuda_ready gauge
gpu_operator_node_cuda_ready 0
# HELP gpu_operator_node_driver_ready 1 when this node's driver validation passed (driver-ready exists), else 0.
# TYPE gpu_operator_node_driver_ready gauge
gpu_operator_node_driver_ready 1
# HELP gpu_operator_node_plugin_ready 1 when this node's plugin validation passed (plugin-ready exists), else 0.
# TYPE gpu_operator_node_plugin_ready gauge
gpu_operator_node_plugin_ready 0
# HELP gpu_operator_node_toolkit_ready 1 when this node's toolkit validation passed (toolkit-ready exists), else 0.
# TYPE gpu_operator_node_toolkit_ready gauge
gpu_operator_node_toolkit_ready 1
# HELP kube_gpu_stack_node_driver_info Always 1: the node's loaded driver version (nvidia.com/cuda.driver-version.full) and the config digest of its driver (kube-gpu-stack.io/driver-config-digest).
# TYPE kube_gpu_stack_node_driver_info gauge
kube_gpu_stack_node_driver_info{config_digest="sha256:0123abcd",node="gpu-node-1",version="580.95.05"} 1
# HELP kube_gpu_stack_node_driver_reverted 1 while the node runs the driver it went back to (to) after its new driver config (from) failed validation (kube-gpu-stack.io/driver-revert); no series otherwise.
# TYPE kube_gpu_stack_node_driver_reverted gauge
kube_gpu_stack_node_driver_reverted{from="3333bbbb4444",node="gpu-node-1",to="1111aaaa2222"} 1
# HELP kube_gpu_stack_node_driver_upgrade_state 1 for the node's current nvidia.com/gpu-driver-upgrade-state value, 0 for every other state.
# TYPE kube_gpu_stack_node_driver_upgrade_state gauge
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="cordon-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="drain-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="pod-deletion-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="pod-restart-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="uncordon-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="upgrade-done"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="upgrade-failed"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="upgrade-required"} 0
kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="validation-required"} 1
# HELP kube_gpu_stack_node_driver_upgrade_state_seconds Seconds since the node entered its current driver upgrade state (kube-gpu-stack.io/upgrade-since).
# TYPE kube_gpu_stack_node_driver_upgrade_state_seconds gauge
kube_gpu_stack_node_driver_upgrade_state_seconds{node="gpu-node-1"} 90
# HELP kube_gpu_stack_node_validation_ready 1 when the node's validation of component passed (its status file exists), else 0. Always reported for driver, toolkit, plugin and cuda; for other checks once they ran on the node.
# TYPE kube_gpu_stack_node_validation_ready gauge
kube_gpu_stack_node_validation_ready{component="cuda",node="gpu-node-1"} 0
kube_gpu_stack_node_validation_ready{component="dra",node="gpu-node-1"} 0
kube_gpu_stack_node_validation_ready{component="driver",node="gpu-node-1"} 1
kube_gpu_stack_node_validation_ready{component="gds",node="gpu-node-1"} 1
kube_gpu_stack_node_validation_ready{component="plugin",node="gpu-node-1"} 0
kube_gpu_stack_node_validation_ready{component="toolkit",node="gpu-node-1"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.CollectAndLint(c); err != nil || len(n) > 0 {
		t.Fatalf("lint: %v %v", n, err)
	}
}

// A node never upgraded reports every state 0 and no time in it; a value the stack does not write still shows;
// a node with neither a GFD version nor a digest has no driver_info; the legacy triple of older GFDs is read.
func TestMetricsNodeEdgeCases(t *testing.T) {
	dir := t.TempDir()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}
	c := newStatusCollector(dir, testNode, func() *corev1.Node { return node }, time.Now)
	if got := testutil.CollectAndCount(c, MetricUpgradeState); got != len(nodestate.UpgradeStates) {
		t.Fatalf("%d state series, want %d", got, len(nodestate.UpgradeStates))
	}
	if got := testutil.ToFloat64(gather(t, c, MetricUpgradeState)); got != 0 {
		t.Fatalf("an unlabelled node is in some state: sum %v", got)
	}
	for _, name := range []string{MetricUpgradeStateSeconds, MetricDriverInfo, MetricDriverReverted} {
		if got := testutil.CollectAndCount(c, name); got != 0 {
			t.Fatalf("%s: %d series for a node without state or driver", name, got)
		}
	}
	node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode,
		Labels: map[string]string{nodestate.UpgradeStateLabel: "some-other-state", legacyDriverMajorLabel: "550",
			legacyDriverMinorLabel: "127", legacyDriverRevisionLabel: "05"},
		Annotations: map[string]string{nodestate.UpgradeSinceAnnotation: "not a time"}}}
	if got := testutil.CollectAndCount(c, MetricUpgradeState); got != len(nodestate.UpgradeStates)+1 {
		t.Fatalf("%d state series, want the known ones and the unknown current one", got)
	}
	if got := testutil.CollectAndCount(c, MetricUpgradeStateSeconds); got != 0 {
		t.Fatal("an unreadable upgrade-since gives a time in state")
	}
	want := `
# HELP kube_gpu_stack_node_driver_info Always 1: the node's loaded driver version (nvidia.com/cuda.driver-version.full) and the config digest of its driver (kube-gpu-stack.io/driver-config-digest).
# TYPE kube_gpu_stack_node_driver_info gauge
kube_gpu_stack_node_driver_info{config_digest="",node="gpu-node-1",version="550.127.05"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), MetricDriverInfo); err != nil {
		t.Fatal(err)
	}
	// a revert record nobody can read: the label still says the node went back
	node.Labels[nodestate.RevertLabel] = "1111aaaa2222"
	node.Annotations[nodestate.RevertedAnnotation] = "{not json"
	want = `
# HELP kube_gpu_stack_node_driver_reverted 1 while the node runs the driver it went back to (to) after its new driver config (from) failed validation (kube-gpu-stack.io/driver-revert); no series otherwise.
# TYPE kube_gpu_stack_node_driver_reverted gauge
kube_gpu_stack_node_driver_reverted{from="unreadable",node="gpu-node-1",to="unreadable"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), MetricDriverReverted); err != nil {
		t.Fatal(err)
	}
	// no node known (no API access): only the status files
	c = newStatusCollector(dir, testNode, nil, time.Now)
	if got := testutil.CollectAndCount(c); got != 2*len(MetricsComponents) {
		t.Fatalf("%d series without a node, want the legacy and validation gauges of %v", got, MetricsComponents)
	}
}

// gather returns a collector that sums name's series, for ToFloat64.
func gather(t *testing.T, c prometheus.Collector, name string) prometheus.Collector {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sum"}, func() float64 { return sum })
}

// StackMetricNames is exactly what the exporter can emit: a name missing there would let a dashboard or rule
// reference a metric that is checked against nothing; a name the exporter does not emit would pass a typo.
func TestStackMetricNamesAreWhatTheExporterEmits(t *testing.T) {
	dir := t.TempDir()
	node := metricsNode()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newStatusCollector(dir, testNode, func() *corev1.Node { return node }, time.Now))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	if !slices.Equal(got, StackMetricNames()) {
		t.Fatalf("emitted %v\nStackMetricNames %v", got, StackMetricNames())
	}
}

// Every status file a check writes belongs to one component of ValidationStatusFiles, under the check's own name
// (the driver check also writes the extra modules' files, which the rdma, gds and gdrcopy checks own), and every
// component there is a validator check: a new check without its series fails here.
func TestValidationStatusFilesCoverEveryCheck(t *testing.T) {
	e := newEnv(t, nil)
	owner := map[string]string{}
	for component, files := range ValidationStatusFiles {
		if !slices.Contains(Components, component) {
			t.Errorf("ValidationStatusFiles names %q, which is no validator check", component)
		}
		for _, f := range files {
			owner[f] = component
		}
	}
	for _, component := range Components {
		if component == "ready" || component == "metrics" {
			continue
		}
		c, err := e.options(component).check()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := ValidationStatusFiles[c.name]; !ok {
			t.Errorf("check %s has no validation series", c.name)
		}
		for _, f := range c.owns {
			if _, ok := owner[f]; !ok {
				t.Errorf("check %s writes %s, which no validation series reports", c.name, f)
			}
		}
	}
}

// The exporter follows its Node through one watch: a state change shows at the next scrape, and scrapes never ask
// the API server.
func TestMetricsFollowTheNodeWatch(t *testing.T) {
	e := newEnv(t, metricsNode())
	o := e.options("metrics")
	o.MetricsAddr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, pw); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := strings.TrimSpace(line[strings.Index(line, "http://"):])
	select {
	case <-e.watches:
	case <-time.After(10 * time.Second):
		t.Fatal("no watch on the node")
	}
	scrapeUntil := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), want+"\n") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("scrape never showed %q:\n%s", want, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	scrapeUntil(`kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="validation-required"} 1`)
	reads := len(e.client.Actions())
	n, err := e.client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone)
	if _, err := e.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	scrapeUntil(`kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="upgrade-done"} 1`)
	scrapeUntil(`kube_gpu_stack_node_driver_upgrade_state{node="gpu-node-1",state="validation-required"} 0`)
	if got := len(e.client.Actions()); got != reads+2 {
		t.Fatalf("%d API calls around the scrapes, want only the test's get and update: %v", got-reads, e.client.Actions()[reads:])
	}
	for _, a := range e.client.Actions() {
		var fs string
		switch a := a.(type) {
		case k8stesting.ListActionImpl:
			fs = a.GetListRestrictions().Fields.String()
		case k8stesting.WatchActionImpl:
			fs = a.GetWatchRestrictions().Fields.String()
		default:
			continue
		}
		if fs != "metadata.name="+testNode {
			t.Fatalf("%s %s with field selector %q, want this node only", a.GetVerb(), a.GetResource().Resource, fs)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Without the right to watch its Node the exporter still serves the status files, and says why the rest is missing.
func TestMetricsWithoutNodeAccessServeTheStatusFiles(t *testing.T) {
	e := newEnv(t, metricsNode())
	e.client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, testNode, errors.New("no RBAC"))
	})
	writeFile(t, e.out, "driver-ready", "", 0o644)
	o := e.options("metrics")
	o.MetricsAddr = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx, pw); pw.Close() }()
	// the serving line and the watch's error, in either order
	r := bufio.NewReader(pr)
	var url, logged string
	for range 2 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(line, "http://"); i >= 0 {
			url = strings.TrimSpace(line[i:])
		} else {
			logged = line
		}
	}
	if url == "" || !strings.Contains(logged, "forbidden") || !strings.Contains(logged, "status files only") {
		t.Fatalf("log %q, want the forbidden watch named", logged)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if !strings.Contains(body, "gpu_operator_node_driver_ready 1\n") ||
		!strings.Contains(body, `kube_gpu_stack_node_validation_ready{component="driver",node="gpu-node-1"} 1`+"\n") {
		t.Fatalf("status file gauges missing:\n%s", body)
	}
	if strings.Contains(body, MetricUpgradeState) || strings.Contains(body, MetricDriverInfo+"{") {
		t.Fatalf("node metrics without a node:\n%s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
