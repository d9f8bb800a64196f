package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/kubelet"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/apiload"
)

const (
	release   = "gpu"
	namespace = "gpu-operator"
	// held is the node whose driver check waits until everything else has settled, so that its validator
	// is the last one Ready and the gate's last wait is on it alone (as BenchmarkGateLastReadyToExit in tests/e2e).
	held = "scale-0001"
)

// steady is how long the API load is watched once the stack has settled (SCALE_STEADY, a Go duration).
func steady() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SCALE_STEADY")); err == nil {
		return d
	}
	return time.Minute
}

// BenchmarkScale1000 installs the chart (values/mixed.yaml, values/driver-pools.yaml and the trim in
// testdata/scale.yaml) on Nodes simulated GPU nodes without Helm's --wait, so its post-install gate is the only
// wait, and measures:
//
//   - the gate (run in-process by the stand-in, as in tests/e2e): from the last validator Ready to its exit;
//   - the gate's binary (hooks/cmd/in-cluster, the command and env of the chart's gate Job, the Job's own service
//     account and RBAC) on the settled cluster: wall time, peak RSS, and its API requests from the audit log;
//   - `kube-gpu-stack upgrade status` and `kube-gpu-stack plan` (the admin's binary): wall time and peak RSS;
//   - the API requests of everything in steady state, by client, over steady().
//
// Run once (-benchtime 1x): a second iteration would install onto the first.
func BenchmarkScale1000(b *testing.B) {
	e := cluster1000(b)
	ctx := b.Context()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i > 0 {
			b.Log("one install per run: iterations after the first do nothing")
			continue
		}
		e.measure(ctx, b)
	}
}

