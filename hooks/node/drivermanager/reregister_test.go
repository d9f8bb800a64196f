package drivermanager

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/kmod/kmodtest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// (e *env) knownNode leaves the node's Lease behind, as every earlier driver manager run on the node does.
func (e *env) knownNode() {
	e.t.Helper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(nodeName), Namespace: namespace,
		Labels: map[string]string{nodestate.DriverManagerLeaseLabel: "true"}}}
	if _, err := e.client.CoordinationV1().Leases(namespace).Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// registerAgain deletes the Node object and creates it bare, as the kubelet registers a node whose object was
// deleted: every label and annotation the stack wrote is gone, the host is as it was.
func (e *env) registerAgain() {
	e.t.Helper()
	ctx := context.Background()
	if err := e.client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Nodes().Create(ctx, gpuNode(nil), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// A node whose new driver failed validation, its Node object deleted and registered again, its driver pod
// recreated: the Node no longer says the driver failed, and the host has the new pod's digest, which the fast path
// takes as "this driver is in service". The driver never validated: the node is cordoned and validation-required,
// nothing evicted or unloaded, and it returns to workloads only once its validator turned Ready after now.
func TestNodeRegisteredAgainValidatesBeforeWorkloadsReturn(t *testing.T) {
	e := failValidation(t)
	e.registerAgain()
	before := len(e.moduleCalls())
	out, err := e.run(e.options(newDigest))
	if err != nil {
		t.Fatal(err)
	}
	if calls := e.moduleCalls()[before:]; len(calls) != 0 {
		t.Fatalf("unloaded %v: the loaded driver is only to be validated", calls)
	}
	n := e.node()
	if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) {
		t.Fatalf("state=%q unschedulable=%v ours=%v; want validation-required under our cordon\n%s", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n), out)
	}
	if !strings.Contains(out, "registered again") {
		t.Errorf("summary does not say why the node waits: %q", out)
	}
	// a validator Ready from before the registration vouches for nothing
	validatorReady(t, e, e.clock().Add(-time.Minute))
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 300 * time.Millisecond, Now: e.clock}
	o.Complete()
	if err := o.Run(context.Background(), &bytes.Buffer{}); err == nil {
		t.Fatal("a validator Ready before the node came back passed the gate")
	}
	if n := e.node(); state(n) != nodestate.UpgradeFailed || !n.Spec.Unschedulable {
		t.Fatalf("state=%q unschedulable=%v; want upgrade-failed again, cordoned", state(n), n.Spec.Unschedulable)
	}
}

// The same node whose driver does validate after it came back returns to workloads.
func TestNodeRegisteredAgainReturnsOnceItValidates(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	e.knownNode()
	e.host.DriverState(newDigest)
	if _, err := e.run(e.options(newDigest)); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.ValidationRequired || !nodestate.CordonedByUs(n) {
		t.Fatalf("state=%q ours=%v; want validation-required under our cordon", state(n), nodestate.CordonedByUs(n))
	}
	validatorReady(t, e, e.clock().Add(time.Minute))
	if err := uncordon(e); err != nil {
		t.Fatal(err)
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable || nodestate.CordonedByUs(n) {
		t.Fatalf("state=%q unschedulable=%v; want upgrade-done and schedulable", state(n), n.Spec.Unschedulable)
	}
}

// A node the release never saw (no Lease: a first install over a loaded driver of ours, or a reinstall after the
// pre-delete cleanup) keeps its driver in service at once; so does a known node whose records are there.
func TestNodeTheReleaseKnowsOrNeverSawKeepsItsValidatedDriverInService(t *testing.T) {
	for name, setup := range map[string]func(e *env){
		"never seen": func(e *env) {},
		"known, records kept": func(e *env) {
			e.knownNode()
			if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.RecordDriverDigest(e.node(), newDigest)); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, gpuNode(nil))
			setup(e)
			e.host.DriverState(newDigest)
			if _, err := e.run(e.options(newDigest)); err != nil {
				t.Fatal(err)
			}
			if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
				t.Fatalf("state=%q unschedulable=%v; want upgrade-done and schedulable", state(n), n.Spec.Unschedulable)
			}
		})
	}
}

