// Package revertset keeps, for a driver DaemonSet about to change, a copy of it as it was: its revert DaemonSet.
// The pre-upgrade plan makes the copies (Ensure) and removes those no node needs any more (Collect); the upgrade gate
// of a node whose new driver never validated finds the copy of the driver that last validated there (Find) and labels
// its node for it (nodestate.RevertLabel). The copy selects only nodes so labelled, and the driver DaemonSets' template
// requires the label absent, so the label moves the node from one to the other: its pods come and go the way a node
// moved to another pool does (the old pod's gate stands down on the emptied node, the new pod installs).
//
// A copy is owned by its driver DaemonSet, so it goes with it (an uninstall, a pool renamed), and Argo CD takes it
// for that DaemonSet's child rather than a resource of its own to prune.
package revertset

import (
	"context"
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const (
	// OfAnnotation names, on a revert DaemonSet, the driver DaemonSet it copies.
	OfAnnotation = nodestate.AnnotationPrefix + "revert-of"
	// DigestAnnotation is, on a revert DaemonSet, the DRIVER_CONFIG_DIGEST of the driver it installs.
	DigestAnnotation = nodestate.AnnotationPrefix + "revert-digest"
)

// Name is the revert DaemonSet of driver DaemonSet ds for the driver config digest.
func Name(ds, digest string) string {
	return ds + "-revert-" + nodestate.ShortDigest(digest)
}

// Build returns ds's revert DaemonSet for digest, the config ds's template installs now: the same pod template,
// selecting only the nodes labelled nodestate.RevertLabel=<ShortDigest(digest)> among those ds selects, OnDelete,
// owned by ds.
func Build(ds *appsv1.DaemonSet, digest string) *appsv1.DaemonSet {
	value := nodestate.ShortDigest(digest)
	tmpl := *ds.Spec.Template.DeepCopy()
	tmpl.Labels = with(tmpl.Labels, nodestate.RevertLabel, value)
	onlyLabelled(&tmpl.Spec, value)
	selector := ds.Spec.Selector.DeepCopy()
	selector.MatchLabels = with(selector.MatchLabels, nodestate.RevertLabel, value)
	history := int32(1)
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{
			Name:      Name(ds.Name, digest),
			Namespace: ds.Namespace,
			Labels:    maps.Clone(ds.Labels),
			Annotations: map[string]string{
				OfAnnotation:     ds.Name,
				DigestAnnotation: digest,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID}},
		},
		Spec: appsv1.DaemonSetSpec{
			Selector:             selector,
			Template:             tmpl,
			UpdateStrategy:       appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType},
			RevisionHistoryLimit: &history,
		},
	}
}

// onlyLabelled rewrites the template's required node affinity: each term requires RevertLabel=value instead of the
// driver DaemonSet's "absent".
func onlyLabelled(spec *corev1.PodSpec, value string) {
	want := corev1.NodeSelectorRequirement{Key: nodestate.RevertLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(slices.DeleteFunc(terms[i].MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == nodestate.RevertLabel
		}), want)
	}
}

// with is a copy of m with k set to v.
func with(m map[string]string, k, v string) map[string]string {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}

// Ensure creates ds's revert DaemonSet for digest unless it exists (a copy is never updated: its pods run the driver
// it was made for). It returns the copy's name.
func Ensure(ctx context.Context, client kubernetes.Interface, ds *appsv1.DaemonSet, digest string) (string, error) {
	want := Build(ds, digest)
	err := apiretry.Do(ctx, func(ctx context.Context) error {
		_, err := client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("create the revert DaemonSet %s/%s (a copy of %s as it is, to go back to should the new driver not validate): %w",
			ds.Namespace, want.Name, ds.Name, err)
	}
	return want.Name, nil
}

// List returns the revert DaemonSets in namespace.
func List(ctx context.Context, client kubernetes.Interface, namespace string) ([]appsv1.DaemonSet, error) {
	dss, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSetList, error) {
		return client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("list the DaemonSets in %s: %w", namespace, err)
	}
	var out []appsv1.DaemonSet
	for _, ds := range dss.Items {
		if ds.Annotations[OfAnnotation] != "" && ds.Annotations[DigestAnnotation] != "" {
			out = append(out, ds)
		}
	}
	return out, nil
}

// Find returns the revert DaemonSet of driver DaemonSet ds that installs digest (nil when there is none, or it is
// being deleted).
func Find(ctx context.Context, client kubernetes.Interface, namespace, ds, digest string) (*appsv1.DaemonSet, error) {
	all, err := List(ctx, client, namespace)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if r := &all[i]; r.Annotations[OfAnnotation] == ds && r.Annotations[DigestAnnotation] == digest && r.DeletionTimestamp == nil {
			return r, nil
		}
	}
	return nil, nil
}

// IsRevert says whether ds is a revert DaemonSet.
func IsRevert(ds *appsv1.DaemonSet) bool {
	return ds.Annotations[OfAnnotation] != ""
}

// Collect deletes the revert DaemonSets in namespace that keep says no node needs any more, and returns their names.
func Collect(ctx context.Context, client kubernetes.Interface, namespace string, keep func(*appsv1.DaemonSet) bool) ([]string, error) {
	all, err := List(ctx, client, namespace)
	if err != nil {
		return nil, err
	}
	var gone []string
	for i := range all {
		r := &all[i]
		if r.DeletionTimestamp != nil || keep(r) {
			continue
		}
		err := apiretry.Do(ctx, func(ctx context.Context) error {
			err := client.AppsV1().DaemonSets(namespace).Delete(ctx, r.Name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		if err != nil {
			return gone, fmt.Errorf("delete the revert DaemonSet %s/%s no node needs: %w", namespace, r.Name, err)
		}
		gone = append(gone, r.Name)
	}
	return gone, nil
}
