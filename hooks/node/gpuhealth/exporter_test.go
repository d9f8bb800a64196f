package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth/exportertest"
)

// chartPolicy is the chart's default global.health with the taint on.
var chartPolicy = Policy{
	Fatal:         []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120},
	Application:   []uint64{13, 31, 43, 45, 68},
	Watches:       KnownWatches,
	ConditionType: DefaultConditionType,
	Taint:         &corev1.Taint{Key: "nvidia.com/gpu-unhealthy", Effect: corev1.TaintEffectNoSchedule},
}

const (
	uuid0 = "GPU-6b5c1f0e-8a1d-4c5e-9f39-0d2b6a1c7e10"
	uuid1 = "GPU-1f4e2a9b-3c7d-4e8f-a0b1-c2d3e4f5a6b7"
)

func TestReadExposition(t *testing.T) {
	for name, tc := range map[string]struct {
		gpus        []exportertest.GPU
		xids, state []string
	}{
		"healthy":         {gpus: []exportertest.GPU{{UUID: uuid0}, {UUID: uuid1}}},
		"fatal Xid":       {gpus: []exportertest.GPU{{UUID: uuid0}, {UUID: uuid1, Xids: map[uint64]int{79: 1}}}, xids: []string{"GPU 1 (" + uuid1 + "): Xid 79"}},
		"application Xid": {gpus: []exportertest.GPU{{UUID: uuid0, Xids: map[uint64]int{13: 4, 31: 1}}}},
		"unlisted Xid":    {gpus: []exportertest.GPU{{UUID: uuid0, Xids: map[uint64]int{92: 1}}}},
		"both tiers on one GPU": {gpus: []exportertest.GPU{{UUID: uuid0, Xids: map[uint64]int{13: 2, 48: 1}}},
			xids: []string{"GPU 0 (" + uuid0 + "): Xid 48"}},
		"watches": {gpus: []exportertest.GPU{{UUID: uuid0, ECCDoubleBit: 2}, {UUID: uuid1, RowRemapFailure: true, RowRemapPending: true}},
			state: []string{"GPU 0 (" + uuid0 + "): uncorrectable (double-bit) ECC error", "GPU 1 (" + uuid1 + "): a row remap is pending", "GPU 1 (" + uuid1 + "): row remapping failed"}},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := ReadExposition(strings.NewReader(exportertest.Exposition(tc.gpus)), chartPolicy)
			if err != nil {
				t.Fatal(err)
			}
			if r.GPUs != len(tc.gpus) {
				t.Errorf("GPUs = %d, want %d", r.GPUs, len(tc.gpus))
			}
			assertFaults(t, "Xids", r.Xids, tc.xids)
			assertFaults(t, "State", r.State, tc.state)
		})
	}
	// the watches follow the policy: off, ECC and row remapping are not faults
	r, err := ReadExposition(strings.NewReader(exportertest.Exposition([]exportertest.GPU{{UUID: uuid0, ECCDoubleBit: 1, RowRemapPending: true}})),
		Policy{Fatal: chartPolicy.Fatal, ConditionType: DefaultConditionType})
	if err != nil || len(r.State) != 0 {
		t.Errorf("no watches: %+v, %v", r.State, err)
	}
	// the image's default collectors have no Xid count: the exporterAgent cannot read Xids, and says so
	if _, err := ReadExposition(strings.NewReader("# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 40\n"), chartPolicy); !errors.Is(err, ErrNoXidCount) {
		t.Errorf("default collectors: %v", err)
	}
}

func assertFaults(t *testing.T, what string, got []Fault, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s = %v, want %d faults like %q", what, got, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i].String(), want[i]) {
			t.Errorf("%s[%d] = %q, want prefix %q", what, i, got[i], want[i])
		}
	}
}

// exporterAgent is the exporter source's loop, stepped by the test.
type exporterAgent struct {
	t      *testing.T
	client kubernetes.Interface
	w      *exporterWatch
	log    strings.Builder
	// clock is the watch's: a test moves it past the outage bound instead of sleeping, so a slow machine's pauses
	// between steps never count as an outage
	clock time.Time
}