func (e *env) measure(ctx context.Context, b *testing.B) {
	// 1. install with the gate; one node's plugin check waits until everything else settled
	e.stand.SetOutcome(held, "driver", nodestate.Validation{State: nodestate.CheckWaiting, Reason: "driver not loaded yet"})
	target := install.Target{Kubeconfig: e.c.Kubeconfig, Release: release, Namespace: namespace, Timeout: 40 * time.Minute, NoWait: true}
	start := time.Now()
	done := make(chan error, 1)
	go func() { _, err := target.Install(ctx, profileFiles()); done <- err }()
	for e.stand.InFlight("validation-gate") == 0 {
		select {
		case err := <-done:
			b.Fatalf("install ended before its gate ran: %v", err)
		case <-time.After(200 * time.Millisecond): // test-side wait for the hook to start
		}
	}
	gateStarted := time.Now()
	b.Logf("gate started %s after install began", gateStarted.Sub(start).Round(time.Second))
	pods, err := e.waitAllButHeld(ctx, b)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d pods ready but %s's validator, %s after install began", pods, held, time.Since(start).Round(time.Second))
	time.Sleep(time.Second) // let the gate see the held node waiting
	e.stand.SetOutcome(held, "driver", nodestate.Validation{State: nodestate.CheckReady})
	if err := <-done; err != nil {
		for _, r := range e.stand.Runs() {
			b.Logf("%s hook %s (exit %d):\n%s", r.Component, r.Pod, r.ExitCode, tail(r.Output, 3000))
		}
		b.Fatal(err)
	}
	installed := time.Now()
	gate, ok := e.stand.LastRun("validation-gate", start)
	if !ok {
		b.Fatal("no gate run recorded")
	}
	var last time.Time
	lastNode := ""
	for _, n := range e.nodes {
		if t := e.stand.ReadyAt(n); t.After(last) {
			last, lastNode = t, n
		}
	}
	latency := gate.Ended.Sub(last)
	b.Logf("install with the gate: %s; gate ran %s; last validator Ready (%s) to gate exit: %s",
		installed.Sub(start).Round(time.Second), gate.Ended.Sub(gate.Started).Round(time.Second), lastNode, latency.Round(time.Millisecond))
	b.ReportMetric(float64(pods+1), "pods")
	b.ReportMetric(installed.Sub(start).Seconds(), "s-install")
	b.ReportMetric(float64(latency.Milliseconds()), "ms-last-ready-to-exit")

	// 2. the gate's binary, as the chart's Job runs it, on the settled cluster
	g := e.gateBinary(ctx, b)
	b.ReportMetric(float64(g.Wall().Milliseconds()), "ms-gate-binary")
	b.ReportMetric(g.MiB(), "MiB-gate-peak")

	// 3. the admin's views
	admin := filepath.Join(e.dir, "admin", "kube-gpu-stack")
	flags := []string{"--kubeconfig", e.c.Kubeconfig, "--namespace", namespace, "--release", release}
	st := run(ctx, nil, admin, append([]string{"upgrade", "status"}, flags...)...)
	if st.Err != nil {
		b.Fatalf("upgrade status: %v\n%s", st.Err, tail(st.Output, 3000))
	}
	b.Logf("upgrade status: %s, %.0f MiB, %d lines", st.Wall().Round(time.Millisecond), st.MiB(), strings.Count(st.Output, "\n"))
	b.ReportMetric(float64(st.Wall().Milliseconds()), "ms-upgrade-status")
	b.ReportMetric(st.MiB(), "MiB-upgrade-status")
	// the fleet view of this one cluster (its kubeconfig's one context): what each cluster of a view of several costs
	fv := run(ctx, nil, admin, append([]string{"status", "-o", "json"}, flags...)...)
	if fv.Err != nil {
		b.Fatalf("status -o json (the fleet view): %v\n%s", fv.Err, tail(fv.Output, 3000))
	}
	b.Logf("fleet view of one cluster: %s, %.0f MiB", fv.Wall().Round(time.Millisecond), fv.MiB())
	b.ReportMetric(float64(fv.Wall().Milliseconds()), "ms-fleet-view")
	b.ReportMetric(fv.MiB(), "MiB-fleet-view")
	planArgs := append([]string{"plan", "--chart", chartrender.ChartDir()}, flags...)
	for _, f := range profileFiles() {
		planArgs = append(planArgs, "-f", f)
	}
	pl := run(ctx, nil, admin, planArgs...)
	if pl.Err != nil {
		b.Fatalf("plan: %v\n%s", pl.Err, tail(pl.Output, 3000))
	}
	b.Logf("plan: %s, %.0f MiB, %d lines", pl.Wall().Round(time.Millisecond), pl.MiB(), strings.Count(pl.Output, "\n"))
	b.ReportMetric(float64(pl.Wall().Milliseconds()), "ms-plan")
	b.ReportMetric(pl.MiB(), "MiB-plan")

	// 4. steady state: nothing changes; who still asks the API server for what
	from := time.Now()
	time.Sleep(steady())
	to := time.Now()
	reqs, err := apiload.Read(e.audit)
	if err != nil {
		b.Fatal(err)
	}
	all := apiload.Summarize(reqs, from, to)
	b.Logf("steady state, every client:\n%s", all)
	secs := to.Sub(from).Seconds()
	stack := all.Total("system:serviceaccount:"+namespace+":") + all.Total("system:serviceaccount:default:"+inProcessUser)
	b.ReportMetric(float64(stack)/secs, "stack-req/s-steady")
	b.ReportMetric(float64(all.Agent("scale.test").Total())/secs, "standin-req/s-steady")
	b.ReportMetric(float64(all.Total())/secs, "all-req/s-steady")

	// the whole install, by client, for the record
	b.Logf("install to gate exit, every client:\n%s", apiload.Summarize(reqs, start, installed))
}

