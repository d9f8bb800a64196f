package gpudrain

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry/apiretrytest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
)

var (
	podsGVR = corev1.SchemeGroupVersion.WithResource("pods")
	pdbsGVR = policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets")
)

// cluster is a fake API server with the Eviction API: each eviction request is checked against the budgets in
// the store as the API server checks it, then granted (the pod deleted) or refused with 429. decide, when set,
// answers first (an error refuses the eviction with that error; nil lets the budget check go on).
type cluster struct {
	t      *testing.T
	client *fake.Clientset

	mu        sync.Mutex
	evictions []eviction
	decide    func(ns, name string, n int) error
	// recreate, when set, puts a new pod (new UID) under the same name right after an eviction deletes it, as a
	// StatefulSet does.
	recreate bool
	// finalizer, when set, keeps an evicted pod as a finalizer does: its deletion is only marked, and its
	// containers stop (phase Failed), but the object stays.
	finalizer bool
}

type eviction struct {
	pod     string
	at      time.Time
	granted bool
}

func newCluster(t *testing.T, objs ...runtime.Object) *cluster {
	c := &cluster{t: t, client: fake.NewClientset(objs...)}
	c.client.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}, {Name: "pods/eviction", Kind: "Eviction", Group: "policy", Version: "v1"}}},
		{GroupVersion: "policy/v1", APIResources: []metav1.APIResource{{Name: "poddisruptionbudgets", Kind: "PodDisruptionBudget"}}},
	}
	c.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		err := c.evict(ev.Namespace, ev.Name)
		return true, ev, err
	})
	return c
}

