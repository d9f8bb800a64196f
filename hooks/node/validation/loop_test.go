package validation

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// The driver container comes up while the check waits: the node says "waiting: <for what>" once, then "ready".
func TestWithWaitGoesFromWaitingToReady(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("driver")
	o.WithWait = true
	installDriver(t, e.driver)
	e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
	// the driver pod's startup probe: it writes .driver-ctr-ready once the node says the check waits for it
	e.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), "waiting: ") {
			writeFile(t, e.out, DriverCtrReadyFile, "GDS_ENABLED=false\n", 0o644)
		}
		return false, nil, nil
	})
	if err := e.run(o); err != nil {
		t.Fatalf("%v\n%s", err, e.log.String())
	}
	want := []string{
		"waiting: no host driver (no nvidia-smi under " + e.host + " in usr/bin, usr/sbin, bin, sbin, usr/lib/wsl/lib, opt/bin) " +
			"and the driver container is not ready (no .driver-ctr-ready in " + e.out + ")",
		"ready",
	}
	if got := e.recorded(); !slices.Equal(got, want) {
		t.Fatalf("recorded %q\nwant %q", got, want)
	}
	if _, ok := e.status("driver-ready"); !ok {
		t.Fatal("driver-ready not written")
	}
	log := e.log.String()
	if strings.Count(log, "driver: waiting") != 1 || !strings.Contains(log, "driver: ready") {
		t.Fatalf("log:\n%s", log)
	}
}

// Without WithWait one attempt decides; repeated attempts with one reason write the node once.
func TestWithWaitRecordsEachReasonOnceAndGivesUpWhenStopped(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("gds")
	o.WithWait = true
	writeFile(t, e.host, "proc/modules", "nvidia 1 0 - Live 0x0\n", 0o644)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := o.Run(ctx, &e.log)
	if err == nil || !strings.Contains(err.Error(), "gds check failed on node "+testNode) {
		t.Fatalf("err = %v", err)
	}
	got := e.recorded()
	if len(got) != 2 || got[0] != "waiting: kernel module nvidia_fs is not loaded ("+e.host+"/proc/modules)" ||
		!strings.HasPrefix(got[1], "failed: stopped after ") || !strings.HasSuffix(got[1], "while waiting: kernel module nvidia_fs is not loaded ("+e.host+"/proc/modules)") {
		t.Fatalf("recorded %q", got)
	}
	if e.annotation("gds") != got[1] {
		t.Fatalf("annotation %q", e.annotation("gds"))
	}
}

func TestNoNodeNameSkipsRecordingWithOneLine(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("rdma")
	o.NodeName = ""
	writeFile(t, e.host, "proc/modules", "nvidia_peermem 1 0 - Live 0x0\n", 0o644)
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if len(e.recorded()) != 0 {
		t.Fatalf("patched the node: %q", e.recorded())
	}
	if !strings.Contains(e.log.String(), "rdma: not recording the outcome on the Node") {
		t.Fatalf("log: %s", e.log.String())
	}
}

// A ServiceAccount that may not patch Nodes (the toolkit's driver validation) still validates, and stops asking.
func TestForbiddenRecordingDoesNotFailTheCheck(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("gds")
	o.WithWait = true
	calls := 0
	e.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		calls++
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, testNode, nil)
	})
	writeFile(t, e.host, "proc/modules", "", 0o644)
	go func() { // the module loads while the check waits, its first waiting record refused
		time.Sleep(50 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(e.host, "proc/modules"), []byte("nvidia_fs 1 0 - Live 0x0\n"), 0o444)
	}()
	if err := e.run(o); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("patched %d times after a Forbidden answer, want 1", calls)
	}
	if _, ok := e.status("nvidia-fs-ready"); !ok || !strings.Contains(e.log.String(), "could not record") {
		t.Fatalf("file %v, log %s", ok, e.log.String())
	}
}

func TestValidateNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Component: "nope"}, `unknown component "nope"`},
		{Options{Component: "cuda"}, "the cuda check runs a pod on this node and needs API access (in-cluster config), NODE_NAME, OPERATOR_NAMESPACE"},
		{Options{Component: "vfio-pci", DefaultWorkloadConfig: "vm"}, `DEFAULT_GPU_WORKLOAD_CONFIG "vm"`},
		{Options{Component: "plugin", MIGStrategy: "both"}, `MIG_STRATEGY "both"`},
	} {
		tc.o.Complete()
		if err := tc.o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.o.Component, err, tc.want)
		}
	}
}

func TestReadySaysSoAndBlocks(t *testing.T) {
	e := newEnv(t, nil)
	o := e.options("ready")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- o.Run(ctx, &e.log) }()
	select {
	case err := <-done:
		t.Fatalf("ready returned before its context ended: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil || e.log.String() != "all validations passed on "+testNode+"\n" {
		t.Fatalf("err %v, log %q", err, e.log.String())
	}
}

// A long reason (many unbound GPUs, a chatty tool) is cut, so the Node never carries a log.
func TestRecordedReasonsAreBounded(t *testing.T) {
	e := newEnv(t, nil)
	rec := &recorder{o: e.options("vfio-pci"), check: "vfio-pci", out: &e.log}
	rec.record(t.Context(), nodestate.Validation{State: nodestate.CheckWaiting, Reason: strings.Repeat("GPU 0000:3b:00.0 is bound to nouveau, not vfio-pci; ", 40)})
	got := e.annotation("vfio-pci")
	if len(got) > len("waiting: ")+maxReason+len("...") || !strings.HasSuffix(got, "...") || !strings.HasPrefix(got, "waiting: GPU 0000:3b:00.0") {
		t.Fatalf("annotation (%d bytes): %q", len(got), got)
	}
}
