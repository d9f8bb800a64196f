package upgradeplan

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/canary"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

func stateNode(name string, st nodestate.UpgradeState, mark string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{nodestate.UpgradeStateLabel: string(st)},
		Annotations: map[string]string{}}}
	if mark != "" {
		n.Annotations[canary.MarkAnnotation] = mark
	}
	return n
}

// The summary counts the nodes per state in the order a change walks them, names each pool's canary with where it
// stands, and gives the gate's time left before its deadline.
func TestSummaryCountsStatesNamesCanariesAndGateTimeLeft(t *testing.T) {
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	mark := `{"pool":"a","plan":"2026-12-07T05:59:00Z","seq":1,"canary":{"gpu-1":"d1"},"maxUnavailable":2}`
	deadline := int64(930)
	gate := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "gate", Namespace: "gpu-operator"},
		Spec:   batchv1.JobSpec{ActiveDeadlineSeconds: &deadline},
		Status: batchv1.JobStatus{StartTime: &metav1.Time{Time: now.Add(-time.Minute)}, Active: 1}}
	client := fake.NewClientset(stateNode("gpu-1", nodestate.ValidationRequired, mark), stateNode("gpu-2", nodestate.UpgradeRequired, mark),
		stateNode("gpu-3", nodestate.UpgradeRequired, mark), stateNode("gpu-4", nodestate.UpgradeDone, ""), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}, gate)
	var out bytes.Buffer
	if err := WriteSummary(context.Background(), client, "gpu-operator", "gate", now, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"nodes by driver upgrade state: 2 upgrade-required, 1 validation-required, 1 upgrade-done\n",
		"pool a canary: gpu-1 (validation-required)\n",
		"validation gate: running, 14m30s left before its deadline\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	gate.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "DeadlineExceeded"}}
	if s := gateState(gate, now); !strings.HasPrefix(s, "failed (DeadlineExceeded)") {
		t.Errorf("a failed gate reads %q", s)
	}
}

// Watch draws at once and on every tick, and Ctrl-C (its context ending) ends it without an error; a draw that
// fails otherwise ends it with that error.
func TestWatchRedrawsUntilItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var frames atomic.Int32
	var out bytes.Buffer
	err := Watch(ctx, 5*time.Millisecond, &out, time.Now, func(w io.Writer) error {
		if frames.Add(1) == 3 {
			cancel()
		}
		_, err := w.Write([]byte("frame\n"))
		return err
	})
	if err != nil || frames.Load() < 3 || strings.Count(out.String(), "frame\n") < 3 || !strings.Contains(out.String(), "Ctrl-C ends") {
		t.Errorf("Watch: %v after %d frames:\n%s", err, frames.Load(), out.String())
	}
	errDraw := errors.New("the API server is gone")
	if err := Watch(context.Background(), time.Millisecond, &out, time.Now, func(io.Writer) error { return errDraw }); !errors.Is(err, errDraw) {
		t.Errorf("a failing draw: Watch returned %v", err)
	}
}
