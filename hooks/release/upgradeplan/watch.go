package upgradeplan

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/terminal"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// WriteSummary prints the rollout at a glance: how many nodes stand in each driver upgrade state, each pool's
// canary and where it is, and the post-upgrade gate (its Job gateJob in namespace): running with the time left to
// its deadline, passed or failed.
func WriteSummary(ctx context.Context, client kubernetes.Interface, namespace, gateJob string, now time.Time, out io.Writer) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	counts := map[nodestate.UpgradeState]int{}
	canaries := map[string]map[string]string{} // pool -> canary node -> its state
	states := map[string]nodestate.UpgradeState{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		st := nodestate.UpgradeState(n.Labels[nodestate.UpgradeStateLabel])
		if st == "" {
			continue
		}
		counts[st]++
		states[n.Name] = st
		if m, err := canary.Read(n); err == nil && m != nil && m.Pool != "" {
			if canaries[m.Pool] == nil {
				canaries[m.Pool] = map[string]string{}
			}
			for c := range m.Canary {
				canaries[m.Pool][c] = ""
			}
		}
	}
	var parts []string
	for _, st := range nodestate.UpgradeStates {
		if counts[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[st], st))
		}
	}
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	fmt.Fprintf(out, "nodes by driver upgrade state: %s\n", strings.Join(parts, ", "))
	for _, pool := range slices.Sorted(maps.Keys(canaries)) {
		var cs []string
		for _, c := range slices.Sorted(maps.Keys(canaries[pool])) {
			st := string(states[c])
			if st == "" {
				st = "gone"
			}
			cs = append(cs, c+" ("+st+")")
		}
		if len(cs) > 0 {
			fmt.Fprintf(out, "pool %s canary: %s\n", pool, strings.Join(cs, ", "))
		}
	}
	job, err := client.BatchV1().Jobs(namespace).Get(ctx, gateJob, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read the validation gate's Job: %w", err)
	default:
		fmt.Fprintf(out, "validation gate: %s\n", gateState(job, now))
	}
	return nil
}

// gateState says where the gate's Job stands: running and how long it has left before its deadline, passed, or
// failed with the Job's reason.
func gateState(job *batchv1.Job, now time.Time) string {
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return "passed"
		case batchv1.JobFailed:
			return "failed (" + c.Reason + "): kubectl logs -n " + job.Namespace + " job/" + job.Name
		}
	}
	if job.Status.StartTime == nil || job.Spec.ActiveDeadlineSeconds == nil {
		return "waiting to start"
	}
	left := job.Status.StartTime.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds) * time.Second).Sub(now)
	return fmt.Sprintf("running, %s left before its deadline", max(left, 0).Round(time.Second))
}

// Watch draws a frame at once and then every interval until ctx ends (Ctrl-C), which is no error. On a terminal
// each frame replaces the last; elsewhere frames follow one another, each headed by its time.
func Watch(ctx context.Context, interval time.Duration, out io.Writer, now func() time.Time, draw func(io.Writer) error) error {
	clear := terminal.Is(out)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		var frame bytes.Buffer
		fmt.Fprintf(&frame, "%s (every %s; Ctrl-C ends)\n", now().UTC().Format(time.RFC3339), interval)
		if err := draw(&frame); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if clear {
			fmt.Fprint(out, "\033[H\033[2J")
		} else {
			fmt.Fprintln(out)
		}
		if _, err := out.Write(frame.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