func newExporterAgent(t *testing.T, client kubernetes.Interface, url string, staleAfter time.Duration) *exporterAgent {
	t.Helper()
	a := &exporterAgent{t: t, client: client, clock: time.Now()}
	o := &Options{NodeName: "gpu-node", Client: client, Policy: chartPolicy, Source: SourceDCGMExporter, ExporterURL: url, StaleAfter: staleAfter}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	a.w = &exporterWatch{o: o, rep: Reporter{Client: client, NodeName: o.NodeName, Policy: o.Policy}, http: &http.Client{},
		logf: func(f string, args ...any) {
			fmt.Fprintf(&a.log, f+"\n", args...)
		},
		now: func() time.Time { return a.clock }}
	a.w.lastOK = a.clock
	if err := a.w.readNode(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

// step scrapes once and returns the node's condition and whether the taint is on.
func (a *exporterAgent) step() (corev1.NodeCondition, bool) {
	a.t.Helper()
	if err := a.w.step(context.Background()); err != nil {
		a.t.Fatal(err)
	}
	n, err := a.client.CoreV1().Nodes().Get(context.Background(), "gpu-node", metav1.GetOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	var c corev1.NodeCondition
	for _, cur := range n.Status.Conditions {
		if cur.Type == DefaultConditionType {
			c = cur
		}
	}
	tainted := false
	for _, tn := range n.Spec.Taints {
		tainted = tainted || tn.Key == chartPolicy.Taint.Key
	}
	return c, tainted
}

func bootedNode(boot string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: boot}}}
}

func rebootNode(t *testing.T, client kubernetes.Interface, boot string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), "gpu-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.NodeInfo.BootID = boot
	if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func wantNode(t *testing.T, c corev1.NodeCondition, tainted bool, status corev1.ConditionStatus, reason string, taint bool) {
	t.Helper()
	if c.Status != status || c.Reason != reason || tainted != taint {
		t.Fatalf("condition %s %s (%s), tainted %v; want %s %s, tainted %v", c.Status, c.Reason, c.Message, tainted, status, reason, taint)
	}
}

// A fatal Xid sets the condition False and the taint; it stays False after it leaves the exporter's window, in a
// restarted exporterAgent too, until the node boots again.
func TestExporterFatalXidLatchesUntilReboot(t *testing.T) {
	client := fake.NewClientset(bootedNode("boot-1"))
	exp := exportertest.Start(exportertest.GPU{UUID: uuid0}, exportertest.GPU{UUID: uuid1})
	defer exp.Close()
	a := newExporterAgent(t, client, exp.URL(), time.Minute)

	c, tainted := a.step()
	wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)

	exp.Set(exportertest.GPU{UUID: uuid0}, exportertest.GPU{UUID: uuid1, Xids: map[uint64]int{79: 1}})
	c, tainted = a.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
	if !strings.Contains(c.Message, "GPU 1 ("+uuid1+"): Xid 79") || !strings.Contains(c.Message, "boot boot-1") {
		t.Fatalf("message %q", c.Message)
	}

	// the window passed: the exporter counts nothing any more
	exp.Set(exportertest.GPU{UUID: uuid0}, exportertest.GPU{UUID: uuid1})
	c, tainted = a.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)

	// a restarted exporterAgent reads the latch back from the condition
	b := newExporterAgent(t, client, exp.URL(), time.Minute)
	c, tainted = b.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
	if !strings.Contains(c.Message, "Xid 79") {
		t.Fatalf("message after restart %q", c.Message)
	}

	// the node rebooted: healthy again
	rebootNode(t, client, "boot-2")
	c, tainted = b.step()
	wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)
	if c.Message != "all 2 GPUs healthy" {
		t.Fatalf("message %q", c.Message)
	}
}

// An application Xid is the workload's fault: the GPU stays healthy.
func TestExporterApplicationXidStaysHealthy(t *testing.T) {
	client := fake.NewClientset(bootedNode("boot-1"))
	exp := exportertest.Start(exportertest.GPU{UUID: uuid0, Xids: map[uint64]int{13: 3, 43: 1}})
	defer exp.Close()
	a := newExporterAgent(t, client, exp.URL(), time.Minute)
	c, tainted := a.step()
	wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)
	if !strings.Contains(a.log.String(), "Xid 13 (application)") {
		t.Fatalf("log:\n%s", a.log.String())
	}
}

// Row remapping is read afresh: pending is False until the GPU reset applied it, then True again.
func TestExporterRowRemapPendingFollowsTheGPU(t *testing.T) {
	client := fake.NewClientset(bootedNode("boot-1"))
	exp := exportertest.Start(exportertest.GPU{UUID: uuid0, RowRemapPending: true})
	defer exp.Close()
	a := newExporterAgent(t, client, exp.URL(), time.Minute)
	c, tainted := a.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonRowRemapPending, true)
	exp.Set(exportertest.GPU{UUID: uuid0})
	c, tainted = a.step()
	wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)
}

