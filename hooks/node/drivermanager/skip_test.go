package drivermanager

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// setSkip sets (or, with "", removes) the skip label on the node, as an admin does.
func (e *env) setSkip(value string) error {
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if value == "" {
		delete(n.Labels, nodestate.UpgradeSkipLabel)
	} else {
		n.Labels[nodestate.UpgradeSkipLabel] = value
	}
	_, err = e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	return err
}

// The admin holds a node back (the skip label) while its old pod's gate empties it: the old driver never stopped,
// so the node goes back into service with it (uncordoned, operands resumed, its slot given back), and its driver pod
// stays. Once the label goes, the change starts over.
func TestSkipLabelSetWhileEmptyingPutsTheOldDriverBackInService(t *testing.T) {
	e := newEnv(t, planned(nodeName, nodestate.UpgradeRequired, slotMark))
	e.withGPUPod(nil)
	e.withDriverPod(newDigest)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	labelled := false
	done, out := e.gateWith(ctx, false, 3*time.Second, func(step string) error {
		if step == "operands" && !labelled {
			labelled = true
			return e.setSkip("true")
		}
		return nil
	})
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	waitUntil(t, "the node back in service", func() bool {
		n := e.node()
		return labelled && !n.Spec.Unschedulable && state(n) == nodestate.UpgradeRequired
	})
	time.Sleep(200 * time.Millisecond)
	if got := e.evictionsOf(); slices.Contains(got, driverPod) {
		t.Fatalf("evictions %v: the held node's old driver pod was evicted", got)
	}
	n := e.node()
	if n.Labels[nodestate.DeployLabelPrefix+"device-plugin"] == nodestate.Paused || nodestate.CordonedByUs(n) {
		t.Fatalf("held node: device plugin %q, cordoned by us %v; want its operands and scheduling back", n.Labels[nodestate.DeployLabelPrefix+"device-plugin"], nodestate.CordonedByUs(n))
	}
	if !strings.Contains(n.Annotations[nodestate.UpgradeReasonAnnotation], nodestate.UpgradeSkipLabel) {
		t.Errorf("reason %q does not name the skip label", n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if err := e.setSkip(""); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the driver pod's eviction once the label went", func() bool { return slices.Contains(e.evictionsOf(), driverPod) })
	cancel()
	<-done
}

// Once the old driver pod is gone (the node emptied, cordoned and paused for the new pod), the skip label no longer
// holds the change: there is no old driver left to keep in service, and holding would keep the node out of service
// for as long as the label stays. The change finishes; the label holds the next one.
func TestSkipLabelSetAfterTheOldDriverWentDoesNotStrandTheNode(t *testing.T) {
	n := planned(nodeName, nodestate.PodRestartRequired, slotMark)
	n.Labels[nodestate.UpgradeSkipLabel] = "true"
	n.Spec.Unschedulable = true
	n.Annotations[nodestate.CordonedAnnotation] = "driver upgrade"
	e := newEnv(t, n)
	o := e.options(newDigest)
	o.SkipWait = 300 * time.Millisecond
	if out, err := e.run(o); err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if mods := e.host.LoadedModules(); len(mods) != 0 {
		t.Errorf("loaded modules %v: the change did not finish", mods)
	}
	if got := state(e.node()); got != nodestate.ValidationRequired {
		t.Errorf("state %q, want validation-required", got)
	}
	if e.node().Labels[nodestate.UpgradeSkipLabel] != "true" {
		t.Error("the admin's label was removed")
	}
}

// TestUpgradeFailedNodeIsRefusedUntilRetry: a restarted driver pod on a node whose driver change failed does not
// try again on its own (cordoning and evicting every back-off period); it keeps the loaded driver and names the
// way out.
func TestUpgradeFailedNodeIsRefusedUntilRetry(t *testing.T) {
	node := gpuNode(map[string]string{nodestate.UpgradeStateLabel: string(nodestate.UpgradeFailed)})
	node.Annotations = map[string]string{nodestate.UpgradeReasonAnnotation: "evict GPU pods: PDB training-pdb"}
	e := newEnv(t, node)
	_, err := e.run(e.options(newDigest))
	if err == nil || !strings.Contains(err.Error(), "upgrade retry "+nodeName) || !strings.Contains(err.Error(), "PDB training-pdb") {
		t.Fatalf("err = %v, want a refusal naming the reason and `upgrade retry`", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a refused run wrote to the API: %v", acts)
	}
	if calls := e.host.Kernel.CallList(); len(calls) != 0 {
		t.Errorf("a refused run touched the kernel: %v", calls)
	}
	// once retried (state upgrade-required) the change goes ahead
	n := e.node()
	n.Labels[nodestate.UpgradeStateLabel] = string(nodestate.UpgradeRequired)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := e.run(e.options(newDigest)); err != nil {
		t.Fatalf("after retry: %v\n%s", err, out)
	}
	if got := e.node().Labels[nodestate.UpgradeStateLabel]; got != string(nodestate.ValidationRequired) {
		t.Errorf("after retry: state %q, want validation-required", got)
	}
}

// TestSkipLabelKeepsTheDriverUntilRemoved: on a node labelled to skip driver upgrades the manager changes
// nothing and waits; removing the label lets the change go ahead in the same run.
func TestSkipLabelKeepsTheDriverUntilRemoved(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{nodestate.UpgradeSkipLabel: "true"}))
	o := e.options(newDigest)
	o.SkipWait = 300 * time.Millisecond
	if _, err := e.run(o); err == nil || !strings.Contains(err.Error(), nodestate.UpgradeSkipLabel+"=true") {
		t.Fatalf("err = %v, want the skip label named", err)
	}
	if acts := e.mutatingActions(); len(acts) != 0 {
		t.Errorf("a skipped node was written to: %v", acts)
	}
	if mods := e.host.LoadedModules(); len(mods) != 4 {
		t.Errorf("loaded modules %v, want the driver kept", mods)
	}

	o.SkipWait = 0
	done := make(chan error, 1)
	go func() { _, err := e.run(o); done <- err }()
	time.Sleep(200 * time.Millisecond)
	n := e.node()
	delete(n.Labels, nodestate.UpgradeSkipLabel)
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the label went: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager kept waiting after the skip label was removed")
	}
	if mods := e.host.LoadedModules(); len(mods) != 0 {
		t.Errorf("loaded modules %v after the change, want none", mods)
	}
}
