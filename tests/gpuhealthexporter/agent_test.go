package gpuhealthexporter

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth/exportertest"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/agenttest"
)

const (
	uuid0 = "GPU-6b5c1f0e-8a1d-4c5e-9f39-0d2b6a1c7e10"
	uuid1 = "GPU-1f4e2a9b-3c7d-4e8f-a0b1-c2d3e4f5a6b7"
	// staleAfter is the agent's bound on a silent exporter, short for the test.
	staleAfter = 2 * time.Second
)

// startAgent runs the agent with source (dcgm-exporter, or auto in a static build) on url, as the chart's env sets it.
func startAgent(t *testing.T, node, source, url string) *agenttest.Agent {
	t.Helper()
	return agenttest.Start(t, gpuhealth.Options{NodeName: node, Client: kube.Client, Policy: agenttest.Policy, Source: source,
		ExporterURL: url, ScrapeInterval: 100 * time.Millisecond, StaleAfter: staleAfter})
}

// addNode registers a plain Node booted as boot: the node lifecycle controller writes it too (Ready Unknown, its
// not-ready taints), so the agent's patches and updates meet a real concurrent writer.
func addNode(t *testing.T, name, boot string) {
	t.Helper()
	if _, err := kube.Client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setBoot(t, name, boot)
}

// setBoot writes the boot ID as the kubelet does after a reboot.
func setBoot(t *testing.T, name, boot string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := kube.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n.Status.NodeInfo.BootID = boot
		_, err = kube.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("node %s: boot ID %s: %v", name, boot, err)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := kube.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// holds checks that ok keeps holding for d (several scrapes and, past staleAfter, the agent's bound).
func holds(t *testing.T, node, what string, d time.Duration, ok func(*corev1.Node) bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n := getNode(t, node); !ok(n) {
			t.Fatalf("node %s: no longer %s: conditions %+v, taints %+v", node, what, n.Status.Conditions, n.Spec.Taints)
		}
	}
}

func tainted(n *corev1.Node) bool { return agenttest.Tainted(n, *agenttest.Policy.Taint) }

func is(s corev1.ConditionStatus, reason string, taint bool) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c := agenttest.Condition(n)
		return c != nil && c.Status == s && c.Reason == reason && tainted(n) == taint
	}
}

// exercise is the agent's life on one node through the exporter: healthy, then a fatal Xid (False, tainted) that
// stays latched after the exporter's window has forgotten it, through an exporter outage and an agent restart,
// until the node reboots (its boot ID changes); then an exporter that stays silent turns the condition Unknown,
// never True, leaving the taint alone.
func exercise(t *testing.T, node, source string) {
	addNode(t, node, "boot-1")
	exp := exportertest.Start(exportertest.GPU{UUID: uuid0}, exportertest.GPU{UUID: uuid1})
	defer exp.Close()

	a := startAgent(t, node, source, exp.URL())
	agenttest.WaitNode(t, kube.Client, node, "healthy", is(corev1.ConditionTrue, gpuhealth.ReasonHealthy, false))

	exp.Set(exportertest.GPU{UUID: uuid0, Xids: map[uint64]int{13: 2}}, exportertest.GPU{UUID: uuid1, Xids: map[uint64]int{79: 1}})
	n := agenttest.WaitNode(t, kube.Client, node, "unhealthy and tainted", is(corev1.ConditionFalse, gpuhealth.ReasonFatalXid, true))
	if msg := agenttest.Condition(n).Message; !strings.Contains(msg, "GPU 1 ("+uuid1+"): Xid 79") || strings.Contains(msg, "Xid 13") ||
		!strings.Contains(msg, "boot-1") {
		t.Fatalf("message %q", msg)
	}

	// the exporter's window passed; then it goes silent for longer than the agent's bound
	exp.Set(exportertest.GPU{UUID: uuid0}, exportertest.GPU{UUID: uuid1})
	holds(t, node, "latched", time.Second, is(corev1.ConditionFalse, gpuhealth.ReasonFatalXid, true))
	exp.Down(true)
	holds(t, node, "latched while the exporter is down", staleAfter+time.Second, is(corev1.ConditionFalse, gpuhealth.ReasonFatalXid, true))
	exp.Down(false)

	// a restarted agent (its pod rescheduled, the same boot) reads the latch back from the condition
	a.Stop(t)
	if strings.Count(a.String(), "Xid 13 (application)") != 1 {
		t.Fatalf("the application Xid is not logged once:\n%s", a)
	}
	a = startAgent(t, node, source, exp.URL())
	holds(t, node, "latched after a restart", time.Second, is(corev1.ConditionFalse, gpuhealth.ReasonFatalXid, true))

	setBoot(t, node, "boot-2")
	agenttest.WaitNode(t, kube.Client, node, "healthy after the reboot", is(corev1.ConditionTrue, gpuhealth.ReasonHealthy, false))
	if !strings.Contains(a.String(), "booted again") {
		t.Fatalf("log:\n%s", a)
	}

	exp.Down(true)
	holds(t, node, "healthy within the bound", staleAfter/2, is(corev1.ConditionTrue, gpuhealth.ReasonHealthy, false))
	n = agenttest.WaitNode(t, kube.Client, node, "Unknown", is(corev1.ConditionUnknown, gpuhealth.ReasonExporterUnreachable, false))
	if msg := agenttest.Condition(n).Message; !strings.Contains(msg, exp.URL()) {
		t.Fatalf("message %q", msg)
	}
	a.Stop(t)
}

func TestExporterSourceOnTheAPIServer(t *testing.T) {
	exercise(t, "gpu-health-exporter", gpuhealth.SourceDCGMExporter)
}
