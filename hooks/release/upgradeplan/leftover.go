package upgradeplan

import (
	"context"
	"fmt"
	"io"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/revertset"
)

// leftOver finds the driver and vGPU manager DaemonSets of the release that no pool of this release renders. Helm
// prunes only what the last deployed release named: a pool renamed by an upgrade that failed, then renamed again by
// another that failed too, leaves the failed revisions' DaemonSet behind, and its pods meet the pool's own on every
// node of the pool, each waiting for the other to stop. One counts only once the DaemonSet this release gives each of
// its nodes exists: a pool this release renames still has the last deployed release's DaemonSet, which Helm deletes
// after it creates the new one (deleted first, its pods' gates would find no DaemonSet to empty their nodes for, and
// the old drivers would stop under their GPU pods). podsOf maps a DaemonSet to the nodes its pods run on, targetOf a
// node to the DaemonSet this release gives it.
// Only the kinds given are looked at: a DaemonSet of a kind whose pools the caller does not know is never taken for
// left over.
func leftOver(ctx context.Context, o Options, podsOf map[string][]string, targetOf map[string]string, kinds []string) ([]string, error) {
	component, err := labels.NewRequirement("app.kubernetes.io/component", selection.In, kinds)
	if err != nil {
		return nil, err
	}
	instance, err := labels.NewRequirement("app.kubernetes.io/instance", selection.Equals, []string{o.Release})
	if err != nil {
		return nil, err
	}
	list, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSetList, error) {
		return o.Client.AppsV1().DaemonSets(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.NewSelector().Add(*instance, *component).String()})
	})
	if err != nil {
		return nil, fmt.Errorf("list the release's driver DaemonSets: %w", err)
	}
	rendered := map[string]bool{}
	for _, p := range append(slices.Clone(o.Pools), o.VGPUPools...) {
		for _, ds := range p.DaemonSets {
			rendered[ds.Name] = true
		}
	}
	exists := map[string]bool{}
	for _, ds := range list.Items {
		exists[ds.Name] = ds.DeletionTimestamp == nil
	}
	var out []string
	for i := range list.Items {
		ds := &list.Items[i]
		if rendered[ds.Name] || revertset.IsRevert(ds) || ds.DeletionTimestamp != nil {
			continue
		}
		if !slices.ContainsFunc(podsOf[ds.Name], func(node string) bool { return !exists[targetOf[node]] }) {
			out = append(out, ds.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// deleteLeftOver deletes the plan's left-over DaemonSets: their pods stop through their gates, which empty each node
// for the DaemonSet that takes it over, under its pool's plan.
func deleteLeftOver(ctx context.Context, o Options, names []string, who string, out io.Writer) error {
	for _, name := range names {
		err := apiretry.Do(ctx, func(ctx context.Context) error {
			err := o.Client.AppsV1().DaemonSets(o.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("delete the DaemonSet %s/%s left by an upgrade that failed: %w", o.Namespace, name, err)
		}
		fmt.Fprintf(out, "%s: DaemonSet %s deleted: no pool of this release renders it (an upgrade that failed left it); its pods stop through their gates\n", who, name)
	}
	return nil
}

// DeleteLeftOverDrivers deletes the release's left-over driver DaemonSets (leftOver) as the cluster has them after
// Helm applied the release: the post-upgrade gate's first step. The pre-upgrade plan cannot delete one whose
// successor the release itself creates (a pool renamed back by an upgrade after one that failed), and a DaemonSet
// left so keeps its pods on every node of the pool beside the new one's, which the gate would wait for to its
// deadline. Only the driver DaemonSets of o.Pools are looked at; vGPU manager DaemonSets are the plan's.
func DeleteLeftOverDrivers(ctx context.Context, o Options, out io.Writer) error {
	sel := labels.Set{"app.kubernetes.io/instance": o.Release, "app.kubernetes.io/component": KindDriver}.String()
	pods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return o.Client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	})
	if err != nil {
		return fmt.Errorf("list driver pods: %w", err)
	}
	podsOf, targetOf := map[string][]string{}, map[string]string{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		ref := metav1.GetControllerOf(pod)
		if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || ref == nil || ref.Kind != "DaemonSet" {
			continue
		}
		podsOf[ref.Name] = append(podsOf[ref.Name], pod.Spec.NodeName)
		if _, ok := targetOf[pod.Spec.NodeName]; ok {
			continue
		}
		node, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.Node, error) {
			return o.Client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		})
		if apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return fmt.Errorf("read node %s: %w", pod.Spec.NodeName, err)
		}
		targetOf[node.Name] = ""
		if matched, err := driverpools.Matching(o.Pools, node); err == nil && len(matched) == 1 {
			if ds, err := matched[0].DaemonSetFor(node); err == nil && ds != nil && matched[0].Source == "container" {
				targetOf[node.Name] = ds.Name
			}
		}
	}
	names, err := leftOver(ctx, o, podsOf, targetOf, []string{KindDriver})
	if err != nil {
		return err
	}
	return deleteLeftOver(ctx, o, names, "validation gate", out)
}