// The gate of a failed node holds its pod un-Ready until the node leaves upgrade-failed. When the Node object is
// deleted and registered again meanwhile (the driver pod kept: the pod garbage collector waits before it deletes a
// gone node's pods), the node comes back without its failure: the gate does not take that for a retry that
// passed. The node is cordoned and validation-required, and returns to workloads only after a fresh validation.
func TestFailedNodesGateHoldsThroughARegistration(t *testing.T) {
	e := failValidation(t)
	ready := filepath.Join(t.TempDir(), "driver-validated")
	o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 5 * time.Second, ReadyFile: ready, Now: e.clock}
	o.Complete()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	out := &bytes.Buffer{}
	go func() { done <- o.Run(ctx, out) }()
	time.Sleep(300 * time.Millisecond)
	e.registerAgain()
	waitUntil(t, "the node cordoned and validation-required again", func() bool {
		n := e.node()
		return state(n) == nodestate.ValidationRequired && nodestate.CordonedByUs(n) && n.Spec.Unschedulable
	})
	if _, err := os.Stat(ready); err == nil {
		t.Fatal("the gate turned its pod Ready on a node that came back without its failure")
	}
	validatorReady(t, e, e.clock().Add(time.Minute))
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the gate did not finish once the node validated")
	}
	if n := e.node(); state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
		t.Fatalf("state=%q unschedulable=%v; want upgrade-done and schedulable", state(n), n.Spec.Unschedulable)
	}
}

// Registered again mid-change, after its driver was unloaded: the node is held as one that kept its driver is,
// cordoned until the driver that installs next validates. A node the release never saw is not (a first install:
// its GPUs are advertised only once the stack's device plugin runs on a validated driver).
func TestNodeRegisteredAgainWithoutADriverIsCordonedUntilItValidates(t *testing.T) {
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("known=%v", known), func(t *testing.T) {
			f := kmodtest.New(t)
			e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
			if known {
				e.knownNode()
			}
			if _, err := e.run(e.options(newDigest)); err != nil {
				t.Fatal(err)
			}
			n := e.node()
			if state(n) != nodestate.ValidationRequired || nodestate.CordonedByUs(n) != known || n.Spec.Unschedulable != known {
				t.Fatalf("state=%q cordoned by us=%v; want validation-required, cordoned %v", state(n), nodestate.CordonedByUs(n), known)
			}
		})
	}
}

// markUpgradeRequired writes what a plan that ran since writes on a node it finds bare: upgrade-required, and no
// driver record.
func (e *env) markUpgradeRequired() {
	e.t.Helper()
	if _, err := nodestate.Apply(context.Background(), e.client, nodeName, nodestate.SetUpgradeState(e.node(), nodestate.UpgradeRequired, "pool default driver config a -> b", e.clock().UTC().Format(time.RFC3339))); err != nil {
		e.t.Fatal(err)
	}
}

// Registered again mid-change, then marked upgrade-required by a plan before the next driver pod ran: the plan's
// mark does not make the node one whose driver is in service. With the new driver loaded (it never validated) or
// with none, the node waits for validation cordoned; without this, it waited schedulable.
func TestNodeRegisteredAgainAndMarkedByAPlanValidatesCordoned(t *testing.T) {
	for _, loaded := range []bool{true, false} {
		t.Run(fmt.Sprintf("driver loaded=%v", loaded), func(t *testing.T) {
			f := kmodtest.New(t)
			e := &env{t: t, host: f, client: fake.NewClientset(gpuNode(nil))}
			e.knownNode()
			if loaded {
				e.host.DriverState(newDigest)
			}
			e.markUpgradeRequired()
			out, err := e.run(e.options(newDigest))
			if err != nil {
				t.Fatal(err)
			}
			n := e.node()
			if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || n.Annotations[nodestate.CordonedAnnotation] != ReregisteredCordon {
				t.Fatalf("state=%q unschedulable=%v cordon %q; want validation-required under the registration's cordon\n%s", state(n), n.Spec.Unschedulable, n.Annotations[nodestate.CordonedAnnotation], out)
			}
		})
	}
}

