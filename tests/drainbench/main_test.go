// Package drainbench proves the driver manager's API behaviour — GPU-pod eviction, PodDisruptionBudget refusals,
// watches, the pause of operands and the uncordon after validation — on a real local API server (with the
// controller-manager, the scheduler and kwok-simulated nodes), and benchmarks its drain against the code
// `kubectl drain` runs, counting API requests.
//
//	go test ./tests/drainbench/ -run XXX -bench . -benchtime 1x
package drainbench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// kube is the package's one cluster; every test and benchmark uses its own nodes and namespaces.
var kube *cluster.Cluster

func TestMain(m *testing.M) {
	os.Exit(cluster.Main(m, "drainbench", cluster.Options{}, func(c *cluster.Cluster) { kube = c }))
}

// counter counts the API requests a client makes, with their times.
type counter struct {
	mu    sync.Mutex
	times []time.Time
	reqs  []string
}

func (c *counter) RoundTripper(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		c.times = append(c.times, time.Now())
		c.reqs = append(c.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Total is the number of requests so far.
func (c *counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.times)
}

// Between is the number of requests made in [from, to).
func (c *counter) Between(from, to time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.times {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// Reset forgets what was counted.
func (c *counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.times, c.reqs = nil, nil
}

// countingConfig is the cluster's admin config with the given client rate limit, counting into c.
func countingConfig(c *counter, qps float32, burst int) *rest.Config {
	cfg := rest.CopyConfig(kube.Config)
	cfg.RateLimiter = nil
	cfg.QPS, cfg.Burst = qps, burst
	cfg.Wrap(c.RoundTripper)
	return cfg
}

func countingClient(t testing.TB, c *counter, qps float32, burst int) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(countingConfig(c, qps, burst))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// addGPUNode registers a simulated GPU node with room for many GPU pods.
func addGPUNode(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	n := nodefixtures.Node{Name: name, Labels: nodefixtures.Ubuntu2204.Labels(), GPUs: 64}
	n.Labels["nvidia.com/gpu.present"] = "true"
	for k, v := range labels {
		n.Labels[k] = v
	}
	if err := kube.AddNodes(context.Background(), n.Object()); err != nil {
		t.Fatal(err)
	}
}

// namespace creates a namespace and a ConfigMap in it that owns the test's bare pods: an owner that exists (so
// the garbage collector keeps them) and that no controller reconciles (so nothing recreates an evicted pod).
func namespace(t testing.TB, name string) *corev1.ConfigMap {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm, err := kube.Client.CoreV1().ConfigMaps(name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

type podSpec struct {
	name   string
	gpu    bool
	labels map[string]string
	// bare: no controller (the library refuses such pods without force)
	bare bool
}

// createPods binds the pods to node (as the scheduler would) and waits until kwok reports them all Ready.
func createPods(t testing.TB, owner *corev1.ConfigMap, node string, specs ...podSpec) {
	t.Helper()
	ctx := context.Background()
	for _, s := range specs {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: owner.Namespace, Labels: s.labels},
			Spec: corev1.PodSpec{
				NodeName:   node,
				Containers: []corev1.Container{{Name: "main", Image: "registry.example/workload:1"}},
			},
		}
		if !s.bare {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: new(true)}}
		}
		if s.gpu {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}
		if _, err := kube.Client.CoreV1().Pods(owner.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPods(t, owner.Namespace, node, "", func(ps []*corev1.Pod) bool {
		ready := 0
		for _, p := range ps {
			if podReady(p) {
				ready++
			}
		}
		return ready >= len(specs)
	})
}

// waitPods watches the node's pods in namespace (label selector sel) until cond holds (bounded).
func waitPods(t testing.TB, ns, node, sel string, cond func([]*corev1.Pod) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := kwatch.Start(ctx, kwatch.NodePods(kube.Client, ns, node, sel), &corev1.Pod{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kwatch.Until(ctx, pods, func(ps []*corev1.Pod) (bool, error) { return cond(ps), nil }); err != nil {
		var names []string
		for _, p := range pods.List() {
			names = append(names, fmt.Sprintf("%s(%s ready=%v)", p.Name, p.Status.Phase, podReady(p)))
		}
		t.Fatalf("pods on %s in %q (%s): condition not met: %v; pods: %v", node, ns, sel, err, names)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// pdb creates a budget over the pods labelled app=<app> that keeps minAvailable of them, and waits until the
// disruption controller has computed its status.
func pdb(t testing.TB, ns, app string, minAvailable int) *policyv1.PodDisruptionBudget {
	t.Helper()
	ctx := context.Background()
	mi := intstr.FromInt32(int32(minAvailable))
	b, err := kube.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app + "-budget"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &mi, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	budgets, err := kwatch.Start(wctx, kwatch.PDBs(kube.Client), &policyv1.PodDisruptionBudget{})
	if err != nil {
		t.Fatal(err)
	}
	err = kwatch.Until(wctx, budgets, func(bs []*policyv1.PodDisruptionBudget) (bool, error) {
		got, ok := budgets.Get(ns, b.Name)
		return ok && got.Status.ObservedGeneration >= got.Generation && got.Status.ExpectedPods > 0, nil
	})
	if err != nil {
		t.Fatalf("budget %s/%s never got a status: %v", ns, b.Name, err)
	}
	return b
}

// nodePodNames returns the names of the pods on node in namespace.
func nodePodNames(t testing.TB, ns, node string) map[string]bool {
	t.Helper()
	list, err := kube.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = true
		}
	}
	return out
}
