package kwatch

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestUntilReturnsWhenTheWatchedPodsGo(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{NodeName: "n1"}}
	client := fake.NewClientset(pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, NodePods(client, "ns", "n1", "app=x"), &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := s.Get("ns", "p"); !ok || got.Name != "p" {
		t.Fatalf("Get = %v %v", got, ok)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = client.CoreV1().Pods("ns").Delete(context.Background(), "p", metav1.DeleteOptions{})
	}()
	if err := Until(ctx, s, func(ps []*corev1.Pod) (bool, error) { return len(ps) == 0, nil }); err != nil {
		t.Fatal(err)
	}
}

func TestUntilEndsWithTheContext(t *testing.T) {
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	s, err := Start(ctx, NodePods(client, "ns", "n1", ""), &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Until(ctx, s, func(ps []*corev1.Pod) (bool, error) { return false, nil }); err == nil {
		t.Fatal("Until outlived its context")
	}
}