// An exporter that does not answer never makes the GPUs healthy: the last verdict holds for StaleAfter, then the
// condition turns Unknown (the taint is left as it was); a latched Xid keeps it False.
func TestExporterUnreachable(t *testing.T) {
	const stale = 100 * time.Millisecond
	t.Run("from True", func(t *testing.T) {
		client := fake.NewClientset(bootedNode("boot-1"))
		exp := exportertest.Start(exportertest.GPU{UUID: uuid0})
		defer exp.Close()
		a := newExporterAgent(t, client, exp.URL(), stale)
		c, tainted := a.step()
		wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)
		exp.Down(true)
		c, tainted = a.step()
		wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false) // within the bound
		a.clock = a.clock.Add(stale + 20*time.Millisecond)                  // past the bound, on the watch's clock
		c, tainted = a.step()
		wantNode(t, c, tainted, corev1.ConditionUnknown, ReasonExporterUnreachable, false)
		if !strings.Contains(c.Message, "503") {
			t.Fatalf("message %q", c.Message)
		}
		exp.Down(false)
		c, tainted = a.step()
		wantNode(t, c, tainted, corev1.ConditionTrue, ReasonHealthy, false)
	})
	t.Run("from False", func(t *testing.T) {
		client := fake.NewClientset(bootedNode("boot-1"))
		exp := exportertest.Start(exportertest.GPU{UUID: uuid0, Xids: map[uint64]int{48: 1}})
		defer exp.Close()
		a := newExporterAgent(t, client, exp.URL(), stale)
		c, tainted := a.step()
		wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
		exp.Close()
		a.clock = a.clock.Add(stale + 20*time.Millisecond) // past the bound, on the watch's clock
		for range 2 {
			c, tainted = a.step()
			wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
		}
	})
	t.Run("never reached", func(t *testing.T) {
		client := fake.NewClientset(bootedNode("boot-1"))
		a := newExporterAgent(t, client, "http://127.0.0.1:1/metrics", stale)
		a.clock = a.clock.Add(stale + 20*time.Millisecond) // past the bound, on the watch's clock
		c, tainted := a.step()
		wantNode(t, c, tainted, corev1.ConditionUnknown, ReasonExporterUnreachable, false)
	})
	t.Run("without the Xid count", func(t *testing.T) {
		// the image's default collectors (dcp-metrics-included.csv) have no DCGM_EXP_XID_ERRORS_COUNT
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\""+uuid0+"\"} 40\n")
		}))
		defer srv.Close()
		client := fake.NewClientset(bootedNode("boot-1"))
		a := newExporterAgent(t, client, srv.URL+"/metrics", stale)
		a.clock = a.clock.Add(stale + 20*time.Millisecond) // past the bound, on the watch's clock
		c, tainted := a.step()
		wantNode(t, c, tainted, corev1.ConditionUnknown, ReasonExporterIncomplete, false)
		if !strings.Contains(c.Message, "dcgmExporter.config.profile=health") {
			t.Fatalf("message %q", c.Message)
		}
	})
}

// auto reads NVML in a cgo build and the exporter in a static one, where the chart gave its URL.
func TestSourceSelection(t *testing.T) {
	client := fake.NewClientset(bootedNode("boot-1"))
	for _, tc := range []struct {
		source, url string
		monitor     Monitor
		want        string
	}{
		{source: "", url: "http://x/metrics", want: map[bool]string{true: SourceDCGMExporter, false: SourceAuto}[staticBuild]},
		{source: SourceAuto, url: "", want: SourceAuto},
		{source: SourceNVML, url: "http://x/metrics", want: SourceNVML},
		{source: SourceDCGMExporter, url: "http://x/metrics", want: SourceDCGMExporter},
	} {
		o := Options{NodeName: "gpu-node", Client: client, Source: tc.source, ExporterURL: tc.url}
		o.Complete()
		if o.Source != tc.want {
			t.Errorf("source %q url %q: %q, want %q", tc.source, tc.url, o.Source, tc.want)
		}
	}
	o := Options{NodeName: "gpu-node", Client: client, Source: SourceDCGMExporter}
	o.Complete()
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "HEALTH_DCGM_EXPORTER_URL") {
		t.Errorf("dcgm-exporter without a URL: %v", err)
	}
	o = Options{NodeName: "gpu-node", Client: client, Source: "smi"}
	o.Complete()
	if err := o.Validate(); err == nil {
		t.Error("unknown source accepted")
	}
}

// An API error while reading the boot ID keeps the latch: the agent goes on, and the condition stays False.
func TestExporterLatchSurvivesAnAPIError(t *testing.T) {
	client := fake.NewClientset(bootedNode("boot-1"))
	exp := exportertest.Start(exportertest.GPU{UUID: uuid0, Xids: map[uint64]int{94: 1}})
	defer exp.Close()
	a := newExporterAgent(t, client, exp.URL(), time.Minute)
	c, tainted := a.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
	exp.Set(exportertest.GPU{UUID: uuid0})
	failing := true
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing {
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	if err := a.w.step(context.Background()); err != nil {
		t.Fatalf("step: %v", err)
	}
	failing = false
	c, tainted = a.step()
	wantNode(t, c, tainted, corev1.ConditionFalse, ReasonFatalXid, true)
	if !strings.Contains(a.log.String(), "reading the boot ID") {
		t.Fatalf("log:\n%s", a.log.String())
	}
}
