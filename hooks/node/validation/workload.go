package validation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/kwatch"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
)

// Workload pod labels (app=<value>): the checks delete their earlier pods on the node by them.
const (
	CUDAWorkloadApp   = "nvidia-cuda-validator"
	PluginWorkloadApp = "nvidia-device-plugin-validator"
	// GPUResource is the device plugin's resource with MIG strategy single or none (gpupods' name for it).
	GPUResource = gpupods.GPUResource
	// MIGResourcePrefix prefixes the device plugin's resources with MIG strategy mixed (nvidia.com/mig-1g.10gb).
	MIGResourcePrefix = gpupods.MIGResourcePrefix
)

// cudaCheck runs the CUDA sample in a pod on this node. The pod asks for no GPU: the nvidia runtime gives it all
// of them (NVIDIA_VISIBLE_DEVICES=all), so it runs even when every GPU is allocated to workloads.
func (o *Options) cudaCheck() check {
	return check{
		name: "cuda",
		owns: []string{"cuda-ready"},
		attempt: func(ctx context.Context, p progress) result {
			pr := o.runWorkload(ctx, p, workload{app: CUDAWorkloadApp, container: "cuda-validation"})
			if pr.permanent {
				return failed("%s", pr.reason)
			}
			if !pr.succeeded {
				return waiting("%s", pr.reason)
			}
			return ready(file{name: "cuda-ready"})
		},
	}
}

// pluginCheck waits until the node advertises GPUs and, with WithWorkload, runs the CUDA sample in a pod that
// requests one of them through the device plugin. A node whose GPUs are all allocated skips the pod: it would wait
// for a free GPU, which may never come.
func (o *Options) pluginCheck() check {
	return check{
		name: "plugin",
		owns: []string{"plugin-ready"},
		attempt: func(ctx context.Context, p progress) result {
			if o.DRANodes != nil {
				// a DRA node has no device plugin and never advertises nvidia.com/gpu: waiting would never end
				node, err := o.Client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
				if err != nil {
					return waiting("get node %s: %v", o.NodeName, err)
				}
				dra, err := schedule.Selects(o.DRANodes, node)
				if err != nil {
					return failed("DRA_NODE_SELECTOR: %v", err)
				}
				if dra {
					return skipped(fmt.Sprintf("node %s allocates GPUs through DRA (its driver pool's gpuAllocation): no device plugin to check", o.NodeName), file{name: "plugin-ready"})
				}
			}
			res, n, r := o.gpuCapacity(ctx, p)
			if n == 0 {
				return r
			}
			p.Logf("node %s advertises %d %s", o.NodeName, n, res)
			done := file{name: "plugin-ready"}
			if !o.WithWorkload {
				return ready(done)
			}
			if err := o.deleteWorkloads(ctx, PluginWorkloadApp); err != nil {
				return waiting("%v", err)
			}
			used, err := o.allocated(ctx, res)
			switch {
			case apierrors.IsForbidden(err): // the kubelet's admission answers instead: OutOf<resource>
				p.Logf("cannot list the node's pods (%v); relying on the kubelet to refuse the pod if no GPU is free", err)
			case err != nil:
				return waiting("list the pods on node %s: %v", o.NodeName, err)
			case used >= n:
				return skipped(fmt.Sprintf("all %d %s allocated; workload check skipped", n, res), done)
			}
			pr := o.runWorkload(ctx, p, workload{app: PluginWorkloadApp, container: "plugin-validation", resource: res})
			switch {
			case pr.permanent:
				return failed("%s", pr.reason)
			case pr.outOfResource:
				return skipped(fmt.Sprintf("no free %s (%s); workload check skipped", res, pr.reason), done)
			case !pr.succeeded:
				return waiting("%s", pr.reason)
			}
			return ready(done)
		},
	}
}

// gpuCapacity watches the Node, up to Timeout, until it has allocatable GPUs: nvidia.com/gpu, or nvidia.com/mig-*
// (preferred with MIG strategy mixed). It returns the resource and its count; 0 with the reason when none came.
func (o *Options) gpuCapacity(ctx context.Context, p progress) (corev1.ResourceName, int64, result) {
	var res corev1.ResourceName
	var n int64
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	nodes, err := kwatch.Start(wctx, kwatch.Node(o.Client, o.NodeName), &corev1.Node{})
	if err != nil {
		return "", 0, watchFailed(err)
	}
	reported := false
	err = kwatch.Until(wctx, nodes, func([]*corev1.Node) (bool, error) {
		node, ok := nodes.Get("", o.NodeName)
		if !ok {
			return false, fmt.Errorf("node %s is gone", o.NodeName)
		}
		res, n = gpuResource(node, o.MIGStrategy)
		if n == 0 && !reported {
			p.Report(fmt.Sprintf("node advertises no %s or %s* yet (the device plugin registers them)", GPUResource, MIGResourcePrefix))
			reported = true
		}
		return n > 0, nil
	})
	if n > 0 {
		return res, n, result{}
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return "", 0, watchFailed(err)
	}
	return "", 0, waiting("node %s advertises no allocatable %s or %s* after %s: is the device plugin running on it?",
		o.NodeName, GPUResource, MIGResourcePrefix, o.Timeout)
}

