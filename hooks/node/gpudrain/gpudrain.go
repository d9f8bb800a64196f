// Package gpudrain evicts a node's GPU pods (or drains the node) before its driver changes. It uses
// k8s.io/kubectl/pkg/drain for what kubectl drain decides — which pods go, and the Eviction API call — but
// waits differently: one watch on the node's pods confirms the deletions (kubectl polls every pod every second),
// and while a PodDisruptionBudget refuses an eviction it watches the budgets and retries when one allows a
// disruption (kubectl re-posts the eviction every few seconds). Draining 50 pods thus costs about one request per
// pod, and a node blocked by a budget costs nearly none while it waits. An API error that may pass (etcd timing out,
// the API server restarting, a dropped connection) is retried with backoff until the pass's timeout, on the
// evictions as on the reads (apiretry); only an error retrying cannot fix ends the pass early.
package gpudrain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
)

// Defaults.
const (
	// DefaultTimeout bounds an eviction pass when none is given (the chart's "0s" means "no bound" upstream; a
	// driver change must not hang a node forever).
	DefaultTimeout = 5 * time.Minute
	// DefaultEvictErrorRetryDelay spaces retries of a refused eviction that no watched budget explains (kubectl's
	// value; the library's zero value would retry in a tight loop).
	DefaultEvictErrorRetryDelay = 5 * time.Second
	// DefaultParallelism is how many eviction requests are in flight at once.
	DefaultParallelism = 16
	// chunkSize pages the pod list as kubectl does.
	chunkSize = 500
)

// Options configure one eviction pass over a node.
type Options struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// Node is the node to empty.
	Node string
	// GPUOnly evicts only the pods that use NVIDIA GPUs (nvidia.com/gpu* or nvidia.com/mig-* requests or limits, or
	// a resource claim allocated by gpu.nvidia.com); false drains every pod as `kubectl drain --ignore-daemonsets`
	// would.
	GPUOnly bool
	// PodSelector limits the pods considered (a label selector; empty: all).
	PodSelector string
	// Force also deletes pods no controller manages (and pods of a DaemonSet that is gone).
	Force bool
	// DeleteEmptyDirData also evicts pods with emptyDir volumes.
	DeleteEmptyDirData bool
	// Timeout bounds the whole pass (default DefaultTimeout).
	Timeout time.Duration
	// EvictErrorRetryDelay spaces retries of a refusal no watched PodDisruptionBudget explains.
	EvictErrorRetryDelay time.Duration
	// Parallelism bounds the eviction requests in flight.
	Parallelism int
	// Log receives progress; nil logs to Run's writer.
	Log *slog.Logger
}

// Complete fills defaults.
func (o *Options) Complete() {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.EvictErrorRetryDelay <= 0 {
		o.EvictErrorRetryDelay = DefaultEvictErrorRetryDelay
	}
	if o.Parallelism <= 0 {
		o.Parallelism = DefaultParallelism
	}
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	if o.Client == nil {
		return errors.New("no API client")
	}
	if o.Node == "" {
		return errors.New("no node name (NODE_NAME)")
	}
	if _, err := labels.Parse(o.PodSelector); err != nil {
		return fmt.Errorf("pod selector %q: %w", o.PodSelector, err)
	}
	return nil
}

// Result is what a pass removed.
type Result struct {
	// Pods are the pods evicted (namespace/name), gone from the node when Run returns.
	Pods []string
}

