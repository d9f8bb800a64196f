package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The DCGM exporter's metrics the agent reads (dcgm-exporter 4.5.3-4.8.2, internal/pkg/collector and the chart's
// files/health-metrics.csv). DCGM_EXP_XID_ERRORS_COUNT is, per GPU, how many times each Xid was seen within the
// exporter's window (--xid-count-window-size, DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE, default 300000 ms, echoed in the
// window_size_in_ms label), one series per xid label; a GPU without an Xid in the window has one series valued 0 and
// no xid label, so the family is there whenever the collector is on.
const (
	metricXidCount        = "DCGM_EXP_XID_ERRORS_COUNT"
	metricECCDoubleBit    = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
	metricRowRemapFailure = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
	metricRowRemapPending = "DCGM_FI_DEV_ROW_REMAP_PENDING"
)

// ErrNoXidCount: the exporter answers but does not export DCGM_EXP_XID_ERRORS_COUNT (its collectors CSV lacks it:
// dcgmExporter.config.profile is not health), so it cannot tell the agent about Xids.
var ErrNoXidCount = errors.New("the DCGM exporter does not export " + metricXidCount +
	" (set dcgmExporter.config.profile=health, or add it to the exporter's collectors CSV)")

// Reading is one scrape of the DCGM exporter judged by the policy.
type Reading struct {
	// GPUs is how many GPUs the exporter reports.
	GPUs int
	// Xids are the fatal Xids within the exporter's window: the agent latches them, as they leave the window while
	// the GPU still needs a reset or a reboot.
	Xids []Fault
	// State are the watched faults the exporter reads afresh each time (ECC double-bit errors since the driver
	// loaded, row remapping): they last exactly as long as the GPU's state does.
	State []Fault
	// Seen lists the Xids the policy does not call fatal, for the log.
	Seen []string
}