// gpuResource picks the device plugin's resource on node and its allocatable count.
func gpuResource(node *corev1.Node, strategy string) (corev1.ResourceName, int64) {
	var mig []corev1.ResourceName
	for name, q := range node.Status.Allocatable {
		if strings.HasPrefix(string(name), MIGResourcePrefix) && q.Value() > 0 {
			mig = append(mig, name)
		}
	}
	slices.Sort(mig)
	gpu := node.Status.Allocatable[GPUResource]
	if len(mig) > 0 && (strategy == "mixed" || gpu.Value() == 0) {
		q := node.Status.Allocatable[mig[0]]
		return mig[0], q.Value()
	}
	return GPUResource, gpu.Value()
}

// allocated sums res over the node's pods that still hold it (not Succeeded or Failed), counting a pod as the
// scheduler does: the larger of its containers' sum and its largest init container.
func (o *Options) allocated(ctx context.Context, res corev1.ResourceName) (int64, error) {
	pods, err := o.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", o.NodeName).String(),
	})
	if err != nil {
		return 0, err
	}
	var total int64
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != o.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		total += podRequest(pod, res)
	}
	return total, nil
}

func podRequest(pod *corev1.Pod, res corev1.ResourceName) int64 {
	get := func(c corev1.Container) int64 {
		if q, ok := c.Resources.Requests[res]; ok {
			return q.Value()
		}
		q := c.Resources.Limits[res] // extended resources: a limit alone sets the request
		return q.Value()
	}
	var sum, initMax int64
	for _, c := range pod.Spec.Containers {
		sum += get(c)
	}
	for _, c := range pod.Spec.InitContainers {
		initMax = max(initMax, get(c))
	}
	return max(sum, initMax)
}

// workload is a pod a check runs on its node.
type workload struct {
	app       string
	container string
	// resource, when set, is requested once through the device plugin; otherwise the pod sees every GPU through
	// the runtime (NVIDIA_VISIBLE_DEVICES=all, privileged so the toolkit honours the variable).
	resource corev1.ResourceName
	// claim, when set, names the ResourceClaim the pod takes its GPU from (the dra check); the pod is then placed
	// by node affinity so that the scheduler allocates the claim.
	claim string
	// created, when set, runs once the pod exists (the dra check creates the claim, owned by the pod).
	created func(context.Context, *corev1.Pod) error
}

type podResult struct {
	succeeded bool
	// outOfResource: the kubelet refused the pod because the requested GPU was not free.
	outOfResource bool
	// permanent: the pod cannot be watched however often it is retried (forbidden, say).
	permanent bool
	reason    string
}

// watchFailed is the outcome of a watch that ended with err before the deadline: a failure when retrying cannot
// fix it (forbidden, say), so the check says why at once instead of after its timeout.
func watchFailed(err error) result {
	if kwatch.Permanent(err) {
		return failed("%v", err)
	}
	return waiting("%v", err)
}

// runWorkload replaces any earlier pod of w on this node with a new one, watches it until it ends or Timeout, and
// deletes it.
func (o *Options) runWorkload(ctx context.Context, p progress, w workload) podResult {
	if err := o.deleteWorkloads(ctx, w.app); err != nil {
		return podResult{reason: err.Error()}
	}
	pods := o.Client.CoreV1().Pods(o.Namespace)
	pod, err := pods.Create(ctx, o.workloadPod(w), metav1.CreateOptions{})
	if err != nil {
		return podResult{reason: fmt.Sprintf("create the %s pod in %s: %v", w.app, o.Namespace, err)}
	}
	p.Logf("started pod %s/%s (%s)", pod.Namespace, pod.Name, o.WorkloadImage)
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := pods.Delete(dctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			p.Logf("could not delete pod %s: %v", pod.Name, err)
		}
	}()
	if w.created != nil {
		if err := w.created(ctx, pod); err != nil {
			return podResult{reason: err.Error(), permanent: apierrors.IsForbidden(err)}
		}
	}

	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	watched, err := kwatch.Start(wctx, kwatch.Pods(o.Client, pod.Namespace, fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ""), &corev1.Pod{})
	if err != nil {
		return podResult{reason: err.Error(), permanent: kwatch.Permanent(err)}
	}
	last, lastReason := pod, describePending(pod)
	p.Report(lastReason)
	err = kwatch.Until(wctx, watched, func([]*corev1.Pod) (bool, error) {
		cur, ok := watched.Get(pod.Namespace, pod.Name)
		if !ok {
			return false, fmt.Errorf("pod %s was deleted before it finished", pod.Name)
		}
		last = cur
		if last.Status.Phase == corev1.PodSucceeded || last.Status.Phase == corev1.PodFailed {
			return true, nil
		}
		if r := describePending(last); r != lastReason {
			lastReason = r
			p.Report(r)
		}
		return false, nil
	})
	switch {
	case last.Status.Phase == corev1.PodSucceeded:
		return podResult{succeeded: true}
	case last.Status.Phase == corev1.PodFailed:
		reason := describeFailure(last)
		out := strings.HasPrefix(last.Status.Reason, "OutOf") || last.Status.Reason == "UnexpectedAdmissionError"
		return podResult{outOfResource: out, reason: reason}
	case errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil:
		return podResult{reason: fmt.Sprintf("pod %s did not finish within %s: %s", pod.Name, o.Timeout, describePending(last))}
	}
	return podResult{reason: fmt.Sprintf("watch pod %s: %v (last seen: %s)", pod.Name, err, describePending(last))}
}

