package rollout

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/nodecondition"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/rollouttest"
)

// optOutKey is the opt-out label of the release in this test, outside the stack's own prefixes.
const optOutKey = "remediation.example.com/skip"

// TestRemediationLeavesAPlannedDriverChangeAlone: with the GPU health agent on every node, a driver change of all ten
// nodes at once (maxUnavailable 100%) under a stub remediation controller quarantines no node, although the stub saw
// every node's driver unloaded; a fatal Xid on a node once its change is over quarantines that node.
//
// The stub acts as NVSentinel's quarantine does in its driver-upgrade runbook: a node whose GPUs it cannot reach (no
// driver loaded) or whose GPU health condition is False is quarantined, unless the condition says Maintenance. It
// only records; it does not cordon, so the rollout runs as it would. The opt-out label is checked on its own: on each
// node while its driver changes, gone after.
func TestRemediationLeavesAPlannedDriverChangeAlone(t *testing.T) {
	const tag = "600.50.01"
	ctx := t.Context()
	// installs of 5 s: each node's driver is unloaded for that long, which the stub, looking every 50 ms, cannot miss
	// on a loaded machine (with 1 s, a CI run saw nine of the ten)
	freshNodes(t, 5*time.Second)
	if err := kube.Client.PolicyV1().PodDisruptionBudgets(workloadNS).Delete(ctx, "train-"+pdbNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	gpus := map[string]*xidMonitor{}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		gpus[n] = &xidMonitor{}
		stand.SetGPUMonitor(n, gpus[n])
	}
	t.Cleanup(func() {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			stand.SetGPUMonitor(n, nil)
		}
	})
	// a minute for each GPU pod's eviction: a loaded machine ends pods slowly (a CI run failed a node whose workload
	// was still terminating after the package's 6 s), and this test is about the quarantines, not the eviction bound
	health := []string{"global.health.nodeCondition.enabled=true", "global.health.maintenance.label=" + optOutKey + "=true",
		"driver.manager.gpuPodDeletion.timeoutSeconds=60"}
	if _, err := target().Install(ctx, profile(), settings(health...)...); err != nil {
		logRuns(t, time.Time{})
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := target().Uninstall(); err != nil {
			t.Error(err)
		}
	})
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			logRuns(t, start)
		}
	})
	rollouttest.WaitFor(t, time.Minute, "every node's GPU health agent reporting healthy", func() (bool, string) {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			if c, _ := nodecondition.Find(rollouttest.Node(t, kube.Client, n), gpuhealth.DefaultConditionType); c.Reason != gpuhealth.ReasonHealthy {
				return false, fmt.Sprintf("%s: %s %s", n, c.Status, c.Reason)
			}
		}
		return true, ""
	})

	stub := watchRemediation(t)
	upgraded := make(chan error, 1)
	go func() {
		_, err := target().Upgrade(ctx, profile(), settings(append(health, "driver.image.tag="+tag, "driver.upgradePolicy.maxUnavailable=100%")...)...)
		upgraded <- err
	}()
	// the first node done with its change, its agent back: a real fault there
	var faulty string
	rollouttest.WaitFor(t, 3*time.Minute, "a node upgrade-done with the new driver and its agent healthy again", func() (bool, string) {
		for _, n := range rollouttest.GPUNodeNames(nodes) {
			node := rollouttest.Node(t, kube.Client, n)
			c, _ := nodecondition.Find(node, gpuhealth.DefaultConditionType)
			if stub.changed(n) && node.Labels[nodestate.UpgradeStateLabel] == string(nodestate.UpgradeDone) && c.Reason == gpuhealth.ReasonHealthy {
				faulty = n
				return true, ""
			}
		}
		return false, "none yet"
	})
	gpus[faulty].fatal.Store(true)
	t.Logf("fatal Xid on %s after its driver change, %s into the upgrade", faulty, time.Since(start).Round(100*time.Millisecond))
	rollouttest.WaitFor(t, 3*time.Minute, "every node upgrade-done with the new driver pod Ready", func() (bool, string) {
		return rolledOut(t, rollouttest.GPUNodeNames(nodes))
	})
	if err := <-upgraded; err != nil {
		t.Errorf("helm upgrade: %v", err)
	}
	rollouttest.WaitFor(t, 30*time.Second, faulty+" quarantined", func() (bool, string) {
		q := stub.report()
		return q.quarantined[faulty] != "", fmt.Sprintf("%+v", q.quarantined)
	})
	stub.stop()
	q := stub.report()
	t.Logf("rollout in %s; the stub saw the driver unloaded on %d nodes and would have quarantined %d without the Maintenance condition; quarantined: %v",
		time.Since(start).Round(100*time.Millisecond), len(q.sawDown), len(q.unaware), q.quarantined)
	if want := map[string]string{faulty: gpuhealth.ReasonFatalXid}; !maps.Equal(q.quarantined, want) {
		t.Errorf("quarantined %v, want %v: a planned driver change was taken for a fault, or the real fault was missed", q.quarantined, want)
	}
	// the proof is only as good as the stub's view: it must have seen every node without its driver
	if len(q.sawDown) != len(rollouttest.GPUNodeNames(nodes)) {
		t.Errorf("the stub saw the driver unloaded on %v only, want every GPU node", slices.Sorted(maps.Keys(q.sawDown)))
	}
	for _, n := range rollouttest.GPUNodeNames(nodes) {
		if !q.optedOut[n] {
			t.Errorf("%s never carried %s while its driver was unloaded", n, optOutKey)
		}
		node := rollouttest.Node(t, kube.Client, n)
		if _, ok := node.Labels[optOutKey]; ok {
			t.Errorf("%s still carries %s after its change", n, optOutKey)
		}
		if _, ok := node.Annotations[nodestate.MaintenanceLabelAnnotation]; ok {
			t.Errorf("%s still records the maintenance label", n)
		}
	}
}