// ReadExposition parses the exporter's /metrics (Prometheus text format) and judges it by p.
func ReadExposition(r io.Reader, p Policy) (Reading, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Reading{}, fmt.Errorf("parsing the DCGM exporter's metrics: %w", err)
	}
	xids, ok := fams[metricXidCount]
	if !ok {
		return Reading{}, ErrNoXidCount
	}
	var out Reading
	gpus := map[string]bool{}
	for _, m := range xids.GetMetric() {
		name := gpuName(m)
		gpus[name] = true
		x, has := label(m, "xid")
		if !has || value(m) <= 0 {
			continue
		}
		xid, err := strconv.ParseUint(x, 10, 32)
		if err != nil {
			return Reading{}, fmt.Errorf("%s{xid=%q}: not an Xid", metricXidCount, x)
		}
		if class := p.Classify(xid); class != Fatal {
			out.Seen = append(out.Seen, fmt.Sprintf("%s: Xid %d (%s)", name, xid, class))
			continue
		}
		out.Xids = appendFault(out.Xids, Fault{GPU: name, Reason: ReasonFatalXid, Xid: xid})
	}
	out.GPUs = len(gpus)
	for metric, watch := range map[string]string{
		metricECCDoubleBit:    WatchECCDoubleBit,
		metricRowRemapFailure: WatchRowRemapFailure,
		metricRowRemapPending: WatchRowRemapPending,
	} {
		if !p.Watching(watch) {
			continue
		}
		for _, m := range fams[metric].GetMetric() {
			if value(m) > 0 {
				out.State = appendFault(out.State, Fault{GPU: gpuName(m), Reason: watchReason[watch]})
			}
		}
	}
	// map order above: keep the message stable
	slices.SortFunc(out.State, func(a, b Fault) int { return strings.Compare(a.String(), b.String()) })
	slices.SortFunc(out.Xids, func(a, b Fault) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

var watchReason = map[string]string{
	WatchECCDoubleBit:    ReasonECCDoubleBit,
	WatchRowRemapFailure: ReasonRowRemapFailure,
	WatchRowRemapPending: ReasonRowRemapPending,
}

// gpuName names a GPU as the NVML source does: "GPU <index> (<UUID>)". The exporter labels UUID, or uuid with
// --use-old-namespace.
func gpuName(m *dto.Metric) string {
	idx, _ := label(m, "gpu")
	name := "GPU " + idx
	if uuid, ok := label(m, "UUID"); ok {
		return name + " (" + uuid + ")"
	}
	if uuid, ok := label(m, "uuid"); ok {
		return name + " (" + uuid + ")"
	}
	return name
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// appendFault adds f unless it is there (MIG instances repeat their GPU's series).
func appendFault(fs []Fault, f Fault) []Fault {
	if slices.Contains(fs, f) {
		return fs
	}
	return append(fs, f)
}

// The latch: a fatal Xid keeps the condition False after it leaves the exporter's window, until the node boots
// again. The condition itself is the record, so a restarted agent keeps it: its message ends with the boot ID the
// Xids were seen in, and the Node's status.nodeInfo.bootID tells whether that boot is still running.
const latchPrefix = " [fatal Xids latched until the node reboots; boot "

var latchedXid = regexp.MustCompile(`(?:^|; )([^;]+?): Xid (\d+) \(fatal`)

// latchMessage is v's message with the latch record.
func latchMessage(msg, boot string) string { return msg + latchPrefix + boot + "]" }

// readLatch returns the fatal Xids a condition recorded for boot, if it was False in that boot.
func readLatch(c *corev1.NodeCondition, boot string) []Fault {
	if c == nil || c.Status != corev1.ConditionFalse {
		return nil
	}
	i := strings.LastIndex(c.Message, latchPrefix)
	if i < 0 || strings.TrimSuffix(c.Message[i+len(latchPrefix):], "]") != boot {
		return nil
	}
	var out []Fault
	for _, m := range latchedXid.FindAllStringSubmatch(c.Message[:i], -1) {
		xid, err := strconv.ParseUint(m[2], 10, 32)
		if err != nil {
			continue
		}
		out = appendFault(out, Fault{GPU: m[1], Reason: ReasonFatalXid, Xid: xid})
	}
	return out
}

// exporterWatch is the agent over the DCGM exporter of its node.
type exporterWatch struct {
	o    *Options
	rep  reporter
	logf func(string, ...any)
	http *http.Client

	boot    string  // the node's boot ID
	latched []Fault // fatal Xids seen in this boot
	seen    []string
	gpus    int
	lastOK  time.Time
	last    *Verdict
	// now is the clock the outage bound is read on (nil: time.Now)
	now func() time.Time
}

func (w *exporterWatch) clock() time.Time {
	if w.now != nil {
		return w.now()
	}
	return time.Now()
}

// run scrapes every ScrapeInterval until ctx ends.
func (w *exporterWatch) run(ctx context.Context) error {
	w.lastOK = w.clock()
	if err := w.readNode(ctx); err != nil {
		return err
	}
	t := time.NewTicker(w.o.ScrapeInterval)
	defer t.Stop()
	for {
		if err := w.step(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// readNode reads the node's boot ID and, when the latch is not held yet or the boot changed, the latch its
// condition records for this boot.
func (w *exporterWatch) readNode(ctx context.Context) error {
	node, err := w.o.Client.CoreV1().Nodes().Get(ctx, w.o.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", w.o.NodeName, err)
	}
	boot := node.Status.NodeInfo.BootID
	if w.boot != "" && boot == w.boot {
		return nil
	}
	if len(w.latched) > 0 {
		w.logf("node %s booted again (boot ID %s, was %s): the latched Xids are cleared", w.o.NodeName, boot, w.boot)
	}
	w.boot, w.latched = boot, nil
	for i := range node.Status.Conditions {
		if c := &node.Status.Conditions[i]; c.Type == w.o.Policy.ConditionType {
			if w.latched = readLatch(c, boot); len(w.latched) > 0 {
				w.logf("node %s: %d fatal Xid(s) recorded in this boot stay latched", w.o.NodeName, len(w.latched))
			}
		}
	}
	return nil
}

// step scrapes once and reports the verdict when it changed.
func (w *exporterWatch) step(ctx context.Context) error {
	if len(w.latched) > 0 { // only a new boot lifts the latch; an API error keeps it until the next step
		if err := w.readNode(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.logf("reading the boot ID: %v", err)
		}
	}
	r, err := w.scrape(ctx)
	var v Verdict
	switch {
	case err == nil:
		w.lastOK, w.gpus = w.clock(), r.GPUs
		for _, s := range r.Seen { // once while it stays in the window
			if !slices.Contains(w.seen, s) {
				w.logf("%s", s)
			}
		}
		w.seen = r.Seen
		for _, f := range r.Xids {
			w.latched = appendFault(w.latched, f)
		}
		v = w.verdict(r.State)
	case len(w.latched) > 0: // the latched Xids are known without the exporter: stay False
		w.logf("scrape: %v", err)
		v = w.verdict(nil)
	case w.clock().Sub(w.lastOK) < w.o.StaleAfter: // a short outage (an exporter restart) keeps the last verdict
		w.logf("scrape: %v", err)
		return nil
	default: // never a guess of healthy
		reason := ReasonExporterUnreachable
		if errors.Is(err, ErrNoXidCount) {
			reason = ReasonExporterIncomplete
		}
		v = Unknown(reason, err)
	}
	if w.last != nil && *w.last == v {
		return nil
	}
	w.logf("node %s: %s", w.o.NodeName, v)
	if err := w.rep.Report(ctx, v); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	w.last = &v
	return nil
}

// verdict judges the latched Xids and the state faults; a False verdict with latched Xids records the boot.
func (w *exporterWatch) verdict(state []Fault) Verdict {
	v := Judge(w.gpus, append(slices.Clone(w.latched), state...))
	if len(w.latched) > 0 {
		v.Message = latchMessage(v.Message, w.boot)
	}
	return v
}

func (w *exporterWatch) scrape(ctx context.Context) (Reading, error) {
	ctx, cancel := context.WithTimeout(ctx, w.o.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.o.ExporterURL, nil)
	if err != nil {
		return Reading{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := w.http.Do(req)
	if err != nil {
		return Reading{}, fmt.Errorf("DCGM exporter %s: %w", w.o.ExporterURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Reading{}, fmt.Errorf("DCGM exporter %s: %s", w.o.ExporterURL, resp.Status)
	}
	r, err := ReadExposition(resp.Body, w.o.Policy)
	if err != nil {
		return Reading{}, fmt.Errorf("DCGM exporter %s: %w", w.o.ExporterURL, err)
	}
	return r, nil
}
