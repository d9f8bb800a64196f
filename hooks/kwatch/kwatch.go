// Package kwatch keeps a live, watched copy of a set of API objects (one LIST, then one WATCH stream) and says
// when it changed, so the hooks wait on events instead of polling the API server.
package kwatch

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Store is a watched set of objects of type T.
type Store[T runtime.Object] struct {
	informer cache.SharedIndexInformer
	changed  chan struct{}
}

// Start lists and watches lw until ctx ends, and returns once the first list is in the store.
func Start[T runtime.Object](ctx context.Context, lw cache.ListerWatcher, example T) (*Store[T], error) {
	s := &Store[T]{
		informer: cache.NewSharedIndexInformer(lw, example, 0, cache.Indexers{}),
		changed:  make(chan struct{}, 1),
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
		return nil, err
	}
	go s.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return nil, fmt.Errorf("watch %T: %w", example, context.Cause(ctx))
	}
	return s, nil
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
// or ctx ends.
func Until[T runtime.Object](ctx context.Context, s *Store[T], cond func([]T) (bool, error)) error {
	for {
		done, err := cond(s.List())
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-s.changed:
		}
	}
}

// NodePods lists and watches the pods bound to node, in namespace ("" for all), matching labelSelector.
func NodePods(client kubernetes.Interface, namespace, node, labelSelector string) cache.ListerWatcher {
	return Pods(client, namespace, fields.OneTermEqualSelector("spec.nodeName", node).String(), labelSelector)
}

// Pods lists and watches the pods in namespace ("" for all) matching the field and label selectors (either may be
// empty).
func Pods(client kubernetes.Interface, namespace, fieldSelector, labelSelector string) cache.ListerWatcher {
	// The wrapper tells the reflector whether the client can stream the initial list in the watch (WatchList: one
	// request instead of LIST + WATCH); fake clientsets cannot.
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector, o.LabelSelector = fieldSelector, labelSelector
			return client.CoreV1().Pods(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.LabelSelector = fieldSelector, labelSelector
			return client.CoreV1().Pods(namespace).Watch(ctx, o)
		},
	}, client)
}

// Node lists and watches the one node named name.
func Node(client kubernetes.Interface, name string) cache.ListerWatcher {
	field := fields.OneTermEqualSelector("metadata.name", name).String()
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = field
			return client.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = field
			return client.CoreV1().Nodes().Watch(ctx, o)
		},
	}, client)
}

// PDBs lists and watches the PodDisruptionBudgets of every namespace.
func PDBs(client kubernetes.Interface) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.PolicyV1().PodDisruptionBudgets("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.PolicyV1().PodDisruptionBudgets("").Watch(ctx, o)
		},
	}, client)
}
