package placementplan

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// Which of a node's pods a change restarts, by rule: a changed template (DaemonSet or Deployment), an operand no
// longer placed, the driver's reload (the driver pod and the paused GPU operands); a DaemonSet placement does not
// evaluate restarts only for its template. The cordon is ours, or kept when the admin's.
func TestRestartsAndCordon(t *testing.T) {
	pod := func(name, kind, owner, component string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-operator",
			Labels:          map[string]string{"app.kubernetes.io/component": component},
			OwnerReferences: []metav1.OwnerReference{{Kind: kind, Name: owner, Controller: ptr.To(true)}}}}
		if kind == "ReplicaSet" {
			p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = "5d8f"
		}
		return p
	}
	pods := []*corev1.Pod{
		pod("dp-1", "DaemonSet", "nvidia-device-plugin-daemonset", "device-plugin"),
		pod("toolkit-1", "DaemonSet", "nvidia-container-toolkit-daemonset", "container-toolkit"),
		pod("vfio-1", "DaemonSet", "nvidia-vfio-manager", "vfio-manager"),
		pod("nfd-worker-1", "DaemonSet", "gpu-node-feature-discovery-worker", ""),
		pod("nfd-master-1", "ReplicaSet", "gpu-node-feature-discovery-master-5d8f", ""),
	}
	driver := pod("driver-1", "DaemonSet", "nvidia-driver-ubuntu2204", "driver")
	placed := map[string]string{"device-plugin": "nvidia-device-plugin-daemonset", "container-toolkit": "nvidia-container-toolkit-daemonset"}
	operands := map[string]bool{"nvidia-device-plugin-daemonset": true, "nvidia-container-toolkit-daemonset": true, "nvidia-vfio-manager": true}
	for _, c := range []struct {
		name    string
		row     Node
		changed map[string]bool
		want    []string
	}{
		{"nothing changes but the VM operand no longer placed", Node{DriverChange: DriverSame}, nil,
			[]string{"gpu-operator/vfio-1"}},
		{"templates", Node{DriverChange: DriverSame},
			map[string]bool{"DaemonSet/nvidia-device-plugin-daemonset": true, "Deployment/gpu-node-feature-discovery-master": true, "DaemonSet/gpu-node-feature-discovery-worker": true},
			[]string{"gpu-operator/dp-1", "gpu-operator/nfd-master-1", "gpu-operator/nfd-worker-1", "gpu-operator/vfio-1"}},
		{"driver change", Node{DriverChange: DriverChange}, nil,
			[]string{"gpu-operator/dp-1", "gpu-operator/driver-1", "gpu-operator/toolkit-1", "gpu-operator/vfio-1"}},
	} {
		if got := restarts(c.row, pods, driver, placed, operands, c.changed); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	node := &corev1.Node{}
	if got := cordon(Node{DriverChange: DriverChange}, node); got != CordonYes {
		t.Errorf("cordon of a driver change: %q", got)
	}
	if got := cordon(Node{DriverChange: DriverSame, Allocation: "device-plugin -> dra"}, node); got != CordonYes {
		t.Errorf("cordon of a switch: %q", got)
	}
	node.Spec.Unschedulable = true
	if got := cordon(Node{DriverChange: DriverChange}, node); got != CordonKept {
		t.Errorf("cordon of an admin-cordoned node: %q", got)
	}
	if got := cordon(Node{DriverChange: DriverSkip, Allocation: "device-plugin -> dra"}, node); got != "" {
		t.Errorf("cordon of a skipped node: %q", got)
	}
}

// A user who may only read still gets the plan: the dry-run update of a live DaemonSet is refused, and the plan says
// its restarts leave changed pod templates out instead of failing.
func TestPlanWithoutTemplatesForAReadOnlyUser(t *testing.T) {
	r := renderProfile(t, "dra-mixed")
	live := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-device-plugin-daemonset", Namespace: "gpu-operator"}}
	client := fake.NewClientset(append(changeCluster(t, r), live)...)
	client.PrependReactor("update", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, live.Name, errors.New("read-only"))
	})
	o := Options{RenderOptions: RenderOptions{ChartDir: filepath.Join(repoRoot(), "charts", "kube-gpu-stack"),
		ValueFiles: []string{filepath.Join(repoRoot(), "values", "dra-mixed.yaml")}, KubeVersion: "v1.37.0"}, Client: client}
	o.Complete()
	var out bytes.Buffer
	p, err := Run(context.Background(), o, &out)
	if err != nil {
		t.Fatalf("plan failed for a read-only user: %v", err)
	}
	if !strings.Contains(p.TemplatesUnknown, "forbidden") || !strings.Contains(out.String(), "restarts for changed pod templates not known") {
		t.Errorf("the plan does not say the templates are unknown: %q\n%s", p.TemplatesUnknown, out.String())
	}
}