// waitAllButHeld waits until every DaemonSet pod of the release is ready except held's operator validator, and
// returns how many are ready.
func (e *env) waitAllButHeld(ctx context.Context, b *testing.B) (int, error) {
	deadline := time.Now().Add(40 * time.Minute)
	lastLog := time.Now()
	for time.Now().Before(deadline) {
		dss, err := e.c.Client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
		if err == nil && len(dss.Items) > 0 {
			want, ready := 0, 0
			for _, ds := range dss.Items {
				want += int(ds.Status.DesiredNumberScheduled)
				ready += int(ds.Status.NumberReady)
			}
			if want > 0 && ready == want-1 {
				return ready, nil
			}
			if time.Since(lastLog) > time.Minute {
				b.Logf("%d of %d DaemonSet pods ready", ready, want)
				lastLog = time.Now()
			}
		}
		time.Sleep(2 * time.Second)
	}
	return 0, fmt.Errorf("the release's pods did not all turn ready but %s's validator", held)
}

// gateBinary runs the gate Job's command with its env through the image's binary, as the Job's service account,
// and reports what it cost; its API requests come from the audit log.
func (e *env) gateBinary(ctx context.Context, b *testing.B) proc {
	jobs, err := e.c.Client.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{LabelSelector: kubelet.ComponentLabel + "=validation-gate"})
	if err != nil || len(jobs.Items) != 1 {
		b.Fatalf("the gate Job: %v (%d found)", err, len(jobs.Items))
	}
	job := jobs.Items[0]
	spec := job.Spec.Template.Spec
	sa := spec.ServiceAccountName
	tok, err := token(ctx, e.c, namespace, sa)
	if err != nil {
		b.Fatal(err)
	}
	kc, err := kubeconfigFor(e.c, e.dir, sa, tok)
	if err != nil {
		b.Fatal(err)
	}
	c := spec.Containers[0]
	args := append(append([]string{}, c.Command...), c.Args...)
	if len(args) > 0 && strings.HasSuffix(args[0], "kube-gpu-stack") {
		args = args[1:]
	}
	args = append(args, "--kubeconfig", kc)
	env := envOf(job)
	p := run(ctx, env, filepath.Join(e.dir, "gate", "kube-gpu-stack"), args...)
	if p.Err != nil {
		b.Fatalf("gate binary: %v\n%s", p.Err, tail(p.Output, 3000))
	}
	time.Sleep(time.Second) // the log backend writes as requests complete; a watch's end comes with the exit
	reqs, err := apiload.Read(e.audit)
	if err != nil {
		b.Fatal(err)
	}
	user := "system:serviceaccount:" + namespace + ":" + sa
	s := apiload.Summarize(reqs, p.Start, p.End.Add(time.Second))
	var mine apiload.Summary
	for _, r := range s.Rows {
		if r.User == user {
			mine.Rows = append(mine.Rows, r)
		}
	}
	verbs := mine.Verbs()
	b.Logf("gate binary: %s, peak RSS %.0f MiB, requests %v (a watch counts once, when it opened):\n%s",
		p.Wall().Round(time.Millisecond), p.MiB(), verbs, byResource(reqs, user, p.Start, p.End.Add(time.Second)))
	b.ReportMetric(float64(verbs["list"]), "gate-lists")
	b.ReportMetric(float64(verbs["watch"]), "gate-watches")
	b.ReportMetric(float64(mine.Total()-verbs["list"]-verbs["watch"]), "gate-other-requests")
	return p
}

// byResource lists a user's requests in [from, to) as verb resource counts, one a line.
func byResource(reqs []apiload.Request, user string, from, to time.Time) string {
	count := map[string]int{}
	seen := map[string]bool{}
	var keys []string
	for _, r := range reqs {
		if r.User != user || r.At.Before(from) || !r.At.Before(to) || seen[r.AuditID] {
			continue
		}
		seen[r.AuditID] = true
		k := r.Verb + " " + r.Resource
		if r.Subresource != "" {
			k += "/" + r.Subresource
		}
		if count[k] == 0 {
			keys = append(keys, k)
		}
		count[k]++
	}
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %-40s %d\n", k, count[k])
	}
	return sb.String()
}

// envOf is the gate container's literal env (DRIVER_POOLS), as KEY=VALUE.
func envOf(job batchv1.Job) []string {
	var out []string
	for _, e := range job.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			out = append(out, e.Name+"="+e.Value)
		}
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
