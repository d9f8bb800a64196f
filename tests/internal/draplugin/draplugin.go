// Package draplugin plays NVIDIA's gpus DRA kubelet plugin on simulated nodes: it publishes a node's ResourceSlice
// while the chart's kubelet-plugin pod runs there, and removes it when the pod goes, as the kubelet does.
package draplugin

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const (
	// GPUDriver is the DRA driver of NVIDIA GPUs; the gpu.nvidia.com DeviceClass selects its devices of type gpu.
	GPUDriver = "gpu.nvidia.com"
	// PluginSelector selects the chart's DRA kubelet-plugin pods (the name the reference driver manager waits on).
	PluginSelector = "app=nvidia-dra-driver-kubelet-plugin"
	// GPUsPerNode is how many GPU devices each node's slice publishes.
	GPUsPerNode = 4
)

// SliceName is the one ResourceSlice of a node's pool (pool = node name, as the gpus plugin names it).
func SliceName(node string) string { return node + "-" + GPUDriver }

// gpuSlice is what the gpus kubelet plugin publishes for a node: one pool named after the node, its GPUs with the
// attributes the DeviceClasses' CEL selectors read (type) and those workloads select on (uuid, productName, ...).
func gpuSlice(node *corev1.Node) *resourcev1.ResourceSlice {
	product := node.Labels["nvidia.com/gpu.product"]
	var devices []resourcev1.Device
	for i := range GPUsPerNode {
		devices = append(devices, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":          {StringValue: ptr.To("gpu")},
				"uuid":          {StringValue: ptr.To(fmt.Sprintf("GPU-%s-%d", node.Name, i))},
				"productName":   {StringValue: ptr.To(product)},
				"index":         {IntValue: ptr.To(int64(i))},
				"driverVersion": {VersionValue: ptr.To("580.95.5")},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: resource.MustParse("48Gi")},
			},
		})
	}
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: SliceName(node.Name),
			// the kubelet plugin library owns a node's slices by its Node
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
		},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   GPUDriver,
			Pool:     resourcev1.ResourcePool{Name: node.Name, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node.Name),
			Devices:  devices,
		},
	}
}

// Play plays the gpus kubelet plugin and the kubelet's cleanup of it until ctx ends: a node with a Running
// kubelet-plugin pod gets its slice; a node without one loses it (the kubelet deletes a driver's slices once its
// plugin has unregistered). It watches the plugin's pods and the slices and reconciles on each change, as the
// kubelet reacts to its own pods, instead of listing both on a timer: a package plays it on every control plane for
// its whole run, and polling was a sixth of the requests of tests/e2e. A reconcile that fails is retried after
// retryAfter; each error is reported on errs, without blocking.
func Play(ctx context.Context, client kubernetes.Interface, namespace string, errs chan<- error) {
	pluginPods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = PluginSelector }))
	resourceSlices := informers.NewSharedInformerFactory(client, 0)
	pods, published := pluginPods.Core().V1().Pods(), resourceSlices.Resource().V1().ResourceSlices()
	changed := make(chan struct{}, 1)
	kick := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	onChange := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), published.Informer()} {
		if _, err := inf.AddEventHandler(onChange); err != nil {
			select {
			case errs <- err:
			default:
			}
			return
		}
	}
	pluginPods.Start(ctx.Done())
	resourceSlices.Start(ctx.Done())
	defer pluginPods.Shutdown()
	defer resourceSlices.Shutdown()
	pluginPods.WaitForCacheSync(ctx.Done())
	resourceSlices.WaitForCacheSync(ctx.Done())
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		if err := reconcileSlices(ctx, client, pods.Lister().Pods(namespace), published.Lister()); err != nil && ctx.Err() == nil {
			select {
			case errs <- err:
			default:
			}
			time.AfterFunc(retryAfter, kick)
		}
	}
}

// retryAfter is how soon a failed reconcile is tried again.
const retryAfter = 200 * time.Millisecond

// reconcileSlices makes the slices match the plugin pods as the informers hold them. A read that lags a write of
// ours is harmless: creating a slice that exists and deleting one that is gone are both accepted, and the write's
// own watch event reconciles again.
func reconcileSlices(ctx context.Context, client kubernetes.Interface, pods corelisters.PodNamespaceLister, sliceLister resourcelisters.ResourceSliceLister) error {
	plugins, err := pods.List(labels.Everything())
	if err != nil {
		return err
	}
	serving := map[string]bool{}
	for _, p := range plugins {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			serving[p.Spec.NodeName] = true
		}
	}
	have, err := sliceLister.List(labels.Everything())
	if err != nil {
		return err
	}
	published := map[string]bool{}
	for _, s := range have {
		if s.Spec.Driver != GPUDriver || s.Spec.NodeName == nil {
			continue
		}
		if !serving[*s.Spec.NodeName] {
			if err := client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			continue
		}
		published[*s.Spec.NodeName] = true
	}
	for n := range serving {
		if published[n] {
			continue
		}
		node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, gpuSlice(node), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// SlicedNodes are the nodes with a gpu.nvidia.com slice now.
func SlicedNodes(ctx context.Context, client kubernetes.Interface) ([]string, error) {
	have, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range have.Items {
		if s.Spec.Driver == GPUDriver && s.Spec.NodeName != nil {
			out = append(out, *s.Spec.NodeName)
		}
	}
	slices.Sort(out)
	return out, nil
}
