// Package kwatch keeps a live, watched copy of a set of API objects (one LIST, then one WATCH stream) and says
// when it changed, so the hooks wait on events instead of polling the API server.
package kwatch

import (
	"context"
	"fmt"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

// Store is a watched set of objects of type T.
type Store[T runtime.Object] struct {
	informer cache.SharedIndexInformer
	changed  chan struct{}
	src      *Source
	stop     context.CancelFunc

	mu     sync.Mutex
	last   error         // the latest list or watch error, for the message when the deadline passes
	failed chan struct{} // closed on the first error that retrying cannot fix (then err is set)
	err    error
}

// Start lists and watches src until ctx ends, and returns once the first list is in the store. An error that
// retrying cannot fix (forbidden, unauthorized, the resource not served, a bad request) ends it at once, naming
// src; other errors (server errors, throttling, a connection reset) are retried until ctx ends, and the last one
// is then named with the deadline.
func Start[T runtime.Object](ctx context.Context, src *Source, example T) (*Store[T], error) {
	ictx, stop := context.WithCancel(ctx)
	s := &Store[T]{
		informer: cache.NewSharedIndexInformer(src, example, 0, cache.Indexers{}),
		changed:  make(chan struct{}, 1),
		src:      src,
		stop:     stop,
		failed:   make(chan struct{}),
	}
	notify := func() {
		select { // coalesce: a reader re-reads the whole store anyway
		case s.changed <- struct{}{}:
		default:
		}
	}
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		stop()
		return nil, err
	}
	if err := s.informer.SetWatchErrorHandlerWithContext(s.watchError); err != nil {
		stop()
		return nil, err
	}
	go s.informer.RunWithContext(ictx)
	// the store's own signal, not cache.WaitForCacheSync's 100 ms polls: every watch a hook starts on a node's
	// driver change path would add up to a poll period to it
	// and the watch open: a fake clientset (no WatchList) replays at its watch what was added or changed since its
	// list, but not a deletion, and a caller that acts once Start returns (evicts, then waits for the pod to go)
	// would miss the deletion it caused.
	// With WatchList the watch is open before the store syncs; a LIST then WATCH pays one more round trip.
	synced, opened := s.informer.HasSyncedChecker().Done(), src.opened
	for (synced != nil || opened != nil) && ictx.Err() == nil && s.Err() == nil {
		select {
		case <-synced:
			synced = nil
		case <-opened:
			opened = nil
		case <-ictx.Done():
		case <-s.failed:
		}
	}
	if synced == nil && opened == nil {
		return s, nil
	}
	stop()
	if err := s.Err(); err != nil {
		return nil, err
	}
	if last := s.lastErr(); last != nil {
		return nil, fmt.Errorf("watch %s: not synced: %w (last error: %w)", src, context.Cause(ctx), last)
	}
	return nil, fmt.Errorf("watch %s: not synced: %w", src, context.Cause(ctx))
}

// watchError is the informer's watch error handler: it keeps the error for the caller, and stops the informer on
// one that retrying cannot fix.
func (s *Store[T]) watchError(ctx context.Context, r *cache.Reflector, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = err
	if !Permanent(err) {
		cache.DefaultWatchErrorHandler(ctx, r, err) // logged; the reflector retries with backoff
		return
	}
	if s.err == nil {
		s.err = fmt.Errorf("watch %s: %w", s.src, err)
		close(s.failed)
		s.stop()
	}
}

// Permanent reports whether a list or watch error will come back however often it is retried: the request is
// forbidden or unauthenticated, the resource is not served, or the request is malformed.
func Permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) ||
		apierrors.IsMethodNotSupported(err) || apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)
}

// Err returns the error that stopped the store, or nil while it is watching.
func (s *Store[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Store[T]) lastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Changed receives a value after one or more changes to the store.
func (s *Store[T]) Changed() <-chan struct{} { return s.changed }

// List returns the objects in the store.
func (s *Store[T]) List() []T {
	items := s.informer.GetStore().List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		out = append(out, o.(T))
	}
	return out
}

// Get returns the object with the given namespace and name.
func (s *Store[T]) Get(namespace, name string) (T, bool) {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	o, ok, _ := s.informer.GetStore().GetByKey(key)
	if !ok {
		var zero T
		return zero, false
	}
	return o.(T), true
}

// Until returns once cond holds for the store's objects (checked at once and after each change), cond fails,
// the watch fails for good (forbidden, say), or ctx ends.
func Until[T runtime.Object](ctx context.Context, s *Store[T], cond func([]T) (bool, error)) error {
	for {
		done, err := cond(s.List())
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-s.failed:
			return s.Err()
		case <-s.changed:
		}
	}
}

// UntilAll is Until over several stores at once: cond gets the objects of all of them (an object two stores hold,
// by namespace and name, once), checked at once and after a change to any; it returns when cond holds or fails, a
// store's watch fails for good, or ctx ends. Several narrow watches (each selected server-side) cost the API
// server less than one broad one that a client filters.
func UntilAll[T runtime.Object](ctx context.Context, stores []*Store[T], cond func([]T) (bool, error)) error {
	return UntilAllOr(ctx, stores, nil, cond)
}

