package node

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// shutdownLog is the driver stand-in's record of its stops (tests/node/standin/driver: ShutdownLog).
const shutdownLog = "/run/nvidia/driver-stand-in-shutdown.log"

// shutdownEvent is one line of shutdownLog.
type shutdownEvent struct {
	at         time.Time
	pod, event string
}

func readShutdownLog(t *testing.T) []shutdownEvent {
	t.Helper()
	f, err := os.Open(shutdownLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []shutdownEvent
	for s := bufio.NewScanner(f); s.Scan(); {
		parts := strings.Fields(s.Text())
		if len(parts) != 3 {
			t.Fatalf("%s: malformed line %q", shutdownLog, s.Text())
		}
		at, err := time.Parse(time.RFC3339Nano, parts[0])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, shutdownEvent{at, parts[1], parts[2]})
	}
	return out
}

// gpuJob runs a GPU pod on the node (a ReplicaSet of one, so an eviction is allowed and the pod comes back once the
// node is in service again); the node advertises one GPU as an extended resource (no device plugin runs in this
// tier). ended receives the moment the API server shows the pod ended (deleted, or its containers done).
func gpuJob(t *testing.T, ctx context.Context) (ended <-chan time.Time) {
	t.Helper()
	c := testNode.Cluster.Client
	patch := []byte(`{"status":{"capacity":{"nvidia.com/gpu":"1"},"allocatable":{"nvidia.com/gpu":"1"}}}`)
	if _, err := c.CoreV1().Nodes().Patch(ctx, testNode.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	one := int32(1)
	labels := map[string]string{"app": "gpu-job"}
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "gpu-job", Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": testNode.Name},
				Containers: []corev1.Container{{Name: "job", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
					Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu}}},
			}}}}
	if _, err := c.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.AppsV1().ReplicaSets("default").Delete(context.Background(), rs.Name, metav1.DeleteOptions{})
	})
	var job *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=gpu-job"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		job = &pods.Items[0]
		return true, nil
	}); err != nil {
		t.Fatalf("the GPU job never ran on the node: %v", err)
	}
	w, err := c.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + job.Name, ResourceVersion: job.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	out := make(chan time.Time, 1)
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if ev.Type == watch.Deleted || (ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)) {
				out <- time.Now()
				return
			}
		}
	}()
	return out
}

// driverStopsOnAnEmptiedNode replaces the node's driver pod (replace: a `kubectl delete pod`, or a driver change by
// `helm upgrade`) while a GPU pod runs there, in real containers, and checks that the old driver's stop (the
// stand-in plays the upstream order: daemons, unload, unmount) started only after the GPU pod ended: the driver
// container's preStop (the image's sh) held it until the upgrade gate emptied the node. The DaemonSet's next pod
// (of image, when set) then takes the node over, and it validates and returns to service.
func driverStopsOnAnEmptiedNode(t *testing.T, ctx context.Context, image string, replace func(old *corev1.Pod)) {
	c := testNode.Cluster.Client
	if err := os.Remove(shutdownLog); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	jobEnded := gpuJob(t, ctx)
	old := driverPod(t, ctx)
	if old == nil {
		t.Fatal("no driver pod on the node")
	}
	start := time.Now()
	replace(old)
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		p := driverPod(t, ctx)
		if p == nil || p.UID == old.UID || !podReady(p) || (image != "" && p.Spec.Containers[0].Image != image) {
			return false, nil
		}
		n, err := c.CoreV1().Nodes().Get(ctx, testNode.Name, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable && n.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeDone), nil
	}); err != nil {
		describePods(t, ctx)
		t.Fatalf("the node was not taken over by a new driver pod, validated and uncordoned: %v", err)
	}
	t.Logf("node emptied, taken over by the next driver pod and back in service in %s", time.Since(start).Round(time.Second))

	var ended time.Time
	select {
	case ended = <-jobEnded:
	default:
		t.Fatal("the GPU job was never ended: the node was not emptied")
	}
	var steps []string
	for _, ev := range readShutdownLog(t) {
		if ev.pod != old.Name {
			continue
		}
		steps = append(steps, ev.event)
		if ev.event == "daemons-stopped" && ev.at.Before(ended) {
			t.Errorf("the old driver stopped its daemons at %s, while the GPU job ran (it ended at %s)", ev.at.Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano))
		}
	}
	if want := "daemons-stopped modules-unloaded driver-root-unmounted"; strings.Join(steps, " ") != want {
		t.Errorf("the old driver's stop went %v, want %s", steps, want)
	}
}

// driverPod is the node's live driver pod (nil when none).
func driverPod(t *testing.T, ctx context.Context) *corev1.Pod {
	t.Helper()
	pods, err := testNode.Cluster.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
