package gpudrain

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedappsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
)

// retryingReads is the client the drain library chooses pods with: its pod list and its DaemonSet lookups (one
// per DaemonSet pod on the node) retry errors that may pass until ctx's deadline. The library turns a lookup's
// error into a string nobody can classify afterwards, so the retry has to happen below it. Evictions and deletes
// pass through untouched: Run retries those itself.
type retryingReads struct {
	kubernetes.Interface
	ctx context.Context
}

func (c retryingReads) CoreV1() typedcorev1.CoreV1Interface {
	return retryingCore{c.Interface.CoreV1(), c.ctx}
}

func (c retryingReads) AppsV1() typedappsv1.AppsV1Interface {
	return retryingApps{c.Interface.AppsV1(), c.ctx}
}

type retryingCore struct {
	typedcorev1.CoreV1Interface
	ctx context.Context
}

func (c retryingCore) Pods(namespace string) typedcorev1.PodInterface {
	return retryingPods{c.CoreV1Interface.Pods(namespace), c.ctx}
}

type retryingPods struct {
	typedcorev1.PodInterface
	ctx context.Context
}

func (p retryingPods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	var list *corev1.PodList
	err := apiretry.Do(within(ctx, p.ctx), func(ctx context.Context) error {
		var err error
		list, err = p.PodInterface.List(ctx, opts)
		return err
	})
	return list, err
}

type retryingApps struct {
	typedappsv1.AppsV1Interface
	ctx context.Context
}

func (a retryingApps) DaemonSets(namespace string) typedappsv1.DaemonSetInterface {
	return retryingDaemonSets{a.AppsV1Interface.DaemonSets(namespace), a.ctx}
}

type retryingDaemonSets struct {
	typedappsv1.DaemonSetInterface
	ctx context.Context
}

func (d retryingDaemonSets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*appsv1.DaemonSet, error) {
	var ds *appsv1.DaemonSet
	err := apiretry.Do(within(ctx, d.ctx), func(ctx context.Context) error {
		var err error
		ds, err = d.DaemonSetInterface.Get(ctx, name, opts)
		return err
	})
	return ds, err
}

// within is the library's context when it has a deadline, else the pass's (the library passes context.TODO in
// places).
func within(call, pass context.Context) context.Context {
	if _, ok := call.Deadline(); ok {
		return call
	}
	return pass
}