// xidMonitor stands for NVML on one node: healthy GPUs until fatal is set, then an Xid 79.
type xidMonitor struct{ fatal atomic.Bool }

func (m *xidMonitor) Watch(ctx context.Context, _ string, _ gpuhealth.Policy, _ func(string, ...any), report func(gpuhealth.Verdict) error) error {
	last := ""
	for {
		v := gpuhealth.Judge(2, nil)
		if m.fatal.Load() {
			v = gpuhealth.Judge(2, []gpuhealth.Fault{{GPU: "GPU 1", Reason: gpuhealth.ReasonFatalXid, Xid: 79}})
		}
		if v.Reason != last {
			if err := report(v); err != nil {
				return err
			}
			last = v.Reason
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// remediation is the stub remediation controller's record.
type remediation struct {
	quarantined map[string]string // node -> why, the first time
	unaware     map[string]bool   // nodes a controller blind to Maintenance would have quarantined
	sawDown     map[string]bool   // nodes seen without a driver loaded
	optedOut    map[string]bool   // nodes seen carrying the opt-out label while their driver was unloaded
	states      map[string][]nodestate.UpgradeState
}

type remediationStub struct {
	mu   sync.Mutex
	r    remediation
	done chan struct{}
	quit context.CancelFunc
}

// watchRemediation starts the stub: every 50 ms it looks at every GPU node.
func watchRemediation(t *testing.T) *remediationStub {
	ctx, cancel := context.WithCancel(t.Context())
	s := &remediationStub{done: make(chan struct{}), quit: cancel, r: remediation{
		quarantined: map[string]string{}, unaware: map[string]bool{}, sawDown: map[string]bool{}, optedOut: map[string]bool{},
		states: map[string][]nodestate.UpgradeState{},
	}}
	go func() {
		defer close(s.done)
		gpu := rollouttest.GPUNodeNames(nodes)
		for ctx.Err() == nil {
			// one list a look, each node's driver read right after it
			list, err := kube.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range list.Items {
					if n := &list.Items[i]; slices.Contains(gpu, n.Name) {
						s.look(n, !stand.DriverLoaded(n.Name))
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *remediationStub) look(node *corev1.Node, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := nodestate.UpgradeState(node.Labels[nodestate.UpgradeStateLabel])
	if h := s.r.states[node.Name]; len(h) == 0 || h[len(h)-1] != st {
		s.r.states[node.Name] = append(h, st)
	}
	c, _ := nodecondition.Find(node, gpuhealth.DefaultConditionType)
	why := ""
	switch {
	case down:
		why = "GPUs unreachable: no driver loaded"
		s.r.sawDown[node.Name] = true
		if _, ok := node.Labels[optOutKey]; ok {
			s.r.optedOut[node.Name] = true
		}
	case c.Status == corev1.ConditionFalse:
		why = c.Reason
	default:
		return
	}
	s.r.unaware[node.Name] = true
	if c.Reason == nodestate.MaintenanceReason || s.r.quarantined[node.Name] != "" {
		return
	}
	s.r.quarantined[node.Name] = why
}

// changed says whether node went through a driver change since the stub started.
func (s *remediationStub) changed(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.r.states[node], nodestate.PodRestartRequired) || slices.Contains(s.r.states[node], nodestate.ValidationRequired)
}

// report is a copy of the record so far.
func (s *remediationStub) report() remediation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return remediation{quarantined: maps.Clone(s.r.quarantined), unaware: maps.Clone(s.r.unaware),
		sawDown: maps.Clone(s.r.sawDown), optedOut: maps.Clone(s.r.optedOut)}
}

func (s *remediationStub) stop() {
	s.quit()
	<-s.done
}