// deleteWorkloads removes the earlier pods of app on this node (a crashed run's, or one still running).
func (o *Options) deleteWorkloads(ctx context.Context, app string) error {
	pods := o.Client.CoreV1().Pods(o.Namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.Set{"app": app}.String()})
	if err != nil {
		return fmt.Errorf("list earlier %s pods in %s: %w", app, o.Namespace, err)
	}
	for _, old := range list.Items {
		if targetNode(&old) != o.NodeName || old.Labels["app"] != app {
			continue
		}
		// only the workload account's pods are ours (the admission policy refuses the validator any other pod's
		// deletion): another's, such as one a GPU Operator validator left before a takeover, ends by its own deadline
		if old.Spec.ServiceAccountName != o.WorkloadServiceAccount && o.WorkloadServiceAccount != "" {
			continue
		}
		err := pods.Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete earlier pod %s: %w", old.Name, err)
		}
	}
	return nil
}

func (o *Options) workloadPod(w workload) *corev1.Pod {
	c := corev1.Container{
		Name:                     w.container,
		Image:                    o.WorkloadImage,
		ImagePullPolicy:          corev1.PullPolicy(o.PullPolicy),
		Command:                  o.WorkloadCommand,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	annotations := map[string]string{}
	switch {
	case w.claim != "": // the DRA driver's CDI spec gives the pod the claimed GPU
		c.Resources.Claims = []corev1.ResourceClaim{{Name: draClaimRequest}}
		c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
	case w.resource == "":
		c.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		// with the NRI plugin instead of a runtime class, CDI injects the GPUs by this annotation
		annotations["nvidia.cdi.k8s.io/container."+w.container] = "management.nvidia.com/gpu=all"
	default:
		one := resource.MustParse("1")
		c.Resources.Limits = corev1.ResourceList{w.resource: one}
		c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: w.app + "-",
			Namespace:    o.Namespace,
			Labels:       map[string]string{"app": w.app, "app.kubernetes.io/managed-by": "kube-gpu-stack-validator"},
			Annotations:  annotations,
		},
		Spec: corev1.PodSpec{
			NodeName:                      o.NodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  ptr.To(false),
			ActiveDeadlineSeconds:         ptr.To(int64(o.Timeout.Seconds()) + 30), // gone even if this validator is
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{c},
		},
	}
	if w.claim != "" {
		pod.Spec.NodeName = ""
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{o.NodeName}},
			}}},
		}}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: draClaimRequest, ResourceClaimName: ptr.To(w.claim)}}
	}
	if o.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = ptr.To(o.RuntimeClass)
	}
	pod.Spec.ServiceAccountName = o.WorkloadServiceAccount
	for _, s := range o.PullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return pod
}

// targetNode is the node a workload pod runs on, or, not yet scheduled, the one its node affinity names.
func targetNode(pod *corev1.Pod) string {
	if pod.Spec.NodeName != "" {
		return pod.Spec.NodeName
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, f := range t.MatchFields {
				if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	return ""
}

// describePending says what a pod that has not finished is waiting for.
func describePending(pod *corev1.Pod) string {
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			s := fmt.Sprintf("pod %s: container %s waiting: %s", pod.Name, cs.Name, w.Reason)
			if w.Message != "" {
				s += ": " + w.Message
			}
			return s
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Message != "" {
			return fmt.Sprintf("pod %s not scheduled: %s", pod.Name, c.Message)
		}
	}
	phase := pod.Status.Phase
	if phase == "" {
		phase = corev1.PodPending
	}
	return fmt.Sprintf("pod %s is %s", pod.Name, phase)
}

// describeFailure says why a pod failed: the kubelet's refusal, or the failing container's exit and last words.
func describeFailure(pod *corev1.Pod) string {
	if pod.Status.Reason != "" && (len(pod.Status.ContainerStatuses) == 0 || strings.HasPrefix(pod.Status.Reason, "OutOf")) {
		return fmt.Sprintf("pod %s failed: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
	}
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		t := cs.State.Terminated
		if t == nil || t.ExitCode == 0 {
			continue
		}
		s := fmt.Sprintf("pod %s: container %s exited %d", pod.Name, cs.Name, t.ExitCode)
		if t.Reason != "" {
			s += " (" + t.Reason + ")"
		}
		if last := lastLine(t.Message); last != "" {
			s += ": " + last
		}
		return s
	}
	if pod.Status.Reason != "" {
		return fmt.Sprintf("pod %s failed: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
	}
	return fmt.Sprintf("pod %s failed", pod.Name)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