// UntilAllOr is UntilAll that also checks cond after each value from one of also: the changes of stores of other
// types, whose objects cond reads itself.
func UntilAllOr[T runtime.Object](ctx context.Context, stores []*Store[T], also []<-chan struct{}, cond func([]T) (bool, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changed := make(chan struct{}, 1)
	failed := make(chan error, len(stores))
	for _, ch := range also {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-ch:
					select {
					case changed <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	for _, s := range stores {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-s.failed:
					failed <- s.Err()
					return
				case <-s.changed:
					select {
					case changed <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	for {
		var objs []T
		seen := map[string]bool{}
		for _, s := range stores {
			for _, o := range s.List() {
				key, err := cache.MetaNamespaceKeyFunc(o)
				if err == nil && seen[key] {
					continue
				}
				seen[key] = true
				objs = append(objs, o)
			}
		}
		done, err := cond(objs)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-failed:
			return err
		case <-changed:
		}
	}
}

// Source is a set of objects to list and watch, and what it is in words (resource, namespace, selectors) for
// error messages. It is a cache.ListerWatcher.
type Source struct {
	*cache.ListWatch
	what string
	// noWatchList: the client cannot stream the initial list in the watch (WatchList: one request instead of
	// LIST + WATCH); fake clientsets cannot, and the reflector asks.
	noWatchList bool
	// opened is closed once a watch of the source is open.
	opened   chan struct{}
	openOnce sync.Once
}

// IsWatchListSemanticsUnSupported tells the reflector whether the client can serve WatchList.
func (s *Source) IsWatchListSemanticsUnSupported() bool { return s.noWatchList }

// String names the resource, namespace and selectors.
func (s *Source) String() string { return s.what }

// source describes resource in namespace ("" for all; cluster is true for cluster-scoped resources) with the
// selectors, and lists and watches it through list and watch with those selectors set.
func source(client kubernetes.Interface, resource, namespace string, cluster bool, fieldSelector, labelSelector string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *Source {
	what := resource
	switch {
	case cluster:
	case namespace == "":
		what += " in all namespaces"
	default:
		what += fmt.Sprintf(" in namespace %q", namespace)
	}
	var sel []string
	for _, x := range []string{fieldSelector, labelSelector} {
		if x != "" {
			sel = append(sel, x)
		}
	}
	if len(sel) > 0 {
		what += " (" + strings.Join(sel, ", ") + ")"
	}
	src := &Source{what: what, noWatchList: watchlist.DoesClientNotSupportWatchListSemantics(client), opened: make(chan struct{})}
	src.ListWatch = &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector, o.LabelSelector = fieldSelector, labelSelector
			if o.ResourceVersion == "0" {
				// the reflector's first list (a streamed WatchList that failed falls back to it) asks for "any"
				// version, which the API server's watch cache may serve from before the caller's own last read:
				// a pod the caller just listed would be missing, and a caller waiting for it to go would take it
				// for gone. A consistent read costs one etcd-quorum list per store, only on this path.
				o.ResourceVersion = ""
			}
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.LabelSelector = fieldSelector, labelSelector
			w, err := watchFn(ctx, o)
			if err == nil {
				src.openOnce.Do(func() { close(src.opened) })
			}
			return w, err
		},
	}
	return src
}

// NodePods lists and watches the pods bound to node, in namespace ("" for all), matching labelSelector.
func NodePods(client kubernetes.Interface, namespace, node, labelSelector string) *Source {
	return Pods(client, namespace, fields.OneTermEqualSelector("spec.nodeName", node).String(), labelSelector)
}

// Pods lists and watches the pods in namespace ("" for all) matching the field and label selectors (either may be
// empty).
func Pods(client kubernetes.Interface, namespace, fieldSelector, labelSelector string) *Source {
	pods := client.CoreV1().Pods(namespace)
	return source(client, "pods", namespace, false, fieldSelector, labelSelector, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return pods.List(ctx, o)
	}, pods.Watch)
}

// Node lists and watches the one node named name.
func Node(client kubernetes.Interface, name string) *Source {
	nodes := client.CoreV1().Nodes()
	return source(client, "nodes", "", true, fields.OneTermEqualSelector("metadata.name", name).String(), "", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return nodes.List(ctx, o)
	}, nodes.Watch)
}

// Nodes lists and watches the nodes matching labelSelector.
func Nodes(client kubernetes.Interface, labelSelector string) *Source {
	nodes := client.CoreV1().Nodes()
	return source(client, "nodes", "", true, "", labelSelector, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return nodes.List(ctx, o)
	}, nodes.Watch)
}

// Lease lists and watches the one Lease named name in namespace.
func Lease(client kubernetes.Interface, namespace, name string) *Source {
	leases := client.CoordinationV1().Leases(namespace)
	return source(client, "leases.coordination.k8s.io", namespace, false, fields.OneTermEqualSelector("metadata.name", name).String(), "",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return leases.List(ctx, o) }, leases.Watch)
}

// PDBs lists and watches the PodDisruptionBudgets of every namespace.
func PDBs(client kubernetes.Interface) *Source {
	pdbs := client.PolicyV1().PodDisruptionBudgets("")
	return source(client, "poddisruptionbudgets.policy", "", false, "", "", func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return pdbs.List(ctx, o)
	}, pdbs.Watch)
}

// ControllerRevisions lists and watches the ControllerRevisions in namespace matching labelSelector: the templates
// a DaemonSet controller rolled out, which change with the template only, never with the DaemonSet's status.
func ControllerRevisions(client kubernetes.Interface, namespace, labelSelector string) *Source {
	revs := client.AppsV1().ControllerRevisions(namespace)
	return source(client, "controllerrevisions.apps", namespace, false, "", labelSelector,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return revs.List(ctx, o) }, revs.Watch)
}
