package apiload

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestArgsWritesPolicyAndFlags(t *testing.T) {
	dir := t.TempDir()
	args, err := Args(dir)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := os.ReadFile(args["audit-policy-file"][0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: Policy", "- RequestReceived", "level: Metadata"} {
		if !strings.Contains(string(pol), want) {
			t.Errorf("policy lacks %q:\n%s", want, pol)
		}
	}
	want := map[string]string{
		"audit-log-path": filepath.Join(dir, "audit.log"), "audit-log-format": "json", "audit-log-mode": "blocking",
		"audit-log-maxsize": "0", "audit-log-truncate-enabled": "false",
	}
	for k, v := range want {
		if got := args[k]; len(got) != 1 || got[0] != v {
			t.Errorf("--%s = %v, want %s", k, got, v)
		}
	}
}

func TestReadCannedLog(t *testing.T) {
	reqs, err := Read("testdata/audit.log")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 7 {
		t.Fatalf("read %d events, want 7 (blank line skipped)", len(reqs))
	}
	want := Request{AuditID: "a4", User: "kube-gpu-stack-admin", UserAgent: "e2e.test/v0.0.0", Verb: "patch",
		Resource: "pods", Subresource: "status", Namespace: "gpu", Name: "v-1", Stage: "ResponseComplete",
		At: time.Date(2026, 12, 2, 3, 0, 1, 500000000, time.UTC), Code: 200}
	if !reqs[3].At.Equal(want.At) {
		t.Errorf("At = %v, want %v", reqs[3].At, want.At)
	}
	reqs[3].At = want.At
	if !reflect.DeepEqual(reqs[3], want) {
		t.Errorf("event 4 = %+v\nwant %+v", reqs[3], want)
	}
	if !reqs[1].Watch || reqs[1].Stage != "ResponseStarted" || reqs[0].Watch {
		t.Errorf("watch flags: %+v, %+v", reqs[0], reqs[1])
	}
	if reqs[6].Resource != "" || reqs[6].User != "system:anonymous" {
		t.Errorf("non-resource request: %+v", reqs[6])
	}
}

func TestSummarizeCountsEachRequestOnceInWindow(t *testing.T) {
	reqs, err := Read("testdata/audit.log")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	// [from, from+4s): the anonymous /healthz at +5 s is outside; the watch's two stages count once.
	s := Summarize(reqs, from, from.Add(4*time.Second))
	want := []Row{
		{User: "kube-gpu-stack-admin", Agent: "e2e.test", Verb: "get", Count: 2, PerSecond: 0.5},
		{User: "kube-gpu-stack-admin", Agent: "e2e.test", Verb: "patch", Count: 1, PerSecond: 0.25},
		{User: "system:serviceaccount:gpu:gate", Agent: "in-cluster", Verb: "list", Count: 1, PerSecond: 0.25},
		{User: "system:serviceaccount:gpu:gate", Agent: "in-cluster", Verb: "watch", Count: 1, PerSecond: 0.25},
	}
	if !reflect.DeepEqual(s.Rows, want) {
		t.Errorf("rows:\n%v\nwant\n%v", s.Rows, want)
	}
	if n := s.Total("system:serviceaccount:"); n != 2 {
		t.Errorf("service accounts' total = %d, want 2", n)
	}
	if v := s.Verbs("system:serviceaccount:gpu:gate"); !reflect.DeepEqual(v, map[string]int{"list": 1, "watch": 1}) {
		t.Errorf("gate's verbs = %v", v)
	}
	if n := s.Agent("in-cluster").Total(); n != 2 {
		t.Errorf("in-cluster agent's total = %d, want 2", n)
	}
	if s.Total() != 5 {
		t.Errorf("total = %d, want 5", s.Total())
	}
	// The end is exclusive: a request received at `to` belongs to the next window.
	if n := Summarize(reqs, from, from.Add(time.Second)).Total(); n != 2 {
		t.Errorf("[0s, 1s) total = %d, want 2", n)
	}
	if !strings.Contains(s.String(), "system:serviceaccount:gpu:gate") {
		t.Errorf("table lacks the gate:\n%s", s)
	}
}

func TestRefusedCountsOneCodeInWindowByAgentVerbAndResource(t *testing.T) {
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	reqs := []Request{
		{UserAgent: "driver-upgrade-gate/v0", Verb: "update", Resource: "leases", At: at, Code: 409},
		{UserAgent: "driver-upgrade-gate/v0", Verb: "update", Resource: "leases", At: at.Add(time.Second), Code: 409},
		{UserAgent: "driver-upgrade-gate/v0", Verb: "update", Resource: "leases", At: at, Code: 200},
		{UserAgent: "driver-manager/v0", Verb: "update", Resource: "nodes", At: at, Code: 409},
		{UserAgent: "driver-manager/v0", Verb: "update", Resource: "nodes", At: at.Add(time.Hour), Code: 409},
	}
	got := Refused(reqs, at, at.Add(time.Minute), 409)
	want := map[string]int{"driver-upgrade-gate update leases": 2, "driver-manager update nodes": 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Refused = %v, want %v", got, want)
	}
}
