package drivermanager

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// testLease: the shortest timing a Lease allows (it stores whole seconds); renewals change the stored renew time
// (second precision) well within its duration, so a waiting manager never takes a live holder's Lease.
func testLease(identity string) Lease {
	return Lease{Identity: identity, Duration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
}

func (e *env) leasedOptions(identity string) *Options {
	o := e.options(newDigest)
	o.Lease = testLease(identity)
	if err := o.Validate(); err != nil {
		e.t.Fatal(err)
	}
	return o
}

func (e *env) lease() *coordinationv1.Lease {
	e.t.Helper()
	l, err := e.client.CoordinationV1().Leases(namespace).Get(context.Background(), LeaseName(nodeName), metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

type result struct {
	out string
	err error
}

func runAsync(o *Options) <-chan result {
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		err := o.Run(context.Background(), &out)
		done <- result{out.String(), err}
	}()
	return done
}

// TestTwoManagersOnOneNodeTakeTurns: two driver pods meet on a node (a pool's selector changed, or the previous pod
// stops slowly). The second manager waits for the first's Lease, changes nothing meanwhile, and then reads the
// node and host afresh: it finds the driver the first unloaded gone, and goes on from the first's result instead of
// starting a second drain over it.
func TestTwoManagersOnOneNodeTakeTurns(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	// reactors are set before any run (the fake's chain is not safe to change while in use)
	var counting atomic.Bool
	var nodeReads atomic.Int32
	e.client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if counting.Load() {
			nodeReads.Add(1)
		}
		return false, nil, nil
	})
	atCordon, hold := make(chan struct{}), make(chan struct{})
	first := e.leasedOptions("driver-pod-a")
	first.AfterStep = func(step string) error {
		if step == "cordon" {
			close(atCordon)
			<-hold
		}
		return nil
	}
	firstDone := runAsync(first)
	<-atCordon
	if l := e.lease(); ptr.Deref(l.Spec.HolderIdentity, "") != "driver-pod-a" {
		t.Fatalf("lease holder %q while the first manager runs, want driver-pod-a", ptr.Deref(l.Spec.HolderIdentity, ""))
	}
	writes := len(e.mutatingActions())
	counting.Store(true)
	secondDone := runAsync(e.leasedOptions("driver-pod-b"))
	// several retry periods and more than the Lease's duration: the first renews, so the second keeps waiting
	select {
	case r := <-secondDone:
		t.Fatalf("the second manager ran while the first held the lease: %v %s", r.err, r.out)
	case <-time.After(3 * time.Second):
	}
	counting.Store(false)
	if got := len(e.mutatingActions()); got != writes || nodeReads.Load() != 0 {
		t.Fatalf("the second manager touched the node while waiting: %d writes, %d node reads", got-writes, nodeReads.Load())
	}
	if s := state(e.node()); s != nodestate.PodDeletionRequired {
		t.Fatalf("state %q while the first is at its cordon step", s)
	}
	close(hold)
	r1 := <-firstDone
	if r1.err != nil || !strings.Contains(r1.out, "unloaded nvidia_drm") {
		t.Fatalf("first manager: %v %q", r1.err, r1.out)
	}
	var r2 result
	select {
	case r2 = <-secondDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the second manager did not run after the first released the lease")
	}
	if r2.err != nil || !strings.Contains(r2.out, "no NVIDIA driver loaded") {
		t.Fatalf("second manager: %v %q, want it to find the first's result (driver unloaded)", r2.err, r2.out)
	}
	n := e.node()
	if state(n) != nodestate.ValidationRequired || !nodestate.CordonedByUs(n) || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != "true" {
		t.Fatalf("state=%q ours=%v labels=%v after both, want validation-required, our cordon, operands resumed", state(n), nodestate.CordonedByUs(n), n.Labels)
	}
	if got := e.moduleCalls(); len(got) != 4 {
		t.Fatalf("delete_module calls %v: want one unload (by the first manager)", got)
	}
	if l := e.lease(); ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		t.Fatalf("lease still held by %q after both ended", *l.Spec.HolderIdentity)
	}
}

