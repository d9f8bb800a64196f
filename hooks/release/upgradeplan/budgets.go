package upgradeplan

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
)

// blockingPDBs names each GPU pod (gpupods: device plugin resources or a gpu.nvidia.com claim, as the driver
// manager's eviction counts them) on a node to upgrade that a PDB will never let go: the budget allows no
// disruption even with every pod it covers healthy. A budget that is only exhausted for now (a pod restarting) is not
// a refusal: the driver manager waits for it.
func blockingPDBs(ctx context.Context, client kubernetes.Interface, plan []NodePlan) ([]string, error) {
	onPlan := map[string]bool{}
	for _, np := range plan {
		onPlan[np.Node] = true
	}
	pods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	pdbs, err := apiretry.Value(ctx, func(ctx context.Context) (*policyv1.PodDisruptionBudgetList, error) {
		return client.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("list PodDisruptionBudgets: %w", err)
	}
	var out []string
	gpu := &gpupods.Checker{Client: client}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !onPlan[pod.Spec.NodeName] || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		var blocking []*policyv1.PodDisruptionBudget
		for _, pdb := range Holding(pdbs.Items, pod) {
			if NeverAllows(pdb) {
				blocking = append(blocking, pdb)
			}
		}
		if len(blocking) == 0 {
			continue
		}
		// asked only for pods a budget holds: the claims of a namespace are listed only when one might matter
		uses, err := gpu.Uses(ctx, pod)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if !uses {
			continue
		}
		for _, pdb := range blocking {
			out = append(out, fmt.Sprintf("GPU pod %s/%s on node %s: PodDisruptionBudget %s never allows an eviction "+
				"(%d healthy of %d, %d required): relax it, or set hooks.preUpgrade.force (that node then fails its upgrade alone)", pod.Namespace, pod.Name,
				pod.Spec.NodeName, pdb.Name, pdb.Status.CurrentHealthy, pdb.Status.ExpectedPods, pdb.Status.DesiredHealthy))
		}
	}
	return out, nil
}

// listMoves names the GPU pods (gpupods, the definition the driver manager's eviction uses) on each node that
// switches its allocation mode: they must leave before the node hands its GPUs out the other way.
func listMoves(ctx context.Context, client kubernetes.Interface, plan []NodePlan) error {
	switching := map[string]*NodePlan{}
	for i := range plan {
		if plan[i].Allocation != "" {
			switching[plan[i].Node] = &plan[i]
		}
	}
	if len(switching) == 0 {
		return nil
	}
	pods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	gpu := &gpupods.Checker{Client: client}
	for i := range pods.Items {
		pod := &pods.Items[i]
		np := switching[pod.Spec.NodeName]
		if np == nil || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		uses, err := gpu.Uses(ctx, pod)
		if err != nil {
			return fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if uses {
			np.Moves = append(np.Moves, pod.Namespace+"/"+pod.Name)
		}
	}
	for _, np := range switching {
		slices.Sort(np.Moves)
	}
	return nil
}

// Holding returns the PodDisruptionBudgets of pdbs that cover pod: an eviction of pod asks each of them.
func Holding(pdbs []policyv1.PodDisruptionBudget, pod *corev1.Pod) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for i := range pdbs {
		if pdb := &pdbs[i]; pdb.Namespace == pod.Namespace && selects(pdb, pod) {
			out = append(out, pdb)
		}
	}
	return out
}

func selects(pdb *policyv1.PodDisruptionBudget, pod *corev1.Pod) bool {
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	return err == nil && !sel.Empty() && sel.Matches(labels.Set(pod.Labels))
}

// NeverAllows reports whether the budget allows no eviction even with every pod it covers healthy (a budget only
// exhausted for now, a pod restarting, lets the driver manager wait instead).
func NeverAllows(pdb *policyv1.PodDisruptionBudget) bool {
	return pdb.Status.DisruptionsAllowed == 0 && pdb.Status.ExpectedPods > 0 && pdb.Status.DesiredHealthy >= pdb.Status.ExpectedPods
}
