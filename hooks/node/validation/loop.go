package validation

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/statusfiles"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// maxReason bounds what a check records on the Node: enough for the first line of a tool's error, never a log.
const maxReason = 400

// check is one component's check.
type check struct {
	// name is the annotation's suffix (kube-gpu-stack.io/validation.<name>) and the log prefix.
	name string
	// owns are the status files the check writes; they are removed before the first attempt, so nothing trusts a
	// result from an earlier run while this one is deciding.
	owns []string
	// attempt evaluates the check once.
	attempt func(ctx context.Context, p progress) result
}

// progress lets a long attempt (a workload pod pulling its image) say what it is waiting for, on the Node and in
// the log.
type progress struct {
	name   string
	out    io.Writer
	report func(reason string)
}

// Report records reason as the check's waiting reason on the Node.
func (p progress) Report(reason string) { p.report(reason) }

// Logf writes one log line prefixed with the check's name.
func (p progress) Logf(format string, args ...any) {
	fmt.Fprintf(p.out, p.name+": "+format+"\n", args...)
}

// result is one attempt's outcome.
type result struct {
	state  nodestate.CheckState
	reason string
	// files are written in every state: on ready or skipped they are the check's result; while waiting they are
	// progress other operands may already use (workload-type, driver-ready before the extra modules load).
	files []file
}

type file struct {
	name string
	data []byte
}

func ready(files ...file) result { return result{state: nodestate.CheckReady, files: files} }

func skipped(reason string, files ...file) result {
	return result{state: nodestate.CheckSkipped, reason: reason, files: files}
}

// waiting is an outcome that can change by itself (the driver is loading, a pod is pulling): retried with
// WithWait, a failure without.
func waiting(format string, args ...any) result {
	return result{state: nodestate.CheckWaiting, reason: fmt.Sprintf(format, args...)}
}

// failed is an outcome retrying cannot change (the validations directory cannot be read).
func failed(format string, args ...any) result {
	return result{state: nodestate.CheckFailed, reason: fmt.Sprintf(format, args...)}
}

// run drives a check: remove its files, attempt, write files, record the outcome on the Node, and with WithWait
// retry every SleepInterval (a log line when the reason changes and about once a minute) until it passes or ctx
// ends.
func (o *Options) run(ctx context.Context, out io.Writer, c check) error {
	rec := &recorder{o: o, check: c.name, out: out}
	if o.NodeName == "" || o.Client == nil {
		fmt.Fprintf(out, "%s: not recording the outcome on the Node (no NODE_NAME or no API access)\n", c.name)
		rec.off = true
	}
	if _, err := statusfiles.Cleanup(o.OutputDir, c.owns); err != nil {
		return fmt.Errorf("%s check: remove its earlier status files: %w", c.name, err)
	}
	p := progress{name: c.name, out: out, report: func(reason string) {
		rec.record(ctx, nodestate.Validation{State: nodestate.CheckWaiting, Reason: reason})
	}}
	start := time.Now()
	var lastReason string
	var lastLog time.Time
	for {
		r := c.attempt(ctx, p)
		for _, f := range r.files {
			if err := statusfiles.Write(o.OutputDir, f.name, f.data); err != nil {
				r = failed("%v in %s", err, o.OutputDir)
				break
			}
		}
		switch r.state {
		case nodestate.CheckReady, nodestate.CheckSkipped:
			v := nodestate.Validation{State: r.state, Reason: r.reason}
			rec.record(ctx, v)
			fmt.Fprintf(out, "%s: %s\n", c.name, v)
			return nil
		case nodestate.CheckFailed:
			return rec.fail(ctx, r.reason)
		}
		if !o.WithWait {
			return rec.fail(ctx, r.reason)
		}
		if err := ctx.Err(); err != nil {
			return rec.fail(ctx, fmt.Sprintf("stopped after %s while waiting: %s", time.Since(start).Round(time.Second), r.reason))
		}
		rec.record(ctx, nodestate.Validation{State: nodestate.CheckWaiting, Reason: r.reason})
		if r.reason != lastReason || time.Since(lastLog) >= time.Minute {
			fmt.Fprintf(out, "%s: waiting (%s): %s\n", c.name, time.Since(start).Round(time.Second), r.reason)
			lastReason, lastLog = r.reason, time.Now()
		}
		select {
		case <-ctx.Done():
			return rec.fail(ctx, fmt.Sprintf("stopped after %s while waiting: %s", time.Since(start).Round(time.Second), r.reason))
		case <-time.After(o.SleepInterval):
		}
	}
}

// recorder writes a check's outcome on the Node, once per change. Recording is best effort: the status files are
// the contract operands rely on, the annotation is the explanation, so an API error is logged and the check goes
// on (a Forbidden answer stops further attempts: that pod's ServiceAccount may not patch Nodes).
type recorder struct {
	o     *Options
	check string
	out   io.Writer
	last  string
	off   bool
}

func (r *recorder) record(ctx context.Context, v nodestate.Validation) {
	if len(v.Reason) > maxReason {
		v.Reason = strings.ToValidUTF8(v.Reason[:maxReason], "") + "..."
	}
	if r.off || v.String() == r.last {
		return
	}
	if ctx.Err() != nil { // a stopping pod still says why it stopped
		ctx = context.WithoutCancel(ctx)
	}
	// Transient API errors are retried (nodestate.Apply), but only briefly: the checks and their status files must
	// not wait on the API server; a record that did not land is sent again with the next one.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := nodestate.Apply(ctx, r.o.Client, r.o.NodeName, nodestate.SetValidation(r.check, v)); err != nil {
		fmt.Fprintf(r.out, "%s: could not record %q on node %s: %v\n", r.check, v.String(), r.o.NodeName, err)
		if apierrors.IsForbidden(err) {
			r.off = true
		}
		return
	}
	r.last = v.String()
}

func (r *recorder) fail(ctx context.Context, reason string) error {
	r.record(ctx, nodestate.Validation{State: nodestate.CheckFailed, Reason: reason})
	return fmt.Errorf("%s check failed on %s: %s", r.check, r.node(), reason)
}

func (r *recorder) node() string {
	if r.o.NodeName == "" {
		return "this node"
	}
	return "node " + r.o.NodeName
}
