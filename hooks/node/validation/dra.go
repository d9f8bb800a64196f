package validation

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/schedule"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const (
	// DRAWorkloadApp labels the dra check's workload pod.
	DRAWorkloadApp = "nvidia-dra-validator"
	// DRADeviceClass is the DeviceClass of whole GPUs the DRA driver ships; the workload pod's claim asks for one.
	DRADeviceClass = "gpu.nvidia.com"
	// draClaimRequest names the request in the workload's claim and the pod's claim entry.
	draClaimRequest = "gpu"
)

// draCheck is the plugin check's counterpart on nodes that allocate GPUs through DRA: it waits until the DRA
// driver's kubelet plugin has published the node's ResourceSlices (driver gpu.nvidia.com) and, with WithWorkload,
// runs the CUDA sample in a pod that gets one GPU through a ResourceClaim of class gpu.nvidia.com, which the
// scheduler allocates from those slices. Nodes outside DRANodes have no DRA plugin: the check skips them.
func (o *Options) draCheck() check {
	done := file{name: "dra-ready"}
	return check{
		name: "dra",
		owns: []string{"dra-ready"},
		attempt: func(ctx context.Context, p progress) result {
			dra, off, r := o.isDRANode(ctx)
			if r != nil {
				return *r
			}
			if !dra {
				return skipped(fmt.Sprintf("node %s allocates GPUs through the device plugin (its driver pool's gpuAllocation): no DRA driver to check", o.NodeName), done)
			}
			if off != "" {
				return skipped(fmt.Sprintf("node %s runs no DRA kubelet plugin (%s): no slice to wait for", o.NodeName, off), done)
			}
			n, r := o.waitSlices(ctx, p)
			if r != nil {
				return *r
			}
			p.Logf("node %s: %s published %d ResourceSlices", o.NodeName, gpupods.DRADriver, n)
			if !o.WithWorkload {
				return ready(done)
			}
			pr := o.runDRAWorkload(ctx, p)
			switch {
			case pr.permanent:
				return failed("%s", pr.reason)
			case !pr.succeeded:
				return waiting("%s", pr.reason)
			}
			return ready(done)
		},
	}
}

// isDRANode says whether DRANodes selects this node and, if its DRA kubelet plugin's switch is off (opted out, or
// paused for a driver change), which switch as key=value; a result when that cannot be told.
func (o *Options) isDRANode(ctx context.Context) (dra bool, off string, _ *result) {
	if o.DRANodes == nil {
		return false, "", nil
	}
	node, err := o.Client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
	if err != nil {
		r := waiting("get node %s: %v", o.NodeName, err)
		return false, "", &r
	}
	dra, err = schedule.Selects(o.DRANodes, node)
	if err != nil {
		r := failed("DRA_NODE_SELECTOR: %v", err)
		return false, "", &r
	}
	if v, present := node.Labels[draPluginSwitch]; !nodestate.SwitchOn(v, present) {
		off = draPluginSwitch + "=" + v
	}
	return dra, off, nil
}

// draPluginSwitch is the DRA kubelet plugin's node switch.
const draPluginSwitch = nodestate.DeployLabelPrefix + "dra-driver"

// DRASliceSelector selects the ResourceSlices the DRA driver publishes for node.
func DRASliceSelector(node string) string {
	return fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermEqualSelector("spec.driver", gpupods.DRADriver)).String()
}

// PublishedSlices counts the ResourceSlices of gpu.nvidia.com for node that offer at least one device.
func PublishedSlices(ctx context.Context, client kubernetes.Interface, node string) (int, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: DRASliceSelector(node)})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		if ptr.Deref(s.Spec.NodeName, "") == node && s.Spec.Driver == gpupods.DRADriver && len(s.Spec.Devices) > 0 {
			n++
		}
	}
	return n, nil
}

// waitSlices polls, up to Timeout, until the node's GPU ResourceSlices are published.
func (o *Options) waitSlices(ctx context.Context, p progress) (int, *result) {
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	reported := false
	for {
		n, err := PublishedSlices(wctx, o.Client, o.NodeName)
		switch {
		case apierrors.IsForbidden(err):
			r := failed("list ResourceSlices: %v", err)
			return 0, &r
		case err == nil && n > 0:
			return n, nil
		case err == nil && !reported:
			p.Report(fmt.Sprintf("no %s ResourceSlice for node %s yet (the DRA kubelet plugin publishes them)", gpupods.DRADriver, o.NodeName))
			reported = true
		}
		select {
		case <-wctx.Done():
			why := "none published"
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				why = err.Error()
			}
			r := waiting("node %s has no %s ResourceSlice with devices after %s (%s): is the DRA kubelet plugin running on it?",
				o.NodeName, gpupods.DRADriver, o.Timeout, why)
			return 0, &r
		case <-time.After(min(o.SleepInterval, time.Second)):
		}
	}
}

// runDRAWorkload creates a claim for one GPU of class gpu.nvidia.com and runs the CUDA sample in a pod that uses
// it. The pod is placed by node affinity, not spec.nodeName: only the scheduler allocates claims, and a pod bound
// by name would wait for an allocation forever. Pod and claim are deleted at the end; the claim is owned by the pod,
// so if this validator is killed first, the garbage collector removes it with the pod.
func (o *Options) runDRAWorkload(ctx context.Context, p progress) podResult {
	claims := o.Client.ResourceV1().ResourceClaims(o.Namespace)
	name := DRAWorkloadApp + "-" + rand.String(5)
	claimed := false
	w := workload{app: DRAWorkloadApp, container: "dra-validation", claim: name, created: func(ctx context.Context, pod *corev1.Pod) error {
		if _, err := claims.Create(ctx, o.draClaim(name, pod), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ResourceClaim %s/%s: %w", o.Namespace, name, err)
		}
		claimed = true
		p.Logf("created ResourceClaim %s/%s (class %s)", o.Namespace, name, DRADeviceClass)
		return nil
	}}
	defer func() {
		if !claimed {
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := claims.Delete(dctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			p.Logf("could not delete ResourceClaim %s: %v", name, err)
		}
	}()
	return o.runWorkload(ctx, p, w)
}

func (o *Options) draClaim(name string, owner *corev1.Pod) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: o.Namespace,
			Labels:          map[string]string{"app": DRAWorkloadApp, "app.kubernetes.io/managed-by": "kube-gpu-stack-validator"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID}},
		},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: draClaimRequest,
			Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: DRADeviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			},
		}}}},
	}
}
