package upgradeplan

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/nodestate/nodestatetest"
)

// `upgrade retry` decides from the node as it is when it writes: a node that left upgrade-failed after the
// command read it (its gate finished it, an admin moved it) is not sent back to upgrade-required.
func TestRetryDecidesFromTheNodeAsWritten(t *testing.T) {
	client := fake.NewClientset(readyNode("gpu-1", map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)}))
	v := nodestatetest.Versioned(client)
	edited := false
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !edited {
			edited = true
			if err := v.Edit("gpu-1", func(n *corev1.Node) { n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeDone) }); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	err := Retry(context.Background(), client, "gpu", "rel", "gpu-1", time.Now(), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "not upgrade-failed") {
		t.Fatalf("err = %v; want a refusal: the node is upgrade-done now", err)
	}
	n, _ := nodestate.Get(context.Background(), client, "gpu-1")
	if got := n.Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.UpgradeDone) {
		t.Fatalf("state %q; the retry clobbered upgrade-done", got)
	}
}