// TestKilledHoldersLeaseExpires: a manager killed mid-run (SIGKILL, node reboot) leaves its Lease held; the next
// manager waits until it expires, touching nothing, and then does the work.
func TestKilledHoldersLeaseExpires(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	now := metav1.NewMicroTime(time.Now())
	if _, err := e.client.CoordinationV1().Leases(namespace).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(nodeName), Namespace: namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed-driver-pod"), LeaseDurationSeconds: ptr.To[int32](2),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := runAsync(e.leasedOptions("driver-pod-b"))
	select {
	case r := <-done:
		t.Fatalf("ran over an unexpired lease after %s: %v %s", time.Since(start), r.err, r.out)
	case <-time.After(time.Second):
	}
	if got := e.mutatingActions(); len(got) != 0 {
		t.Fatalf("writes while the killed holder's lease is valid: %v", got)
	}
	r := <-done
	if r.err != nil || !strings.Contains(r.out, "unloaded") {
		t.Fatalf("after expiry: %v %q", r.err, r.out)
	}
	if waited := time.Since(start); waited < 2*time.Second {
		t.Fatalf("took over after %s, before the lease's 2s expired", waited)
	}
	if l := e.lease(); ptr.Deref(l.Spec.LeaseTransitions, 0) != 1 || ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		t.Fatalf("lease %+v: want one transition and released", l.Spec)
	}
}

// TestLosingTheLeaseIsAStop: a manager that can no longer renew its Lease (another took it, or the API server
// refuses it for the renew deadline) stops as on SIGTERM: nothing undone, no upgrade-failed, for the next manager
// to resume.
func TestLosingTheLeaseIsAStop(t *testing.T) {
	e := newEnv(t, gpuNode(map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true"}))
	var refuse atomic.Bool
	e.client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	atPause, hold := make(chan struct{}), make(chan struct{})
	o := e.leasedOptions("driver-pod-a")
	o.AfterStep = func(step string) error {
		if step == "pause" {
			close(atPause)
			<-hold
		}
		return nil
	}
	done := runAsync(o)
	<-atPause
	refuse.Store(true)
	time.Sleep(2 * time.Second) // past the renew deadline
	close(hold)
	r := <-done
	if r.err == nil || !errors.Is(r.err, errLeaseLost) || !strings.Contains(r.err.Error(), "stopped") {
		t.Fatalf("err = %v, want a stop naming the lost lease", r.err)
	}
	n := e.node()
	if state(n) != nodestate.PodRestartRequired || !nodestate.CordonedByUs(n) || n.Labels["nvidia.com/gpu.deploy.device-plugin"] != nodestate.Paused {
		t.Fatalf("state=%q ours=%v labels=%v: want the node left as the pause step left it", state(n), nodestate.CordonedByUs(n), n.Labels)
	}
	if _, ok := n.Annotations[nodestate.UpgradeReasonAnnotation]; ok {
		t.Fatalf("a failure reason was written: %q", n.Annotations[nodestate.UpgradeReasonAnnotation])
	}
	if got := e.moduleCalls(); len(got) != 0 {
		t.Fatalf("unloaded after losing the lease: %v", got)
	}
}

// TestStopWhileWaitingForTheLease: a pod stopped while another holds the Lease ends at once, having changed nothing.
func TestStopWhileWaitingForTheLease(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	now := metav1.NewMicroTime(time.Now())
	if _, err := e.client.CoordinationV1().Leases(namespace).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LeaseName(nodeName), Namespace: namespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("driver-pod-a"), LeaseDurationSeconds: ptr.To[int32](15), AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(300*time.Millisecond, func() { cancel(errSIGTERM) })
	err := e.leasedOptions("driver-pod-b").Run(ctx, &bytes.Buffer{})
	if !errors.Is(err, errSIGTERM) || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("err = %v", err)
	}
	if got := e.mutatingActions(); len(got) != 0 {
		t.Fatalf("writes: %v", got)
	}
}

func TestLeaseName(t *testing.T) {
	if got := LeaseName("gpu-1"); got != "kube-gpu-stack-driver-gpu-1" {
		t.Fatal(got)
	}
	long := strings.Repeat("n", 253)
	if got := LeaseName(long); len(got) != 253 || LeaseName(long+"x") == got {
		t.Fatalf("%d %q", len(got), got)
	}
}

// TestLeaseRefusedFailsAtOnce: a manager whose account may not read Leases says so at once, touching nothing,
// instead of retrying for ever.
func TestLeaseRefusedFailsAtOnce(t *testing.T) {
	e := newEnv(t, gpuNode(nil))
	e.client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), LeaseName(nodeName), errors.New("RBAC: access denied"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.leasedOptions("driver-pod-a").Run(ctx, &bytes.Buffer{})
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "leases get, create and update") || ctx.Err() != nil {
		t.Fatalf("err = %v (after the deadline: %v)", err, ctx.Err() != nil)
	}
	if got := e.mutatingActions(); len(got) != 0 {
		t.Fatalf("writes: %v", got)
	}
}