// evict runs with the fake's lock held: it reads and writes the tracker directly.
func (c *cluster) evict(ns, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := ns + "/" + name
	n := 0
	for _, e := range c.evictions {
		if e.pod == k {
			n++
		}
	}
	rec := eviction{pod: k, at: time.Now()}
	defer func() { c.evictions = append(c.evictions, rec) }()
	if c.decide != nil {
		if err := c.decide(ns, name, n); err != nil {
			return err
		}
	}
	obj, err := c.client.Tracker().Get(podsGVR, ns, name)
	if err != nil {
		return err
	}
	pod := obj.(*corev1.Pod)
	pdbs, err := c.client.Tracker().List(pdbsGVR, policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"), ns)
	if err != nil {
		return err
	}
	for _, b := range pdbs.(*policyv1.PodDisruptionBudgetList).Items {
		sel, _ := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if sel.Matches(labelsOf(pod)) && b.Status.DisruptionsAllowed < 1 {
			return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
	}
	if c.finalizer {
		held := pod.DeepCopy()
		now := metav1.Now()
		held.DeletionTimestamp, held.Finalizers, held.Status.Phase = &now, []string{"example.com/keep"}, corev1.PodFailed
		rec.granted = true
		return c.client.Tracker().Update(podsGVR, held, ns)
	}
	if err := c.client.Tracker().Delete(podsGVR, ns, name); err != nil {
		return err
	}
	rec.granted = true
	if c.recreate {
		again := pod.DeepCopy()
		again.UID = pod.UID + "-again"
		again.ResourceVersion = ""
		if err := c.client.Tracker().Add(again); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) evictionsOf(k string) []eviction {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []eviction
	for _, e := range c.evictions {
		if e.pod == k {
			out = append(out, e)
		}
	}
	return out
}

func (c *cluster) run(o Options) (Result, error) {
	o.Client, o.Node = c.client, node
	o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Complete()
	if err := o.Validate(); err != nil {
		c.t.Fatal(err)
	}
	return o.Run(context.Background(), io.Discard)
}

func labelsOf(p *corev1.Pod) labels.Set { return labels.Set(p.Labels) }

func withLabels(l map[string]string) podOpt { return func(p *corev1.Pod) { p.Labels = l } }

func withUID(uid string) podOpt { return func(p *corev1.Pod) { p.UID = types.UID(uid) } }

func budget(name string, allowed int32, rv string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", ResourceVersion: rv},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1},
	}
}

// A budget that refuses the eviction is watched, not polled: nothing is re-posted while it allows nothing, and
// the eviction goes through as soon as it is relaxed (well before the timed retry of an unexplained refusal).
func TestBudgetRelaxedLetsTheEvictionGoOn(t *testing.T) {
	c := newCluster(t, pod("train", limits("nvidia.com/gpu"), withLabels(map[string]string{"app": "train"}), withUID("t1")),
		budget("train-pdb", 0, "1"))
	go func() {
		time.Sleep(600 * time.Millisecond)
		relaxed := budget("train-pdb", 1, "2")
		if _, err := c.client.PolicyV1().PodDisruptionBudgets("ml").UpdateStatus(context.Background(), relaxed, metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	res, err := c.run(Options{GPUOnly: true, Timeout: 20 * time.Second, EvictErrorRetryDelay: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Pods, []string{"ml/train"}) {
		t.Fatalf("evicted %v", res.Pods)
	}
	evs := c.evictionsOf("ml/train")
	if len(evs) != 2 || evs[0].granted || !evs[1].granted {
		t.Fatalf("evictions %+v; want one refused, then one granted after the budget changed (no polling)", evs)
	}
	if d := evs[1].at.Sub(start); d < 500*time.Millisecond || d > 5*time.Second {
		t.Fatalf("second eviction after %s; want right after the budget was relaxed (600ms)", d)
	}
}

// A refusal no budget explains (the server's own throttling) is retried after EvictErrorRetryDelay: not in a tight
// loop, and not never.
func TestUnexplainedRefusalIsRetriedAfterTheDelay(t *testing.T) {
	c := newCluster(t, pod("train", limits("nvidia.com/gpu"), withUID("t1")))
	c.decide = func(_, _ string, n int) error {
		if n < 2 {
			return apierrors.NewTooManyRequests("too many requests", 0)
		}
		return nil
	}
	delay := 300 * time.Millisecond
	if _, err := c.run(Options{GPUOnly: true, Timeout: 20 * time.Second, EvictErrorRetryDelay: delay}); err != nil {
		t.Fatal(err)
	}
	evs := c.evictionsOf("ml/train")
	if len(evs) != 3 || !evs[2].granted {
		t.Fatalf("evictions %+v; want two refusals then the grant", evs)
	}
	for i := 1; i < len(evs); i++ {
		if gap := evs[i].at.Sub(evs[i-1].at); gap < delay || gap > delay+2*time.Second {
			t.Fatalf("retry %d after %s; want about %s", i, gap, delay)
		}
	}
}

// When the budget never allows the eviction, the pass ends at its timeout with a StuckError that names the pod
// and the budget, and unwraps to the deadline.
func TestTimeoutNamesThePodAndTheBudget(t *testing.T) {
	c := newCluster(t, pod("train", limits("nvidia.com/gpu"), withLabels(map[string]string{"app": "train"}), withUID("t1")),
		budget("train-pdb", 0, "1"))
	start := time.Now()
	_, err := c.run(Options{GPUOnly: true, Timeout: 500 * time.Millisecond})
	if time.Since(start) > 3*time.Second {
		t.Fatalf("took %s, timeout was 500ms", time.Since(start))
	}
	var stuck *StuckError
	if !errors.As(err, &stuck) {
		t.Fatalf("err = %v, want a StuckError", err)
	}
	if len(stuck.Pods) != 1 || stuck.Pods[0].Pod != "ml/train" || !slices.Equal(stuck.Pods[0].Budgets, []string{"ml/train-pdb"}) {
		t.Fatalf("stuck pods %+v", stuck.Pods)
	}
	if msg := err.Error(); !strings.Contains(msg, "ml/train") || !strings.Contains(msg, "PodDisruptionBudget ml/train-pdb (disruptionsAllowed 0") {
		t.Fatalf("message %q does not name the pod and the budget", msg)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v does not unwrap to the deadline", err)
	}
}

// A pod that comes back under the same name (a StatefulSet's) is a new pod: the one evicted is gone, and the pass
// neither waits for the newcomer nor evicts it.
func TestPodRecreatedUnderTheSameNameCountsAsGone(t *testing.T) {
	c := newCluster(t, pod("db-0", limits("nvidia.com/gpu"), withUID("old")))
	c.recreate = true
	res, err := c.run(Options{GPUOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Pods, []string{"ml/db-0"}) || len(c.evictionsOf("ml/db-0")) != 1 {
		t.Fatalf("evicted %v with %d requests; want one eviction of the old pod", res.Pods, len(c.evictionsOf("ml/db-0")))
	}
	p, err := c.client.CoreV1().Pods("ml").Get(context.Background(), "db-0", metav1.GetOptions{})
	if err != nil || p.UID != "old-again" {
		t.Fatalf("the new pod: %v, %v", p, err)
	}
}

// An evicted pod that a finalizer holds, with its containers dead (phase Failed), no longer uses the GPU: the pass
// ends without waiting for the finalizer. (Whether something still holds the device is the unload's check.)
func TestEvictedPodHeldByAFinalizerCountsAsGoneOnceItStopped(t *testing.T) {
	c := newCluster(t, pod("train-0", limits("nvidia.com/gpu")))
	c.finalizer = true
	res, err := c.run(Options{GPUOnly: true, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("the pass: %v; want it done once the evicted pod stopped", err)
	}
	if !slices.Equal(res.Pods, []string{"ml/train-0"}) || len(c.evictionsOf("ml/train-0")) != 1 {
		t.Fatalf("evicted %v with %d requests; want one eviction", res.Pods, len(c.evictionsOf("ml/train-0")))
	}
	p, err := c.client.CoreV1().Pods("ml").Get(context.Background(), "train-0", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("the held pod is still there, marked for deletion: %v, %v", p, err)
	}
}

// The pods of a live DaemonSet (the operands, a GPU monitoring agent) stay: their DaemonSet would put them back
// at once. That holds in GPU mode and in a full drain.
func TestDaemonSetPodsAreLeftAlone(t *testing.T) {
	for _, gpuOnly := range []bool{true, false} {
		c := newCluster(t,
			pod("train", limits("nvidia.com/gpu"), withUID("t1")),
			pod("agent", limits("nvidia.com/gpu"), ownedByDaemonSet("agent-ds"), withUID("a1")),
			&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent-ds", Namespace: "ml"}})
		res, err := c.run(Options{GPUOnly: gpuOnly, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("gpuOnly=%v: %v", gpuOnly, err)
		}
		if !slices.Equal(res.Pods, []string{"ml/train"}) || len(c.evictionsOf("ml/agent")) != 0 {
			t.Fatalf("gpuOnly=%v: evicted %v, %d evictions of the DaemonSet pod", gpuOnly, res.Pods, len(c.evictionsOf("ml/agent")))
		}
		if _, err := c.client.CoreV1().Pods("ml").Get(context.Background(), "agent", metav1.GetOptions{}); err != nil {
			t.Fatalf("gpuOnly=%v: DaemonSet pod gone: %v", gpuOnly, err)
		}
	}
}

var transientErrors = apiretrytest.Transient()

// An eviction, the pod list and the DaemonSet lookups that fail with an error that may pass are retried with
// backoff, and the pass completes; before, any eviction error but 429 ended the drain.
func TestTransientErrorsAreRetried(t *testing.T) {
	for name, terr := range transientErrors {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t,
				pod("train", limits("nvidia.com/gpu"), withUID("t1")),
				pod("agent", ownedByDaemonSet("agent-ds"), withUID("a1")),
				&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent-ds", Namespace: "ml"}})
			c.decide = func(_, _ string, n int) error {
				if n < 3 {
					return terr
				}
				return nil
			}
			failFirst(c.client, "list", "pods", 2, terr)
			failFirst(c.client, "get", "daemonsets", 2, terr)
			res, err := c.run(Options{GPUOnly: false, Timeout: 20 * time.Second, EvictErrorRetryDelay: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			evs := c.evictionsOf("ml/train")
			if !slices.Equal(res.Pods, []string{"ml/train"}) || len(evs) != 4 || !evs[3].granted {
				t.Fatalf("evicted %v with %+v; want three failures, then the grant", res.Pods, evs)
			}
			// backoff, not a tight loop: InitialDelay, doubled each time
			for i, want := 1, apiretry.InitialDelay; i < len(evs); i, want = i+1, want*2 {
				if gap := evs[i].at.Sub(evs[i-1].at); gap < want {
					t.Fatalf("retry %d after %s; want at least %s", i, gap, want)
				}
			}
		})
	}
}

// The claim list that tells a DRA GPU pod from another is retried too: a pod whose claim could not be read for a
// moment is still evicted.
func TestTransientClaimListIsRetried(t *testing.T) {
	c := newCluster(t, pod("dra", claim("dra-claim"), withUID("d1")), allocated("dra-claim", gpupods.DRADriver))
	failFirst(c.client, "list", "resourceclaims", 2, transientErrors["503"])
	res, err := c.run(Options{GPUOnly: true, Timeout: 20 * time.Second})
	if err != nil || !slices.Equal(res.Pods, []string{"ml/dra"}) {
		t.Fatalf("evicted %v, err %v; want the DRA GPU pod", res.Pods, err)
	}
}

// An eviction error retrying cannot fix ends the pass at once, naming the pod and the error.
func TestLastingEvictionErrorFailsAtOnce(t *testing.T) {
	c := newCluster(t, pod("train", limits("nvidia.com/gpu"), withUID("t1")))
	c.decide = func(string, string, int) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods/eviction"}, "train", errors.New("RBAC: no eviction rights"))
	}
	start := time.Now()
	_, err := c.run(Options{GPUOnly: true, Timeout: 20 * time.Second})
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ml/train") || time.Since(start) > 2*time.Second {
		t.Fatalf("err = %v after %s; want the Forbidden naming the pod, at once", err, time.Since(start))
	}
}

// Transient errors that outlast the timeout end the pass with a StuckError that names the pod and the server's
// last error, not only the deadline.
func TestTransientErrorsOutlastingTheTimeoutNameTheLastError(t *testing.T) {
	c := newCluster(t, pod("train", limits("nvidia.com/gpu"), withUID("t1")))
	c.decide = func(string, string, int) error { return transientErrors["etcd request timed out"] }
	_, err := c.run(Options{GPUOnly: true, Timeout: 800 * time.Millisecond})
	var stuck *StuckError
	if !errors.As(err, &stuck) || len(stuck.Pods) != 1 || stuck.Pods[0].Pod != "ml/train" {
		t.Fatalf("err = %v, want a StuckError naming ml/train", err)
	}
	if !strings.Contains(stuck.Pods[0].Reason, "etcdserver: request timed out") {
		t.Fatalf("reason %q does not name the last error", stuck.Pods[0].Reason)
	}
	if n := len(c.evictionsOf("ml/train")); n < 2 {
		t.Fatalf("%d eviction requests; want retries", n)
	}
}

func failFirst(c *fake.Clientset, verb, resource string, n int, err error) {
	calls := 0
	var mu sync.Mutex
	c.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls <= n {
			return true, nil, err
		}
		return false, nil, nil
	})
}
