package drivermanager

import (
	"context"
	"errors"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
)

// templateWatch follows a driver DaemonSet's pod template at the cost of its template changes, not of its status
// writes. Every node's gate follows its DaemonSet; a watch of the DaemonSet itself would bring each gate every status
// write of the DaemonSet controller, a few per node and rollout, so the traffic grew with the square of the pool
// (610 MB per 200-node rollout in tests/rolloutbench). The DaemonSet controller records each template it rolls
// out as a ControllerRevision (and raises that revision's number when a rollback brings a template back), so the
// gate watches the revisions and reads the DaemonSet again when one of them changes.
type templateWatch struct {
	namespace, name string
	changed         chan struct{}
	revs            *kwatch.Store[*appsv1.ControllerRevision] // nil when the DaemonSet was gone at the start

	read func(context.Context) (*appsv1.DaemonSet, error)

	mu  sync.Mutex
	ds  *appsv1.DaemonSet // nil once the DaemonSet is gone
	err error             // a read that retrying cannot fix
}

// watchTemplate reads the DaemonSet namespace/name, then follows it until ctx ends.
func watchTemplate(ctx context.Context, client kubernetes.Interface, namespace, name string) (*templateWatch, error) {
	w := &templateWatch{namespace: namespace, name: name, changed: make(chan struct{}, 1)}
	read := func(ctx context.Context) (*appsv1.DaemonSet, error) {
		ds, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSet, error) {
			return client.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		})
		if apierrors.IsNotFound(err) {
			return nil, nil // the DaemonSet is going (an uninstall)
		}
		return ds, err
	}
	w.read = read
	ds, err := read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the driver DaemonSet %s/%s: %w", namespace, name, err)
	}
	w.ds = ds
	if ds == nil {
		return w, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err == nil && ds.Spec.Selector == nil {
		err = errors.New("none") // the API server requires one
	}
	if err != nil {
		return nil, fmt.Errorf("the driver DaemonSet %s/%s's selector: %w", namespace, name, err)
	}
	if w.revs, err = kwatch.Start(ctx, kwatch.ControllerRevisions(client, namespace, sel.String()), &appsv1.ControllerRevision{}); err != nil {
		return nil, fmt.Errorf("watch the driver DaemonSet %s/%s's revisions: %w", namespace, name, err)
	}
	go func() {
		// the first change is the revisions' first list: one read more, so that a template changed between the read
		// above and that list is not missed
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.revs.Changed():
			}
			ds, err := read(ctx)
			if ctx.Err() != nil {
				return
			}
			w.mu.Lock()
			if err != nil {
				w.err = fmt.Errorf("read the driver DaemonSet %s/%s: %w", namespace, name, err)
			} else {
				w.ds, w.err = ds, nil
			}
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}()
	return w, nil
}

// Refresh reads the DaemonSet now, for a decision that must not rest on a watch that may lag; an error leaves the
// copy as it was.
func (w *templateWatch) Refresh(ctx context.Context) {
	if w.read == nil {
		return
	}
	ds, err := w.read(ctx)
	if err != nil {
		return
	}
	w.mu.Lock()
	w.ds = ds
	w.mu.Unlock()
}

// Get returns the DaemonSet as last read, and false once it is gone.
func (w *templateWatch) Get() (*appsv1.DaemonSet, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ds, w.ds != nil
}

// Changed receives a value after the DaemonSet was read again.
func (w *templateWatch) Changed() <-chan struct{} { return w.changed }

// Err returns the error of the revisions' watch or of the last read, nil when both are well.
func (w *templateWatch) Err() error {
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	if w.revs != nil && w.revs.Err() != nil {
		return w.revs.Err()
	}
	return err
}
