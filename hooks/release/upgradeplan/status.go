package upgradeplan

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// driverPods returns the release's driver pods by node, and on vm-vgpu nodes its vGPU manager pods (a node has
// one role, so one of the two): their driver managers walk the same upgrade states. Pods being deleted are left out.
func driverPods(ctx context.Context, client kubernetes.Interface, namespace, release string) (map[string]*corev1.Pod, error) {
	live, _, err := driverPodsByNode(ctx, client, namespace, release)
	return live, err
}

// driverSelector selects the driver and vGPU manager objects (pods, DaemonSets) of release, of every release when "".
func driverSelector(release string) string {
	sel := "app.kubernetes.io/component in (" + KindDriver + "," + KindVGPUManager + ")"
	if release != "" {
		sel += "," + labels.Set{"app.kubernetes.io/instance": release}.String()
	}
	return sel
}

// driverPodsByNode is driverPods, and the pods being deleted on nodes without a live one (a driver pod whose gate
// empties its node before its driver stops).
func driverPodsByNode(ctx context.Context, client kubernetes.Interface, namespace, release string) (live, stopping map[string]*corev1.Pod, err error) {
	sel := driverSelector(release)
	pods, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list driver pods: %w", err)
	}
	live, stopping = map[string]*corev1.Pod{}, map[string]*corev1.Pod{}
	for i := range pods.Items {
		switch p := &pods.Items[i]; {
		case p.Spec.NodeName == "":
		case p.DeletionTimestamp == nil:
			live[p.Spec.NodeName] = p
		default:
			stopping[p.Spec.NodeName] = p
		}
	}
	for node := range live {
		delete(stopping, node)
	}
	return live, stopping, nil
}

// WriteStatus prints one row per node that runs a driver pod or carries an upgrade state: state, driver image tag,
// since when, and the reason.
// DriverVersion is the driver a driver (or vGPU manager) pod spec runs, as its image tag says it
// (595.91.07-ubuntu22.04; a digest when the image is pinned by one alone): its first container's.
func DriverVersion(spec corev1.PodSpec) string {
	if len(spec.Containers) == 0 {
		return ""
	}
	img := spec.Containers[0].Image
	return img[strings.LastIndexAny(img, ":@")+1:]
}

// Downgrade says whether to is an older driver than from, by their leading dotted versions (595.91.07 < 600.10.01);
// false when either has none.
func Downgrade(from, to string) bool {
	f, errF := version.ParseGeneric(leadingVersion(from))
	t, errT := version.ParseGeneric(leadingVersion(to))
	return errF == nil && errT == nil && t.LessThan(f)
}

func leadingVersion(tag string) string {
	v, _, _ := strings.Cut(tag, "-")
	return v
}

