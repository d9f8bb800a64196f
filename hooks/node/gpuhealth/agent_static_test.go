//go:build !cgo

package gpuhealth

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The shipped image is a static build: it cannot load NVML, and says so on the Node (Unknown) and in its log rather
// than reporting GPUs it never saw as healthy.
func TestStaticBuildReportsUnknown(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node"}})
	o := Options{NodeName: "gpu-node", Client: client, HostRoot: writeLib(t, t.TempDir())}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := o.Run(context.Background(), &log); !errors.Is(err, ErrNVMLNotBuiltIn) {
		t.Fatalf("Run: %v", err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "gpu-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != DefaultConditionType ||
		n.Status.Conditions[0].Status != corev1.ConditionUnknown || n.Status.Conditions[0].Reason != ReasonNVMLNotBuiltIn {
		t.Fatalf("conditions %+v", n.Status.Conditions)
	}
	if !strings.Contains(log.String(), "Unknown NVMLNotBuiltIn") || !strings.Contains(log.String(), "CGO_ENABLED=0") {
		t.Fatalf("log:\n%s", log.String())
	}
}
