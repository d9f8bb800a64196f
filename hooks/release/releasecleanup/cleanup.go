// Package releasecleanup is the pre-delete hook: it removes what the release put on nodes (paused operand
// switches, upgrade state, the stack's own cordons, pre-installed marks it made, every kube-gpu-stack.io/
// annotation) and the objects Helm never deletes because hooks created them, so `helm uninstall` leaves nodes as
// they were before install. It touches nothing the stack did not write.
//
// It first removes the release's operand DaemonSets and waits for their pods to go: Helm would delete them right
// after anyway, and while they run a validator or driver manager could write its marks again behind the cleanup
// (restoring a paused switch brings that operand's pod straight back).
package releasecleanup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// kinds are the objects the chart's hooks create and may name for deletion.
var kinds = map[string]struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}{
	"job":                {schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, true},
	"pod":                {schema.GroupVersionResource{Version: "v1", Resource: "pods"}, true},
	"serviceaccount":     {schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
	"configmap":          {schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, true},
	"role":               {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
	"rolebinding":        {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
	"clusterrole":        {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
	"clusterrolebinding": {schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
	"nodefeaturerule":    {schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeaturerules"}, false},
	// the release's cluster-scoped objects of any revision (kube-gpu-stack.clusterObjects)
	"deviceclass":                      {schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "deviceclasses"}, false},
	"runtimeclass":                     {schema.GroupVersionResource{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses"}, false},
	"validatingadmissionpolicy":        {schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}, false},
	"validatingadmissionpolicybinding": {schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}, false},
}

// swept are the namespaced kinds Sweep deletes of the release, in the release namespace.
var swept = []schema.GroupVersionResource{
	{Version: "v1", Resource: "serviceaccounts"},
	{Version: "v1", Resource: "configmaps"},
	{Version: "v1", Resource: "services"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"},
	{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"},
}

// Object is a KIND/NAME to delete.
type Object struct{ Kind, Name string }

// ParseObject reads KIND/NAME.
func ParseObject(s string) (Object, error) {
	kind, name, ok := strings.Cut(s, "/")
	kind = strings.ToLower(kind)
	if _, known := kinds[kind]; !ok || !known || name == "" {
		return Object{}, fmt.Errorf("--delete %q: want KIND/NAME with KIND one of %s", s, strings.Join(slices.Sorted(maps.Keys(kinds)), ", "))
	}
	return Object{kind, name}, nil
}

// Options configure Run.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is the release namespace (namespaced objects to delete live there).
	Namespace string
	// Release names the release whose operand DaemonSets are stopped first (label app.kubernetes.io/instance).
	Release string
	// OperandTimeout bounds the wait for the operand pods to go.
	OperandTimeout time.Duration
	// Delete names the objects to remove: the hooks' (Helm never deletes them) and the release's cluster-scoped
	// objects of any revision.
	Delete []Object
	// Sweep, last, deletes the release's objects of the swept kinds left in the namespace: Helm uninstalls the last
	// revision's manifest only, and a refused upgrade's revision is the last, so an earlier revision's objects that
	// it does not render would stay. Only objects Helm owns for this release (meta.helm.sh/release-name and
	// -namespace), labelled with it, neither hooks nor kept (helm.sh/resource-policy: keep).
	Sweep bool
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	switch {
	case o.Client == nil || (o.Dynamic == nil && (len(o.Delete) > 0 || o.Sweep)):
		return errors.New("no Kubernetes client")
	case o.Namespace == "" || o.Release == "":
		return errors.New("name the release and its namespace (--release, --namespace)")
	}
	if o.OperandTimeout <= 0 {
		o.OperandTimeout = time.Minute
	}
	return nil
}

// stopOperands deletes the release's DaemonSets and watches until no pod of them is left.
func stopOperands(ctx context.Context, o Options, out io.Writer) error {
	sel := labels.Set{"app.kubernetes.io/instance": o.Release}.String()
	background := metav1.DeletePropagationBackground
	err := o.Client.AppsV1().DaemonSets(o.Namespace).DeleteCollection(ctx,
		metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("delete the release's DaemonSets: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, o.OperandTimeout)
	defer cancel()
	pods, err := kwatch.Start(wctx, kwatch.Pods(o.Client, o.Namespace, "", sel), &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("watch the release's pods: %w", err)
	}
	var left []string
	err = kwatch.Until(wctx, pods, func(ps []*corev1.Pod) (bool, error) {
		left = left[:0]
		for _, p := range ps {
			if ownedByDaemonSet(p) {
				left = append(left, p.Name)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("operand pods still running after %s: %v: %w", o.OperandTimeout, left, err)
	}
	fmt.Fprintln(out, "operand DaemonSets removed and their pods gone")
	return nil
}

func ownedByDaemonSet(p *corev1.Pod) bool {
	for _, ref := range p.OwnerReferences {
		if ref.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// deleteLeases removes the driver managers' per-node Leases from the release namespace (after stopOperands, so no
// manager takes one again) and returns how many it deleted.
func deleteLeases(ctx context.Context, o Options) (int, error) {
	leases := o.Client.CoordinationV1().Leases(o.Namespace)
	var list *coordinationv1.LeaseList
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		list, err = leases.List(ctx, metav1.ListOptions{LabelSelector: nodestate.DriverManagerLeaseLabel + "=true"})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("list the driver managers' leases: %w", err)
	}
	deleted := 0
	var errs []error
	for _, l := range list.Items {
		err := apiretry.Do(ctx, func(ctx context.Context) error { return leases.Delete(ctx, l.Name, metav1.DeleteOptions{}) })
		switch {
		case err == nil:
			deleted++
		case !apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("delete lease %s: %w", l.Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// Run cleans every node, removes the driver managers' Leases, then deletes the named objects (absent ones are fine: a rerun converges). It reports one
// line per node it changed and a summary line.
func Run(ctx context.Context, o Options, out io.Writer) error {
	if err := stopOperands(ctx, o, out); err != nil {
		return err
	}
	var nodes *corev1.NodeList
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		var err error
		nodes, err = o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var errs []error
	changed := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		// computed again from a fresh read at the write (an admin may have changed a switch since the list)
		var p nodestate.Patch
		if _, err := nodestate.Update(ctx, o.Client, n.Name, func(n *corev1.Node) (nodestate.Patch, error) {
			var err error
			p, err = nodestate.Cleanup(n)
			return p, err
		}); err != nil {
			errs = append(errs, err)
			continue
		}
		if p.Empty() {
			continue
		}
		changed++
		fmt.Fprintf(out, "node %s: removed the stack's marks: %s\n", n.Name, p.JSON())
	}
	leases, err := deleteLeases(ctx, o)
	if err != nil {
		errs = append(errs, err)
	}
	deleted := 0
	background := metav1.DeletePropagationBackground
	for _, obj := range o.Delete {
		k := kinds[obj.Kind]
		var res dynamic.ResourceInterface = o.Dynamic.Resource(k.gvr)
		if k.namespaced {
			res = o.Dynamic.Resource(k.gvr).Namespace(o.Namespace)
		}
		err := res.Delete(ctx, obj.Name, metav1.DeleteOptions{PropagationPolicy: &background})
		switch {
		case err == nil:
			deleted++
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		default:
			errs = append(errs, fmt.Errorf("delete %s/%s: %w", obj.Kind, obj.Name, err))
		}
	}
	sweptN := 0
	if o.Sweep {
		n, err := sweep(ctx, o)
		sweptN = n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup incomplete (rerun `helm uninstall` once fixed): %w", err)
	}
	fmt.Fprintf(out, "cleanup: %d of %d nodes changed, %d named objects, %d objects of earlier revisions and %d driver-manager leases deleted\n",
		changed, len(nodes.Items), deleted, sweptN, leases)
	return nil
}

// sweep deletes the release's objects of the swept kinds in the namespace (Options.Sweep) and returns how many.
func sweep(ctx context.Context, o Options) (int, error) {
	sel := labels.Set{"app.kubernetes.io/instance": o.Release}.String()
	deleted := 0
	var errs []error
	for _, gvr := range swept {
		res := o.Dynamic.Resource(gvr).Namespace(o.Namespace)
		var list *unstructured.UnstructuredList
		err := apiretry.Do(ctx, func(ctx context.Context) error {
			var err error
			list, err = res.List(ctx, metav1.ListOptions{LabelSelector: sel})
			return err
		})
		switch {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			continue // the API is not served (no Prometheus operator)
		case err != nil:
			errs = append(errs, fmt.Errorf("list %s: %w", gvr.Resource, err))
			continue
		}
		for _, obj := range list.Items {
			ann := obj.GetAnnotations()
			if ann["helm.sh/hook"] != "" || ann["helm.sh/resource-policy"] == "keep" ||
				ann["meta.helm.sh/release-name"] != o.Release || ann["meta.helm.sh/release-namespace"] != o.Namespace {
				continue
			}
			err := apiretry.Do(ctx, func(ctx context.Context) error { return res.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}) })
			switch {
			case err == nil:
				deleted++
			case !apierrors.IsNotFound(err):
				errs = append(errs, fmt.Errorf("delete %s %s: %w", gvr.Resource, obj.GetName(), err))
			}
		}
	}
	return deleted, errors.Join(errs...)
}