// Helper returns the kubectl drain helper Run lists pods and evicts with, configured as kubectl drain configures
// its own (grace period from the pod, DaemonSet pods ignored, retry delay set, writers set), except that in GPU
// mode the library's force and emptyDir checks are moved behind the GPU filter.
func (o *Options) Helper(ctx context.Context, out io.Writer) *drain.Helper {
	h := &drain.Helper{
		Ctx:                  ctx,
		Client:               retryingReads{o.Client, ctx},
		Force:                o.Force,
		GracePeriodSeconds:   -1,
		IgnoreAllDaemonSets:  true,
		Timeout:              o.Timeout,
		DeleteEmptyDirData:   o.DeleteEmptyDirData,
		PodSelector:          o.PodSelector,
		ChunkSize:            chunkSize,
		EvictErrorRetryDelay: o.EvictErrorRetryDelay,
		Out:                  out,
		ErrOut:               out,
	}
	if o.GPUOnly {
		users := &gpuUsers{ctx: ctx, checker: &gpupods.Checker{Client: o.Client}}
		h.Force, h.DeleteEmptyDirData = true, true
		h.AdditionalFilters = []drain.PodFilter{users.filter, policy(o.Force, o.DeleteEmptyDirData)}
	}
	return h
}

// Run evicts the selected pods of the node and returns once every one is gone, or fails naming the pods still
// there and what holds each (a PodDisruptionBudget, a slow termination) when Timeout passes.
func (o *Options) Run(ctx context.Context, out io.Writer) (Result, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(out, nil))
	}
	ctx, cancel := context.WithTimeoutCause(ctx, o.Timeout, errTimeout)
	defer cancel()
	h := o.Helper(ctx, out)
	list, errs := h.GetPodsForDeletion(o.Node)
	if len(errs) > 0 {
		return Result{}, fmt.Errorf("cannot empty node %s: %w", o.Node, utilerrors.NewAggregate(errs))
	}
	if w := list.Warnings(); w != "" {
		log.Info("pods left in place", "node", o.Node, "why", w)
	}
	pods := list.Pods()
	if len(pods) == 0 {
		return Result{}, nil
	}
	var gv schema.GroupVersion
	err := apiretry.Do(ctx, func(context.Context) error {
		var err error
		gv, err = drain.CheckEvictionSupport(o.Client)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("check eviction support: %w", err)
	}
	r := &run{o: o, h: h, gv: gv, log: log, targets: map[string]*target{}, results: make(chan result),
		retries: make(chan string), sem: make(chan struct{}, o.Parallelism)}
	return r.evict(ctx, pods)
}

var errTimeout = errors.New("timeout")

// A target is one pod to remove and where its eviction stands.
type target struct {
	pod   corev1.Pod
	state targetState
	// budgetRVs are the resource versions of the budgets selecting the pod when its eviction was last posted: a
	// refused pod is retried only once a budget has changed since and allows a disruption.
	budgetRVs map[string]string
	lastErr   error
	// failures counts the eviction requests in a row that failed with an error that may pass.
	failures int
}

type targetState int

const (
	posting    targetState = iota // eviction request in flight
	evicted                       // accepted; waiting for the pod to go
	refused                       // refused (429); waiting for a budget to allow it
	refusedNow                    // refused, no budget to watch; a timed retry is due
	failing                       // the request failed with an error that may pass; a retry with backoff is due
	gone
)

type result struct {
	key string
	err error
}

