package releasecheck

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestProgressIsPaced: a change of the counts within the interval is held back and due when the interval ends; a
// change of the failed count is written at once; unchanged counts are never written again.
func TestProgressIsPaced(t *testing.T) {
	var out strings.Builder
	p := progress{out: &out, every: 10 * time.Second}
	t0 := time.Now()
	report := func(elapsed string, ready, waiting, failed int) *Report {
		return &Report{Elapsed: elapsed, Summary: map[State]int{Ready: ready, Waiting: waiting, Failed: failed}}
	}
	steps := []struct {
		at      time.Duration
		r       *Report
		wantDue time.Duration
	}{
		{0, report("0s", 1, 9, 0), 0},                             // the first line
		{time.Second, report("1s", 1, 9, 0), 0},                   // nothing changed
		{2 * time.Second, report("2s", 2, 8, 0), 8 * time.Second}, // held back until 10 s
		{3 * time.Second, report("3s", 3, 7, 0), 7 * time.Second}, // still held back
		{4 * time.Second, report("4s", 3, 6, 1), 0},               // a failure: at once
		{5 * time.Second, report("5s", 4, 5, 1), 9 * time.Second}, // held back again, from the last line
		{14 * time.Second, report("14s", 4, 5, 1), 0},             // the held-back counts, once the interval is over
		{15 * time.Second, report("15s", 4, 5, 1), 0},             // and not again
		{16 * time.Second, report("16s", 10, 0, 0), 0},            // the failure cleared: at once
	}
	for _, s := range steps {
		if due := p.see(s.r, t0.Add(s.at)); due != s.wantDue {
			t.Errorf("at %s: due in %s, want %s", s.at, due, s.wantDue)
		}
	}
	want := "0s: 1 ready, 9 waiting, 0 failed\n" +
		"4s: 3 ready, 6 waiting, 1 failed\n" +
		"14s: 4 ready, 5 waiting, 1 failed\n" +
		"16s: 10 ready, 0 waiting, 0 failed\n"
	if out.String() != want {
		t.Errorf("progress lines:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestRunWritesHeldBackProgress: Run writes a change held back by the interval when the interval ends, though
// nothing changes after it (two DRA nodes wait for their ResourceSlices; one arrives at once, the other late).
func TestRunWritesHeldBackProgress(t *testing.T) {
	const every, late = 300 * time.Millisecond, 3 * time.Second
	s := newAllocationSet(false)
	snap := s.snapshot()
	client := seededClient(t, snap)
	ctx := context.Background()
	go func() {
		time.Sleep(every / 3)
		_, _ = client.ResourceV1().ResourceSlices().Create(ctx, slice("dra-gpu", "gpu.nvidia.com", "dra", 4), metav1.CreateOptions{})
		time.Sleep(late)
		_, _ = client.ResourceV1().ResourceSlices().Create(ctx, slice("bare-gpu", "gpu.nvidia.com", "bare", 4), metav1.CreateOptions{})
	}()
	var out strings.Builder
	r, err := Run(ctx, Options{Client: client, Namespace: "ns", Release: "gpu", Timeout: 20 * time.Second, ResourceSlices: true, ProgressEvery: every}, &out)
	if err != nil || !r.Passed() {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasSuffix(l, " failed") && !strings.HasPrefix(l, "kube-gpu-stack release") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "2 waiting") || !strings.Contains(lines[1], "1 waiting") {
		t.Fatalf("want two progress lines, 2 then 1 waiting; got %q in:\n%s", lines, out.String())
	}
	at, err := time.ParseDuration(strings.SplitN(lines[1], ":", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	if at < every || at >= late {
		t.Errorf("the held-back line was written at %s, want after the interval (%s) and before the last change (%s)", at, every, late)
	}
}
