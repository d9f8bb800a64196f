package e2e

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const migConfigLabel = "nvidia.com/mig.config"

// raceClient is the API client of `kube-gpu-stack seed-label` with an admin who labels the node right after the
// command's first read of it, so the command's write carries a stale resourceVersion.
type raceClient struct {
	kubernetes.Interface
	admin func()
}

func (c raceClient) CoreV1() typedcorev1.CoreV1Interface {
	return raceCore{c.Interface.CoreV1(), c.admin}
}

type raceCore struct {
	typedcorev1.CoreV1Interface
	admin func()
}

func (c raceCore) Nodes() typedcorev1.NodeInterface {
	return raceNodes{c.CoreV1Interface.Nodes(), c.admin}
}

type raceNodes struct {
	typedcorev1.NodeInterface
	admin func()
}

func (n raceNodes) Get(ctx context.Context, name string, o metav1.GetOptions) (*corev1.Node, error) {
	node, err := n.NodeInterface.Get(ctx, name, o)
	n.admin()
	return node, err
}

// TestMIGDefaultSeeding: the MIG manager's init container (`kube-gpu-stack seed-label`, rendered with
// migManager.config.default) gives a MIG-capable node without nvidia.com/mig.config the default and records that it
// did, leaves a label an admin set, and never overwrites one an admin sets between its read and its write: the real
// API server refuses the stale write and the retry sees the admin's value.
func TestMIGDefaultSeeding(t *testing.T) {
	e := useSmall(t)
	ctx := t.Context()
	node := func(name string, labels map[string]string) *corev1.Node {
		l := map[string]string{"nvidia.com/mig.capable": "true", "kubernetes.io/hostname": name}
		for k, v := range labels {
			l[k] = v
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	nodes := []*corev1.Node{node("mig-seed-bare", nil), node("mig-seed-admin", map[string]string{migConfigLabel: "all-1g.10gb"}),
		node("mig-seed-race", nil)}
	if err := e.kube.AddNodes(ctx, nodes...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = e.kube.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		}
	})
	get := func(name string) *corev1.Node {
		n, err := e.kube.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	var out bytes.Buffer
	if err := nodestate.SeedLabel(ctx, e.kube.Client, "mig-seed-bare", migConfigLabel, "all-disabled", &out); err != nil {
		t.Fatal(err)
	}
	if n := get("mig-seed-bare"); n.Labels[migConfigLabel] != "all-disabled" ||
		!strings.Contains(n.Annotations[nodestate.SeededLabelsAnnotation], `"nvidia.com/mig.config":"all-disabled"`) {
		t.Errorf("bare node: %s=%q, record %q; want the default, recorded", migConfigLabel, n.Labels[migConfigLabel], n.Annotations[nodestate.SeededLabelsAnnotation])
	}

	if err := nodestate.SeedLabel(ctx, e.kube.Client, "mig-seed-admin", migConfigLabel, "all-disabled", &out); err != nil {
		t.Fatal(err)
	}
	if n := get("mig-seed-admin"); n.Labels[migConfigLabel] != "all-1g.10gb" || n.Annotations[nodestate.SeededLabelsAnnotation] != "" {
		t.Errorf("admin-labelled node: %s=%q, record %q; want the admin's all-1g.10gb, unrecorded", migConfigLabel, n.Labels[migConfigLabel], n.Annotations[nodestate.SeededLabelsAnnotation])
	}

	var once sync.Once
	admin := func() {
		once.Do(func() {
			n := get("mig-seed-race")
			n.Labels[migConfigLabel] = "all-balanced"
			if _, err := e.kube.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Errorf("admin's label: %v", err)
			}
		})
	}
	out.Reset()
	if err := nodestate.SeedLabel(ctx, raceClient{e.kube.Client, admin}, "mig-seed-race", migConfigLabel, "all-disabled", &out); err != nil {
		t.Fatal(err)
	}
	if n := get("mig-seed-race"); n.Labels[migConfigLabel] != "all-balanced" || n.Annotations[nodestate.SeededLabelsAnnotation] != "" {
		t.Errorf("node labelled during the seed: %s=%q, record %q (%s); want the admin's all-balanced, unrecorded",
			migConfigLabel, n.Labels[migConfigLabel], n.Annotations[nodestate.SeededLabelsAnnotation], out.String())
	}
	if !strings.Contains(out.String(), "all-balanced kept") {
		t.Errorf("seed-label output %q does not say it kept the admin's value", out.String())
	}
}
