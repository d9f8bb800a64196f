package releasecheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

// Options configure Run.
type Options struct {
	Client kubernetes.Interface
	// Namespace and Release name the release whose DaemonSets (label app.kubernetes.io/instance) are checked.
	Namespace, Release string
	// Timeout is the deadline; it must stay below the Helm/Flux timeout so the hook, not Helm, says what failed.
	Timeout time.Duration
	// ReportConfigMap, when set, receives the final report.
	ReportConfigMap string
	// Pools are the driver pools (from the chart), for the coverage checks; none skips them.
	Pools []driverpools.Pool
	// Once evaluates the current state without waiting (the admin's live status).
	Once bool
	// ResourceSlices watches the ResourceSlices of driver gpu.nvidia.com, so that a DRA node waits until its GPUs
	// are published (list/watch on resource.k8s.io resourceslices, which the chart grants when it deploys the DRA
	// driver; off, the report shows DRA nodes' mode without their slices).
	ResourceSlices bool
	// ProgressEvery paces the progress lines while Run waits: at most one per interval (DefaultProgressEvery when
	// zero), and one at once whenever the failed count changes.
	ProgressEvery time.Duration
	// EvaluateEvery is the shortest time between two evaluations while changes keep coming (DefaultEvaluateEvery
	// when zero).
	EvaluateEvery time.Duration
	// Seen, when set, is given each snapshot Run evaluates, from its caches (objects slimmed: see slim), so that a
	// caller reads what else it needs of the same nodes and pods without listing them again.
	Seen func(Snapshot)
}

// DefaultEvaluateEvery paces Run's evaluations. Each one walks every node against every DaemonSet and its pods, and
// a driver rollout's batch changes nodes and pods many times a second: evaluated on each change, a 200-node
// rollout kept the hook on a core (49 s of CPU in 6 minutes, half of the simulated fleet's in the rollout
// benchmark). Paced, a change is seen within a second, and the changes of that second in one evaluation.
const DefaultEvaluateEvery = time.Second

// Complete fills defaults.
func (o *Options) Complete() {
	if o.Timeout <= 0 {
		o.Timeout = 4 * time.Minute
	}
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	switch {
	case o.Client == nil:
		return errors.New("no Kubernetes client")
	case o.Namespace == "" || o.Release == "":
		return errors.New("name the release and its namespace (--release, --namespace)")
	}
	return nil
}

// ErrFailed is returned (wrapped) when the stack is not working.
var ErrFailed = errors.New("the GPU stack is not working")

