package placementplan

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// Cordons a node can see.
const (
	CordonYes  = "yes"  // the driver manager cordons the node for its driver change
	CordonKept = "kept" // the node is cordoned already (by the admin): the change runs, the cordon stays the admin's
)

// TemplateChanges says, of each rendered DaemonSet and Deployment that the release already runs, whether the
// upgrade replaces its pods: the rendered object is sent as an update of the live one with dryRun=All (defaulting
// and admission run, nothing is stored) and the pod templates compared. The DaemonSet and Deployment controllers
// replace a pod exactly when its template's hash changes, and a template compared before defaulting would differ in
// every field the server fills in. OnDelete DaemonSets (the driver's) restart no pod on a template change: the
// driver manager replaces a driver pod only for a driver change. Keys are "DaemonSet/NAME" and "Deployment/NAME".
// It needs update on both (a dry run changes nothing); a refusal is returned as the API server's error.
func TemplateChanges(ctx context.Context, client kubernetes.Interface, namespace string, rendered map[string][]byte) (map[string]bool, error) {
	out := map[string]bool{}
	for key, doc := range rendered {
		kind, name, _ := strings.Cut(key, "/")
		var changed bool
		var err error
		switch kind {
		case "DaemonSet":
			dss := client.AppsV1().DaemonSets(namespace)
			changed, err = templateChanges[appsv1.DaemonSet](ctx, dss.Get, dss.Update, kind, name, doc,
				func(ds *appsv1.DaemonSet) *corev1.PodTemplateSpec { return &ds.Spec.Template },
				func(ds *appsv1.DaemonSet) bool {
					return ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType
				})
		case "Deployment":
			deps := client.AppsV1().Deployments(namespace)
			changed, err = templateChanges[appsv1.Deployment](ctx, deps.Get, deps.Update, kind, name, doc,
				func(d *appsv1.Deployment) *corev1.PodTemplateSpec { return &d.Spec.Template },
				func(*appsv1.Deployment) bool { return false })
		}
		if err != nil {
			return nil, err
		}
		out[key] = changed
	}
	return out, nil
}

// templateChanges is TemplateChanges for one object of type T (kind, for messages): get and update are its typed
// client's, template its pod template, and onDelete says that its pods are not replaced for a template change.
func templateChanges[T any, PT interface {
	*T
	DeepCopy() *T
}](ctx context.Context,
	get func(context.Context, string, metav1.GetOptions) (*T, error),
	update func(context.Context, *T, metav1.UpdateOptions) (*T, error),
	kind, name string, doc []byte, template func(*T) *corev1.PodTemplateSpec, onDelete func(*T) bool,
) (bool, error) {
	live, err := get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil // new: its pods start, none restarts
	}
	if err != nil {
		return false, fmt.Errorf("get %s %s: %w", kind, name, err)
	}
	if onDelete(live) {
		return false, nil
	}
	want := new(T)
	if err := yaml.Unmarshal(doc, want); err != nil {
		return false, fmt.Errorf("rendered %s %s: %w", kind, name, err)
	}
	// the live object with the rendered template: what the upgrade writes there, as the server would store it
	next := PT(live).DeepCopy()
	*template(next) = *template(want)
	stored, err := update(ctx, next, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, fmt.Errorf("%s %s as the upgrade would write it (dry run): %w", kind, name, err)
	}
	return !apiequality.Semantic.DeepEqual(*template(stored), *template(live)), nil
}

// restarts are the release's pods on a node that the change deletes: a pod of a GPU operand DaemonSet (operands)
// that no longer places it on the node (a role change, an operand turned off), a pod of a RollingUpdate DaemonSet
// whose template changes (changed, nil when not known), and on a node whose driver changes the driver pod and the
// GPU operands' pods, paused around the driver's reload. The DaemonSets placement does not evaluate (the NFD
// worker, which runs on every node) restart only for their template. Sorted, namespace/name.
func restarts(row Node, pods []*corev1.Pod, driverPod *corev1.Pod, placed map[string]string, operands, changed map[string]bool) []string {
	reloads := row.DriverChange == DriverChange || row.DriverChange == DriverRemove || (row.Allocation != "" && row.DriverChange != DriverSkip)
	here := map[string]bool{}
	for _, ds := range placed {
		here[ds] = true
	}
	var out []string
	if driverPod != nil && reloads {
		out = append(out, driverPod.Namespace+"/"+driverPod.Name)
	}
	for _, p := range pods {
		if d := deploymentOf(p); d != "" {
			if changed["Deployment/"+d] {
				out = append(out, p.Namespace+"/"+p.Name)
			}
			continue
		}
		owner := daemonSetOf(p)
		if owner == "" {
			continue
		}
		paused := reloads && (slices.Contains(nodestate.PausableOperands, p.Labels["app.kubernetes.io/component"]) ||
			p.Labels["app.kubernetes.io/component"] == "dra-driver")
		if (operands[owner] && !here[owner]) || changed["DaemonSet/"+owner] || paused {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// cordon is what happens to the node's cordon (CordonYes, CordonKept, or "").
func cordon(row Node, n *corev1.Node) string {
	if row.DriverChange != DriverChange && (row.Allocation == "" || row.DriverChange == DriverSkip) {
		return ""
	}
	if n.Spec.Unschedulable {
		return CordonKept
	}
	return CordonYes
}

// daemonSetOf is the DaemonSet that owns pod, "" when none does.
func daemonSetOf(p *corev1.Pod) string {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return o.Name
		}
	}
	return ""
}

// deploymentOf is the Deployment whose ReplicaSet owns pod (the ReplicaSet's name less the pod-template-hash),
// "" when none does.
func deploymentOf(p *corev1.Pod) string {
	hash := p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
	for _, o := range p.OwnerReferences {
		if o.Kind == "ReplicaSet" && o.Controller != nil && *o.Controller && hash != "" && strings.HasSuffix(o.Name, "-"+hash) {
			return strings.TrimSuffix(o.Name, "-"+hash)
		}
	}
	return ""
}

// renderedWorkloads are the DaemonSet and Deployment documents of a manifest stream, by "KIND/NAME".
func renderedWorkloads(stream string) map[string][]byte {
	out := map[string][]byte{}
	for _, doc := range strings.Split(stream, "\n---\n") {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if yaml.Unmarshal([]byte(doc), &head) == nil && (head.Kind == "DaemonSet" || head.Kind == "Deployment") {
			out[head.Kind+"/"+head.Metadata.Name] = []byte(doc)
		}
	}
	return out
}
