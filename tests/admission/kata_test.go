package admission

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const kataSA = "nvidia-kata-sandbox-device-plugin"

// kataImage is the kata plugin's image as the chart renders it (install reads it from the render): the policy
// allows the GFD pods it starts only with that exact reference, digest pin included.
var kataImage string

// TestKataPluginStartsOnlyItsNodesGFDPod: the kata sandbox device plugin's Role may create and delete any pod in the
// release namespace, which holds the stack's privileged pods and Secrets; v0.0.5 starts one GFD pod per node,
// gfd-<node>, bound to that node, under its own account and with its own image, and deletes only that one. The
// policy lets a token bound to the plugin's pod on node A do exactly that, and refuses the same pod for node B, a
// pod under another account, another image, a pod reading a Secret, and the deletion of another pod.
func TestKataPluginStartsOnlyItsNodesGFDPod(t *testing.T) {
	install(t)
	if kataImage == "" {
		t.Fatalf("the render has no DaemonSet of account %s to read the kata plugin's image from", kataSA)
	}
	ctx := t.Context()
	c := clientAs(t, kataSA, podOn(t, kataSA, nodeA))
	gfd := func(name, node, sa, image string, mutate ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, RestartPolicy: corev1.RestartPolicyOnFailure,
				AutomountServiceAccountToken: ptr.To(false),
				Containers:                   []corev1.Container{{Name: "gpu-feature-discovery", Image: image, Command: []string{"/usr/bin/gpu-feature-discovery"}}}}}
		for _, m := range mutate {
			m(p)
		}
		return p
	}
	create := func(p *corev1.Pod) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		}
	}
	refused := 0
	for why, p := range map[string]*corev1.Pod{
		"another node's":  gfd("gfd-"+nodeB, nodeB, kataSA, kataImage),
		"misnamed":        gfd("gfd-x-"+nodeA, nodeA, kataSA, kataImage),
		"another account": gfd("gfd-"+nodeA, nodeA, driverSA, kataImage),
		"another image":   gfd("gfd-"+nodeA, nodeA, kataSA, "example.invalid/shell:latest"),
		"reading a Secret": gfd("gfd-"+nodeA, nodeA, kataSA, kataImage, func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "anything"}}}}
		}),
	} {
		err := refusedByPolicy(t, create(p))
		if !strings.Contains(err.Error(), "may create and delete only the GFD pod of its node (gfd-"+nodeA) {
			t.Errorf("%s pod: refusal does not say why: %v", why, err)
		}
		refused++
	}
	other := podOn(t, workloadSA, nodeA)
	refusedByPolicy(t, func(ctx context.Context) error {
		return c.CoreV1().Pods(ns).Delete(ctx, other.Name, metav1.DeleteOptions{})
	})
	refused++
	if _, err := c.CoreV1().Pods(ns).Create(ctx, gfd("gfd-"+nodeA, nodeA, kataSA, kataImage), metav1.CreateOptions{}); err != nil {
		t.Fatalf("its own node's GFD pod: %v", err)
	}
	if err := c.CoreV1().Pods(ns).Delete(ctx, "gfd-"+nodeA, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own node's GFD pod: %v", err)
	}
	t.Logf("kata plugin pod writes: %d refused, 2 allowed", refused)
}