type run struct {
	o       *Options
	h       *drain.Helper
	gv      schema.GroupVersion
	log     *slog.Logger
	targets map[string]*target
	pods    *kwatch.Store[*corev1.Pod]
	budgets *kwatch.Store[*policyv1.PodDisruptionBudget]
	results chan result
	retries chan string
	sem     chan struct{}
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

func (r *run) evict(ctx context.Context, pods []corev1.Pod) (Result, error) {
	var err error
	// One watch on the node's pods confirms every deletion.
	if r.pods, err = kwatch.Start(ctx, kwatch.NodePods(r.o.Client, "", r.o.Node, ""), &corev1.Pod{}); err != nil {
		return Result{}, r.fail(err)
	}
	var res Result
	for _, p := range pods {
		t := &target{pod: p}
		r.targets[key(&p)] = t
		res.Pods = append(res.Pods, key(&p))
		r.post(ctx, t)
	}
	r.log.Info("evicting pods", "node", r.o.Node, "count", len(pods))
	var budgetsChanged <-chan struct{}
	for {
		if r.sweep() == 0 {
			return res, nil
		}
		select {
		case <-ctx.Done():
			return Result{}, r.fail(context.Cause(ctx))
		case <-r.pods.Changed():
		case <-budgetsChanged:
			r.retryAllowed(ctx)
		case k := <-r.retries:
			if t := r.targets[k]; t.state == refusedNow || t.state == failing {
				r.post(ctx, t)
			}
		case res := <-r.results:
			t := r.targets[res.key]
			switch err := res.err; {
			case err == nil:
				t.state, t.failures = evicted, 0
			case apierrors.IsNotFound(err):
				t.state = gone
			case apierrors.IsTooManyRequests(err):
				t.lastErr = err
				if r.budgets == nil {
					r.log.Info("eviction refused by a disruption budget; watching budgets", "pod", res.key)
					if r.budgets, err = kwatch.Start(ctx, kwatch.PDBs(r.o.Client), &policyv1.PodDisruptionBudget{}); err != nil {
						return Result{}, r.fail(err)
					}
					budgetsChanged = r.budgets.Changed()
				}
				r.refuse(ctx, t)
			case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
				t.state = evicted // its namespace is being deleted, which removes the pod
			case apiretry.Transient(err):
				// etcd timing out, the API server restarting: retried with backoff until the pass's timeout
				t.state, t.lastErr = failing, err
				r.log.Info("eviction failed; retrying", "pod", res.key, "err", err)
				r.retryAfter(ctx, t, apiretry.Delay(t.failures))
				t.failures++
			default:
				return Result{}, fmt.Errorf("evict pod %s from node %s: %w", res.key, r.o.Node, err)
			}
		}
	}
}

// post sends the pod's eviction in the background, bounded by Parallelism.
func (r *run) post(ctx context.Context, t *target) {
	t.state = posting
	t.budgetRVs = map[string]string{}
	for _, b := range r.selecting(&t.pod) {
		t.budgetRVs[b.Namespace+"/"+b.Name] = b.ResourceVersion
	}
	pod, k := t.pod, key(&t.pod)
	go func() {
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var err error
		if r.gv.Empty() {
			err = r.h.DeletePod(pod) // no Eviction API on this server: delete, as the library does
		} else {
			err = r.h.EvictPod(pod, r.gv)
		}
		<-r.sem
		select {
		case r.results <- result{k, err}:
		case <-ctx.Done():
		}
	}()
}

// refuse parks a refused pod: retried when a budget selecting it allows a disruption, or after the retry delay
// when no budget selects it (the refusal came from elsewhere, e.g. the server's rate limits).
func (r *run) refuse(ctx context.Context, t *target) {
	if len(r.selecting(&t.pod)) == 0 {
		t.state = refusedNow
		r.retryAfter(ctx, t, r.o.EvictErrorRetryDelay)
		return
	}
	t.state = refused
	if r.allowed(t) {
		r.post(ctx, t) // a budget changed while the request was in flight
	}
}

// retryAfter sends the target back to the loop for a new request after delay.
func (r *run) retryAfter(ctx context.Context, t *target, delay time.Duration) {
	k := key(&t.pod)
	go func() {
		select {
		case <-time.After(delay):
			select {
			case r.retries <- k:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
}

func (r *run) retryAllowed(ctx context.Context) {
	for _, t := range r.targets {
		if t.state == refused && r.allowed(t) {
			r.post(ctx, t)
		}
	}
}

// allowed: a budget selecting the pod allows a disruption and has changed since the refused request was sent.
func (r *run) allowed(t *target) bool {
	for _, b := range r.selecting(&t.pod) {
		if b.Status.DisruptionsAllowed > 0 && t.budgetRVs[b.Namespace+"/"+b.Name] != b.ResourceVersion {
			return true
		}
	}
	return false
}

// selecting returns the watched budgets whose selector matches the pod.
func (r *run) selecting(pod *corev1.Pod) []*policyv1.PodDisruptionBudget {
	if r.budgets == nil {
		return nil
	}
	var out []*policyv1.PodDisruptionBudget
	for _, b := range r.budgets.List() {
		if b.Namespace != pod.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector) // nil selects nothing, {} everything (policy/v1)
		if err == nil && sel.Matches(labels.Set(pod.Labels)) {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b *policyv1.PodDisruptionBudget) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// sweep marks the targets the watch no longer shows (or shows as a new pod under the same name, or as ended) as
// gone, and returns how many are left.
func (r *run) sweep() int {
	left := 0
	for _, t := range r.targets {
		if t.state == gone {
			continue
		}
		// a pod whose containers all ended (a finalizer may hold the object for long) no longer uses the GPU; a
		// process it left behind is the unload's to find
		if p, ok := r.pods.Get(t.pod.Namespace, t.pod.Name); !ok || p.UID != t.pod.UID ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			t.state = gone
			continue
		}
		left++
	}
	return left
}

// StuckPod is a pod still on the node when the pass gave up, and why.
type StuckPod struct {
	// Pod is namespace/name.
	Pod string
	// Budgets are the PodDisruptionBudgets refusing its eviction (namespace/name).
	Budgets []string
	// Reason says what holds it.
	Reason string
}

// StuckError is a pass that ended before every pod was gone.
type StuckError struct {
	Node  string
	Pods  []StuckPod
	Cause error
}

// Error names each pod left and what holds it.
func (e *StuckError) Error() string {
	parts := make([]string, 0, len(e.Pods))
	for _, p := range e.Pods {
		parts = append(parts, fmt.Sprintf("pod %s: %s", p.Pod, p.Reason))
	}
	return fmt.Sprintf("%d pods still on node %s (%v): %s", len(e.Pods), e.Node, e.Cause, strings.Join(parts, "; "))
}

// Unwrap returns why the pass ended (context.DeadlineExceeded for the timeout).
func (e *StuckError) Unwrap() error { return e.Cause }

func (r *run) fail(cause error) error {
	if errors.Is(cause, errTimeout) {
		cause = fmt.Errorf("timed out after %s: %w", r.o.Timeout, context.DeadlineExceeded)
	}
	if r.pods == nil {
		return fmt.Errorf("watch pods on node %s: %w", r.o.Node, cause)
	}
	r.sweep()
	e := &StuckError{Node: r.o.Node, Cause: cause}
	for _, k := range slices.Sorted(maps.Keys(r.targets)) {
		t := r.targets[k]
		if t.state == gone {
			continue
		}
		sp := StuckPod{Pod: k}
		switch t.state {
		case refused, refusedNow:
			bs := r.selecting(&t.pod)
			if len(bs) == 0 {
				sp.Reason = fmt.Sprintf("eviction refused: %v", t.lastErr)
			}
			var why []string
			for _, b := range bs {
				sp.Budgets = append(sp.Budgets, b.Namespace+"/"+b.Name)
				why = append(why, fmt.Sprintf("PodDisruptionBudget %s/%s (disruptionsAllowed %d, %d healthy of %d desired)",
					b.Namespace, b.Name, b.Status.DisruptionsAllowed, b.Status.CurrentHealthy, b.Status.DesiredHealthy))
			}
			if len(why) > 0 {
				sp.Reason = "eviction refused by " + strings.Join(why, ", ") +
					": let the budget allow a disruption (more replicas elsewhere, a lower minAvailable) or move the pod"
			}
		case failing:
			sp.Reason = fmt.Sprintf("eviction failed %d times in a row, the last with: %v", t.failures, t.lastErr)
		case evicted:
			sp.Reason = "evicted, still terminating"
			if p, ok := r.pods.Get(t.pod.Namespace, t.pod.Name); ok && p.DeletionTimestamp != nil {
				sp.Reason += fmt.Sprintf(" (deleted at %s, grace period %ds)", p.DeletionTimestamp.UTC().Format(time.RFC3339), ptrOr(p.DeletionGracePeriodSeconds))
			}
		default:
			sp.Reason = "eviction request did not complete"
		}
		e.Pods = append(e.Pods, sp)
	}
	return e
}

func ptrOr(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
