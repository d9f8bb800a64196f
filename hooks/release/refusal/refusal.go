// Package refusal records why a hook refused a Helm operation where stock helm and kubectl users look: an Event on
// the hook's own Job (`kubectl describe job`, `kubectl get events`), which `kube-gpu-stack status` prints too, for as
// long as the API server keeps Events (its --event-ttl, an hour by default; the Job's log keeps the whole plan). Helm
// itself shows only the Job's failure reason (BackoffLimitExceeded), and its copy of the hook's log comes, if at
// all, after the whole operation.
package refusal

import (
	"context"
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
)

// Reason is the Events' reason.
const Reason = "UpgradeRefused"

// maxMessage bounds the Event's message (the events.k8s.io API's limit; core Events carry it whole).
const maxMessage = 1024

// Record adds a Warning Event with message to the Job named job in namespace, as the hook that runs in it.
func Record(ctx context.Context, client kubernetes.Interface, namespace, job, message string, now time.Time) error {
	j, err := apiretry.Value(ctx, func(ctx context.Context) (*batchv1.Job, error) {
		return client.BatchV1().Jobs(namespace).Get(ctx, job, metav1.GetOptions{})
	})
	if err != nil {
		return fmt.Errorf("read the hook's Job %s/%s to record its refusal: %w", namespace, job, err)
	}
	if len(message) > maxMessage {
		message = message[:maxMessage-3] + "..."
	}
	t := metav1.NewTime(now)
	ev := &corev1.Event{
		// named as client-go's event recorder names its Events
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", job, now.UnixNano()), Namespace: namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Namespace: namespace, Name: job, UID: j.UID,
			ResourceVersion: j.ResourceVersion},
		Reason: Reason, Message: message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: job},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
	}
	return apiretry.Do(ctx, func(ctx context.Context) error {
		_, err := client.CoreV1().Events(namespace).Create(ctx, ev, metav1.CreateOptions{})
		return err
	})
}

// Last is the newest refusal recorded on the Job named job as it is now (nil when none): the Events of an earlier
// Job of that name (a refusal the next operation's hook replaced) are not its.
func Last(ctx context.Context, client kubernetes.Interface, namespace, job string) (*corev1.Event, error) {
	j, err := client.BatchV1().Jobs(namespace).Get(ctx, job, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sel := fields.Set{"involvedObject.uid": string(j.UID), "reason": Reason}.AsSelector().String()
	evs, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	// a fake client ignores field selectors: the check is repeated here
	items := slices.DeleteFunc(evs.Items, func(e corev1.Event) bool { return e.InvolvedObject.UID != j.UID || e.Reason != Reason })
	if len(items) == 0 {
		return nil, nil
	}
	last := slices.MaxFunc(items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	return &last, nil
}
