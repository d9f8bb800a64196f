package refusal

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func job(uid string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "kube-gpu-stack-pre-upgrade", Namespace: "gpu-operator", UID: types.UID(uid)}}
}

// The refusal lands on the hook's Job as it is now, and a Job of the same name created by a later operation does
// not inherit it.
func TestRecordedRefusalBelongsToItsJob(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(job("first"))
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	long := "driver upgrade refused, nothing changed: " + strings.Repeat("x", 2000)
	if err := Record(ctx, client, "gpu-operator", "kube-gpu-stack-pre-upgrade", "first refusal", now); err != nil {
		t.Fatal(err)
	}
	if err := Record(ctx, client, "gpu-operator", "kube-gpu-stack-pre-upgrade", long, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	ev, err := Last(ctx, client, "gpu-operator", "kube-gpu-stack-pre-upgrade")
	if err != nil || ev == nil {
		t.Fatalf("Last: %v, %v", ev, err)
	}
	if ev.InvolvedObject.UID != "first" || ev.InvolvedObject.Kind != "Job" || ev.Type != "Warning" || ev.Reason != Reason {
		t.Errorf("the Event %+v does not name the Job (uid first) as a Warning %s", ev.InvolvedObject, Reason)
	}
	if len(ev.Message) != maxMessage || !strings.HasPrefix(ev.Message, "driver upgrade refused") {
		t.Errorf("the newest refusal's message is %d bytes (%.40q...); want the newest, cut to %d", len(ev.Message), ev.Message, maxMessage)
	}
	// the next upgrade's hook replaces the Job (before-hook-creation)
	if err := client.BatchV1().Jobs("gpu-operator").Delete(ctx, "kube-gpu-stack-pre-upgrade", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.BatchV1().Jobs("gpu-operator").Create(ctx, job("second"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev, err := Last(ctx, client, "gpu-operator", "kube-gpu-stack-pre-upgrade"); err != nil || ev != nil {
		t.Errorf("a new Job of the same name shows the old Job's refusal: %v, %v", ev, err)
	}
}

func TestRecordFailsWithoutItsJob(t *testing.T) {
	err := Record(context.Background(), fake.NewClientset(), "gpu-operator", "kube-gpu-stack-pre-upgrade", "refused", time.Now())
	if err == nil || !strings.Contains(err.Error(), "kube-gpu-stack-pre-upgrade") {
		t.Errorf("Record without the Job: %v; want an error naming it", err)
	}
}