// Run watches the release's DaemonSets, their pods and revisions, the nodes, FailedCreate events and, with
// ResourceSlices, the gpu.nvidia.com ResourceSlices, evaluates the report on every change, and returns when nothing
// is waiting any more or at the deadline. It prints a progress line when the counts change (paced by
// ProgressEvery), then the final table; the error is non-nil unless everything passed.
func Run(ctx context.Context, o Options, out io.Writer) (*Report, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	release := informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = labels.Set{"app.kubernetes.io/instance": o.Release}.String()
	})
	nsFactory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace))
	relFactory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace), release)
	eventFactory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = "involvedObject.kind=DaemonSet,reason=FailedCreate"
		}))
	clusterFactory := informers.NewSharedInformerFactory(o.Client, 0)

	nodes := clusterFactory.Core().V1().Nodes()
	pods := nsFactory.Core().V1().Pods()
	dss := relFactory.Apps().V1().DaemonSets()
	revs := relFactory.Apps().V1().ControllerRevisions()
	events := eventFactory.Core().V1().Events()

	changed := make(chan struct{}, 1)
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(changed) },
		UpdateFunc: func(any, any) { poke(changed) },
		DeleteFunc: func(any) { poke(changed) },
	}
	watched := []cache.SharedIndexInformer{nodes.Informer(), pods.Informer(), dss.Informer(), revs.Informer(), events.Informer()}
	factories := []informers.SharedInformerFactory{nsFactory, relFactory, eventFactory, clusterFactory}
	var slicesLister func() ([]*resourcev1.ResourceSlice, error)
	if o.ResourceSlices {
		sliceFactory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = "spec.driver=" + gpupods.DRADriver
		}))
		rs := sliceFactory.Resource().V1().ResourceSlices()
		watched = append(watched, rs.Informer())
		factories = append(factories, sliceFactory)
		slicesLister = func() ([]*resourcev1.ResourceSlice, error) { return rs.Lister().List(labels.Everything()) }
	}
	for _, inf := range watched {
		if err := inf.SetTransform(slim); err != nil {
			return nil, err
		}
		if _, err := inf.AddEventHandler(notify); err != nil {
			return nil, err
		}
	}
	stop := make(chan struct{})
	defer func() {
		close(stop) // the informers must stop before Shutdown waits for them
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	for _, f := range factories {
		f.Start(stop)
	}
	for _, f := range factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return nil, fmt.Errorf("watch %v in %s: not synced before the deadline", typ, o.Namespace)
			}
		}
	}

	snapshot := func() (*Report, error) {
		var s Snapshot
		var err error
		if s.Nodes, err = nodes.Lister().List(labels.Everything()); err != nil {
			return nil, err
		}
		if s.Pods, err = pods.Lister().List(labels.Everything()); err != nil {
			return nil, err
		}
		if s.DaemonSets, err = dss.Lister().List(labels.Everything()); err != nil {
			return nil, err
		}
		if s.Events, err = events.Lister().List(labels.Everything()); err != nil {
			return nil, err
		}
		rs, err := revs.Lister().List(labels.Everything())
		if err != nil {
			return nil, err
		}
		s.Revisions = currentRevisions(rs)
		if slicesLister != nil {
			s.WatchSlices = true
			if s.ResourceSlices, err = slicesLister(); err != nil {
				return nil, err
			}
		}
		if o.Seen != nil {
			o.Seen(s)
		}
		r, err := evaluate(o.Release, o.Namespace, o.Pools, s)
		if r != nil {
			r.Elapsed = time.Since(start).Round(time.Millisecond).String()
		}
		return r, err
	}

	var r *Report
	lines := progress{out: out, every: cmp.Or(o.ProgressEvery, DefaultProgressEvery)}
	every := cmp.Or(o.EvaluateEvery, DefaultEvaluateEvery)
watch:
	for {
		var err error
		if r, err = snapshot(); err != nil {
			return nil, err
		}
		evaluated := time.Now()
		if o.Once || r.Settled() {
			break
		}
		var due <-chan time.Time // a progress line held back by the interval
		if wait := lines.see(r, time.Now()); wait > 0 {
			due = time.After(wait)
		}
		select {
		case <-changed:
			// the rest of the interval takes in what else changes meanwhile; a deadline ends the wait, and the
			// next turn of the loop reports it
			select {
			case <-time.After(time.Until(evaluated.Add(every))):
			case <-ctx.Done():
			}
		case <-due:
		case <-ctx.Done():
			if r, err = snapshot(); err != nil {
				return nil, err
			}
			if !r.Settled() {
				r.Expire(o.Timeout)
			}
			break watch
		}
	}
	r.WriteTable(out)
	if o.ReportConfigMap != "" {
		// the deadline may have passed; the report must still be written
		wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer wcancel()
		if err := SaveConfigMap(wctx, o.Client, o.ReportConfigMap, r, o.Pools); err != nil {
			return r, err
		}
	}
	if !r.Passed() {
		if o.Once && !r.Settled() {
			return r, nil
		}
		return r, fmt.Errorf("%w: %d failed, %d waiting (see the table above)", ErrFailed, r.Summary[Failed], r.Summary[Waiting])
	}
	return r, nil
}

// evaluate is Evaluate; tests count its calls.
var evaluate = Evaluate

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// currentRevisions maps each DaemonSet to the hash of its newest ControllerRevision, which the DaemonSet controller
// stamps on up-to-date pods.
func currentRevisions(rs []*appsv1.ControllerRevision) map[types.UID]string {
	newest := map[types.UID]*appsv1.ControllerRevision{}
	for _, r := range rs {
		for _, ref := range r.OwnerReferences {
			if ref.Kind == "DaemonSet" && ref.Controller != nil && *ref.Controller {
				if cur := newest[ref.UID]; cur == nil || r.Revision > cur.Revision {
					newest[ref.UID] = r
				}
			}
		}
	}
	out := map[types.UID]string{}
	for uid, r := range newest {
		out[uid] = r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
	}
	return out
}