// A change interrupted before its cordon was written (a killed run, or an admin's uncordon) with the pod's driver
// already loaded: the driver has not validated on the node, so it waits cordoned. The same state with the driver
// that last validated there (a rollback's template came back before its plan called the node off) is in service.
func TestInterruptedChangeWithItsDriverLoadedValidatesCordonedUnlessThatDriverValidatedHere(t *testing.T) {
	for name, validated := range map[string]string{"not validated here": oldDigest, "validated here": newDigest} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, gpuNode(nil))
			e.knownNode()
			e.host.DriverState(newDigest)
			n := e.node()
			p := nodestate.Merge(nodestate.SetUpgradeState(n, nodestate.CordonRequired, "pool default driver config a -> b", e.clock().UTC().Format(time.RFC3339)),
				nodestate.RecordDriverDigest(n, newDigest), nodestate.SetValidated(n, validated))
			if _, err := nodestate.Apply(context.Background(), e.client, nodeName, p); err != nil {
				t.Fatal(err)
			}
			out, err := e.run(e.options(newDigest))
			if err != nil {
				t.Fatal(err)
			}
			n = e.node()
			if validated == newDigest {
				if state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable {
					t.Fatalf("state=%q unschedulable=%v; want upgrade-done in service\n%s", state(n), n.Spec.Unschedulable, out)
				}
				return
			}
			if state(n) != nodestate.ValidationRequired || !n.Spec.Unschedulable || !nodestate.CordonedByUs(n) {
				t.Fatalf("state=%q unschedulable=%v ours=%v; want validation-required under our cordon\n%s", state(n), n.Spec.Unschedulable, nodestate.CordonedByUs(n), out)
			}
		})
	}
}

// A node registered again keeps its loaded driver; the validator that turned Ready after the Node object came back
// (between the registration and the driver manager's run) ran against that driver and vouches for it; one Ready
// before the registration does not. The clock started at the manager's run instead refused the former, and the
// gate waited for a validator that never came.
func TestValidatorReadySinceTheRegistrationVouches(t *testing.T) {
	for name, tc := range map[string]struct {
		readyBefore time.Duration // the validator's Ready, this long before the manager's run
		passes      bool
	}{
		"Ready after the registration":  {time.Minute, true},
		"Ready before the registration": {3 * time.Minute, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, gpuNode(nil))
			e.knownNode()
			n := e.node()
			n.CreationTimestamp = metav1.NewTime(e.clock().Add(-2 * time.Minute).Truncate(time.Second))
			if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.host.DriverState(newDigest)
			if _, err := e.run(e.options(newDigest)); err != nil {
				t.Fatal(err)
			}
			validatorReady(t, e, e.clock().Add(-tc.readyBefore))
			o := UncordonOptions{Client: e.client, NodeName: nodeName, Namespace: namespace, Timeout: 300 * time.Millisecond, Now: e.clock}
			o.Complete()
			err := o.Run(context.Background(), &bytes.Buffer{})
			if tc.passes != (err == nil) {
				t.Fatalf("gate: %v; want it to pass %v", err, tc.passes)
			}
			if n := e.node(); tc.passes && (state(n) != nodestate.UpgradeDone || n.Spec.Unschedulable) {
				t.Fatalf("state=%q unschedulable=%v; want upgrade-done and schedulable", state(n), n.Spec.Unschedulable)
			}
		})
	}
}