func WriteStatus(ctx context.Context, client kubernetes.Interface, namespace, release string, out io.Writer) error {
	pods, stopping, err := driverPodsByNode(ctx, client, namespace, release)
	if err != nil {
		return err
	}
	nodes, err := apiretry.Value(ctx, func(ctx context.Context) (*corev1.NodeList, error) {
		return client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	installs, err := driverTemplates(ctx, client, namespace, release)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tSTATE\tDRIVER\tSINCE\tREASON")
	for _, n := range nodes.Items {
		state, hasState := n.Labels[nodestate.UpgradeStateLabel]
		pod := pods[n.Name]
		if pod == nil {
			pod = stopping[n.Name]
		}
		if !hasState && pod == nil {
			continue
		}
		if !hasState {
			state = "-"
		}
		driver := "-"
		if pod != nil && len(pod.Spec.Containers) > 0 {
			driver = DriverVersion(pod.Spec)
			// the driver its DaemonSet installs now, when another: the version first, a downgrade called out
			if owner := metav1.GetControllerOf(pod); owner != nil && pod.DeletionTimestamp == nil {
				if to := installs[owner.Name]; to != "" && to != driver {
					driver += " -> " + to
					if Downgrade(DriverVersion(pod.Spec), to) {
						driver += " DOWNGRADE"
					}
				}
			}
			switch {
			case pod.DeletionTimestamp != nil: // its gate empties the node before the driver container's stop
				driver += " (pod stopping: the node is emptied first)"
			case !podReady(pod): // the pod of a node mid-change or failed: its driver is not the one running
				driver += " (pod not ready)"
			}
		}
		if n.Labels[nodestate.UpgradeSkipLabel] == "true" {
			by := HeldByLabel
			if seeded, err := nodestate.Seeded(&n, nodestate.UpgradeSkipLabel); err == nil && seeded {
				by = HeldByValues
			}
			state += " (held: " + by + ")"
		}
		since := "-"
		if t, err := time.Parse(time.RFC3339, n.Annotations[nodestate.UpgradeSinceAnnotation]); err == nil {
			since = t.Format(time.RFC3339)
		}
		reason := n.Annotations[nodestate.UpgradeReasonAnnotation]
		if nodestate.Reverted(&n) {
			state += " (reverted)"
			reason = nodestate.RevertSummary(&n) + "; its pool holds; `kube-gpu-stack upgrade retry " + n.Name + "` tries the new driver again"
		}
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, state, driver, since, reason)
	}
	return w.Flush()
}

// driverTemplates maps each of the release's driver (and vGPU manager) DaemonSets to the driver its template
// installs.
func driverTemplates(ctx context.Context, client kubernetes.Interface, namespace, release string) (map[string]string, error) {
	sel := driverSelector(release)
	dss, err := apiretry.Value(ctx, func(ctx context.Context) (*appsv1.DaemonSetList, error) {
		return client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	})
	if err != nil {
		return nil, fmt.Errorf("list driver DaemonSets: %w", err)
	}
	out := map[string]string{}
	for _, ds := range dss.Items {
		out[ds.Name] = DriverVersion(ds.Spec.Template.Spec)
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Retry moves a node out of upgrade-failed: back to upgrade-required. A driver pod made from its DaemonSet's current
// template is deleted so the DaemonSet starts a fresh one whose driver manager runs the steps again; an older one
// still serves the old driver (emptying the node for the new one failed, and was undone), so it is left running:
// its upgrade gate sees the node leave upgrade-failed and empties it again before the pod stops. It decides from the
// node as it is when it writes (nodestate.Update): a node that left upgrade-failed meanwhile is not sent back.
//
// A node whose failed change was reverted (nodestate.Reverted), once back on its old driver (upgrade-done), is
// retried too: it leaves its revert DaemonSet (label and record go), whose pod's gate empties the node before it
// stops, and its driver DaemonSet's pod installs the new driver again.
func Retry(ctx context.Context, client kubernetes.Interface, namespace, release, node string, now time.Time, out io.Writer) error {
	reverted := ""
	_, err := nodestate.Update(ctx, client, node, func(n *corev1.Node) (nodestate.Patch, error) {
		st := n.Labels[nodestate.UpgradeStateLabel]
		_, labelled := n.Labels[nodestate.RevertLabel]
		switch {
		case nodestate.Reverted(n) && st == string(nodestate.UpgradeDone), labelled && st == string(nodestate.UpgradeFailed):
			reverted = n.Labels[nodestate.RevertLabel]
		case nodestate.Reverted(n):
			return nodestate.Patch{}, fmt.Errorf("node %s is going back to its old driver (state %q): retry once it is upgrade-done", node, st)
		case st != string(nodestate.UpgradeFailed):
			return nodestate.Patch{}, fmt.Errorf("node %s is in state %q, not upgrade-failed: nothing to retry", node, st)
		}
		return nodestate.Merge(nodestate.SetUpgradeState(n, nodestate.UpgradeRequired, "retry requested", now.UTC().Format(time.RFC3339)), nodestate.EndRevert(n)), nil
	})
	if err != nil {
		return err
	}
	if reverted != "" {
		fmt.Fprintf(out, "node %s: upgrade-required; taken back from its revert DaemonSet (%s=%s): that pod's gate empties the node before it stops, then its driver DaemonSet's pod installs the new driver again\n",
			node, nodestate.RevertLabel, reverted)
		return nil
	}
	pods, err := driverPods(ctx, client, namespace, release)
	if err != nil {
		return err
	}
	if pod := pods[node]; pod != nil {
		if change, err := outdated(ctx, client, pod); err != nil {
			return err
		} else if change != "" {
			fmt.Fprintf(out, "node %s: upgrade-required; driver pod %s still serves the old driver (%s): its upgrade gate empties the node before it stops\n", node, pod.Name, change)
			return nil
		}
		if err := client.CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete driver pod %s: %w", pod.Name, err)
		}
		fmt.Fprintf(out, "node %s: upgrade-required; driver pod %s deleted, its DaemonSet starts a new one\n", node, pod.Name)
		return nil
	}
	fmt.Fprintf(out, "node %s: upgrade-required; no driver pod runs there now\n", node)
	return nil
}

// outdated is what pod's DaemonSet now installs that pod does not (PodChange; "" when nothing, or without a
// DaemonSet).
func outdated(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) (string, error) {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		return "", nil
	}
	ds, err := client.AppsV1().DaemonSets(pod.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read driver DaemonSet %s: %w", owner.Name, err)
	}
	return PodChange(pod, &ds.Spec.Template), nil
}

// PodChange says what the DaemonSet's template installs that the running pod does not ("" when nothing): another
// driver config (DRIVER_CONFIG_DIGEST) or another GPU allocation mode (GPU_ALLOCATION of the driver manager). Other
// template changes (a toleration, resources) take effect when the pod next restarts: replacing a driver pod costs
// its node's GPU pods.
func PodChange(pod *corev1.Pod, tmpl *corev1.PodTemplateSpec) string {
	next := &corev1.Pod{Spec: tmpl.Spec}
	if from, to := PodDigest(pod), PodDigest(next); from != to {
		return fmt.Sprintf("driver config %s -> %s", nodestate.ShortDigest(from), nodestate.ShortDigest(to))
	}
	if from, to := managerEnv(pod, "GPU_ALLOCATION"), managerEnv(next, "GPU_ALLOCATION"); from != to {
		return fmt.Sprintf("GPU allocation %s -> %s", from, to)
	}
	return ""
}

// managerEnv is a plain env value of the pod's driver-manager init container.
func managerEnv(pod *corev1.Pod, name string) string {
	if c := ManagerContainer(pod.Spec.InitContainers); c != nil {
		for _, e := range c.Env {
			if e.Name == name && e.ValueFrom == nil {
				return e.Value
			}
		}
	}
	return ""
}

func ManagerContainer(cs []corev1.Container) *corev1.Container {
	for i := range cs {
		if len(cs[i].Command) > 0 && cs[i].Command[0] == "driver-manager" {
			return &cs[i]
		}
	}
	return nil
}
