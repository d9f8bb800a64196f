package upgradeplan

import (
	"context"
	"fmt"
	"io"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/revertset"
)

// leftOver finds the driver and vGPU manager DaemonSets of the release that no pool of this release renders. Helm
// prunes only what the last deployed release named: a pool renamed by an upgrade that failed, then renamed again by
// another that failed too, leaves the failed revisions' DaemonSet behind, and its pods meet the pool's own on every
// node of the pool, each waiting for the other to stop. One counts only once the DaemonSet this release gives each of
// its nodes exists: a pool this release renames still has the last deployed release's DaemonSet, which Helm deletes
// after it creates the new one (deleted first, its pods' gates would find no DaemonSet to empty their nodes for, and
// the old drivers would stop under their GPU pods). podsOf maps a DaemonSet to the nodes its pods run on, targetOf a
// node to the DaemonSet this release gives it.
func leftOver(ctx context.Context, o Options, podsOf map[string][]string, targetOf map[string]string) ([]string, error) {
	component, err := labels.NewRequirement("app.kubernetes.io/component", selection.In, []string{KindDriver, KindVGPUManager})
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
func deleteLeftOver(ctx context.Context, o Options, plan *Plan, out io.Writer) error {
	for _, name := range plan.LeftOver {
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
		fmt.Fprintf(out, "pre-upgrade: DaemonSet %s deleted: no pool of this release renders it (an upgrade that failed left it); its pods stop through their gates\n", name)
	}
	return nil
}
