package kwatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

// TestStartFailsAtOnceNamingAForbiddenList: a list the API server refuses (RBAC) never syncs; Start must say so at
// once, naming the resource, namespace and selectors, instead of a bare deadline after the whole timeout.
func TestStartFailsAtOnceNamingAForbiddenList(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: access denied"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Start(ctx, NodePods(client, "gpu-operator", "n1", "app=x"), &corev1.Pod{})
	if err == nil {
		t.Fatal("Start succeeded on a forbidden list")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Start took %s to fail: the error must come before the deadline", took)
	}
	if !apierrors.IsForbidden(err) {
		t.Errorf("error %v does not wrap the Forbidden status", err)
	}
	for _, want := range []string{"pods", `"gpu-operator"`, "spec.nodeName=n1", "app=x", "forbidden"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// TestStartRetriesTransientListErrors: a server error is retried within the deadline, and the store syncs once the
// list works.
func TestStartRetriesTransientListErrors(t *testing.T) {
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "n1"}})
	var failures atomic.Int32
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures.Add(1) <= 2 {
			return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Start(ctx, NodePods(client, "ns", "n1", ""), &corev1.Pod{})
	if err != nil {
		t.Fatalf("Start gave up on a transient error: %v", err)
	}
	if _, ok := s.Get("ns", "p"); !ok {
		t.Fatal("the store misses the pod")
	}
}

// TestStartNamesTheLastErrorAtTheDeadline: when transient errors last until the deadline, the error still says
// what failed.
func TestStartNamesTheLastErrorAtTheDeadline(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("the server is restarting")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := Start(ctx, Node(client, "n1"), &corev1.Node{})
	if err == nil {
		t.Fatal("Start succeeded")
	}
	for _, want := range []string{"nodes", "metadata.name=n1", "the server is restarting"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// TestUntilEndsOnAForbiddenWatch: for a ServiceAccount that may list but not watch, the list succeeds, but the
// refused watch must end the wait at once (from Start, or from Until when the sync came first) instead of a wait
// for a change that never comes.
func TestUntilEndsOnAForbiddenWatch(t *testing.T) {
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "n1"}})
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("watch not allowed"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	s, err := Start(ctx, NodePods(client, "ns", "n1", ""), &corev1.Pod{})
	if err == nil {
		err = Until(ctx, s, func(ps []*corev1.Pod) (bool, error) { return len(ps) == 0, nil })
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pods in namespace "ns"`) {
		t.Fatalf("Until = %v, want the Forbidden watch naming the pods", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Until took %s", took)
	}
}

// TestUntilAllSeesEveryStoreOnce: cond gets the objects of every store, one shared by two stores once, and runs
// again on a change to any of them.
func TestUntilAllSeesEveryStoreOnce(t *testing.T) {
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	client := fake.NewClientset(node("a", map[string]string{"x": "1"}), node("b", map[string]string{"x": "1", "y": "1"}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stores []*Store[*corev1.Node]
	for _, sel := range []string{"x=1", "y=1"} {
		s, err := Start(ctx, Nodes(client, sel), &corev1.Node{})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = client.CoreV1().Nodes().Create(context.Background(), node("c", map[string]string{"y": "1"}), metav1.CreateOptions{})
	}()
	var calls int
	err := UntilAll(ctx, stores, func(ns []*corev1.Node) (bool, error) {
		calls++
		var names []string
		for _, n := range ns {
			names = append(names, n.Name)
		}
		slices.Sort(names)
		if got := strings.Join(names, ","); got != "a,b" && got != "a,b,c" {
			t.Errorf("cond got %s, want a,b then a,b,c", got)
		}
		return len(ns) == 3, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 2 {
		t.Errorf("cond ran %d times, want once at the start and again after the change", calls)
	}
}

// TestUntilAllEndsWhenAStoreFailsForGood: a watch of one store refused for good ends the wait with its error.
func TestUntilAllEndsWhenAStoreFailsForGood(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, Node(client, "a"), &corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	s.watchError(ctx, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "a", errors.New("RBAC: access denied")))
	if err := UntilAll(ctx, []*Store[*corev1.Node]{s}, func([]*corev1.Node) (bool, error) { return false, nil }); !apierrors.IsForbidden(err) {
		t.Fatalf("UntilAll = %v, want the watch's Forbidden", err)
	}
}

// TestFirstListIsAConsistentRead: a store's first list must not be served from a watch cache older than what its
// caller read just before (a drain lists a node's pods, then watches them go: a pod missing from a stale first list
// would count as gone while it still runs). The reflector asks for resourceVersion "0" (any); Start asks for "".
func TestFirstListIsAConsistentRead(t *testing.T) {
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "n1"}})
	var versions []string
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		versions = append(versions, a.(k8stesting.ListActionImpl).GetListOptions().ResourceVersion)
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Start(ctx, NodePods(client, "ns", "n1", ""), &corev1.Pod{}); err != nil {
		t.Fatal(err)
	}
	if len(versions) == 0 || versions[0] != "" {
		t.Fatalf("the first list asked for resourceVersion %q; want \"\" (a consistent read)", versions)
	}
}
