package validation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

const testNode = "gpu-node-1"

// exitError is what a program that ran and failed returns (as *exec.ExitError does).
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitError) ExitCode() int { return int(e) }

// fakeRunner answers commands by path and records them.
type fakeRunner struct {
	mu      sync.Mutex
	answers map[string]answer // by Command.Root+Command.Path, else by Command.Path
	calls   []Command
}

type answer struct {
	out string
	err error
}

func (f *fakeRunner) Run(_ context.Context, c Command) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	a, ok := f.answers[c.Root+c.Path] // a program of one root
	if !ok {
		a, ok = f.answers[c.Path]
	}
	if !ok {
		return nil, fmt.Errorf("exec: %q: executable file not found in $PATH", c.Path)
	}
	return []byte(a.out), a.err
}

// env is one test's world: fixture host and driver roots, a validations dir, a fake API server holding the node.
type env struct {
	t       *testing.T
	host    string
	driver  string
	ctr     string // the validator container's own root (CtrRoot)
	devChar string // the host's /dev/char (DevCharDir)
	out     string
	client  *fake.Clientset
	runner  *fakeRunner
	nvml    *fakeNVML
	log     bytes.Buffer
	patches []string // validation annotation values, in the order they were written
	mu      sync.Mutex
	watches chan string // resource of each watch started
}

func newEnv(t *testing.T, node *corev1.Node) *env {
	t.Helper()
	e := &env{
		t:       t,
		host:    t.TempDir(),
		driver:  t.TempDir(),
		ctr:     t.TempDir(),
		devChar: t.TempDir(),
		out:     t.TempDir(),
		runner:  &fakeRunner{answers: map[string]answer{}},
		nvml:    newFakeNVML(),
		watches: make(chan string, 100),
	}
	if node == nil {
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{}}}
	}
	e.client = fake.NewClientset(node)
	e.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		body := string(a.(k8stesting.PatchAction).GetPatch())
		e.mu.Lock()
		e.patches = append(e.patches, body)
		e.mu.Unlock()
		return false, nil, nil
	})
	// the fake does not implement generateName
	n := 0
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" {
			n++
			pod.Name = fmt.Sprintf("%s%d", pod.GenerateName, n)
		}
		return false, nil, nil
	})
	// a watch is announced once it is registered: an object changed after that reaches it (the fake has no
	// resourceVersions, so a change between an informer's list and its watch would be lost)
	e.client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := e.client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err != nil {
			return true, nil, err
		}
		select {
		case e.watches <- a.GetResource().Resource:
		default:
		}
		return true, w, nil
	})
	return e
}

// options returns the component's Options over this env, completed.
func (e *env) options(component string) *Options {
	o := &Options{
		Component:        component,
		NodeName:         testNode,
		OutputDir:        e.out,
		HostRoot:         e.host,
		CtrRoot:          e.ctr,
		DevCharDir:       e.devChar,
		DriverInstallDir: e.driver,
		SleepInterval:    5 * time.Millisecond,
		Timeout:          2 * time.Second,
		Namespace:        "gpu-stack",
		Client:           e.client,
		Runner:           e.runner,
		NVML:             e.nvml.probe(),
	}
	o.Complete()
	if err := o.Validate(); err != nil {
		e.t.Fatal(err)
	}
	return o
}

// run runs the component and returns its error.
func (e *env) run(o *Options) error {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	return o.Run(ctx, &e.log)
}

// annotation is the check's outcome as recorded on the node ("" when none).
func (e *env) annotation(check string) string {
	e.t.Helper()
	node, err := e.client.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return node.Annotations[nodestate.ValidationAnnotationPrefix+check]
}

// recorded returns the validation values the node patches carried, in order.
func (e *env) recorded() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var vals []string
	for _, p := range e.patches {
		var doc struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal([]byte(p), &doc); err != nil {
			e.t.Errorf("patch %s: %v", p, err)
		}
		for k, v := range doc.Metadata.Annotations {
			if strings.HasPrefix(k, nodestate.ValidationAnnotationPrefix) {
				vals = append(vals, v)
			}
		}
	}
	return vals
}

// writeFile writes a file under root (directories made), returning its path.
func writeFile(t *testing.T, root, rel, data string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// status reads a status file; ok is false when it does not exist.
func (e *env) status(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(e.out, name))
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b), true
}

// installDriver lays out a driver (nvidia-smi and libnvidia-ml.so.1) under root.
func installDriver(t *testing.T, root string) {
	t.Helper()
	writeFile(t, root, "usr/bin/nvidia-smi", "#!/bin/sh\n", 0o755)
	writeFile(t, root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07", "elf", 0o755)
	if err := os.Symlink("libnvidia-ml.so.595.91.07", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
}

// pciDevice lays out a PCI device in the host's sysfs as nvpci reads it: bound to driver ("" for none);
// physfn names the PF of a VF.
type pciDevice struct {
	addr, vendor, class, driver, physfn string
	numVFs                              int
	vgpuType                            string
}

func addPCI(t *testing.T, host string, d pciDevice) {
	t.Helper()
	dev := filepath.Join("sys/bus/pci/devices", d.addr)
	writeFile(t, host, filepath.Join(dev, "vendor"), d.vendor+"\n", 0o444)
	writeFile(t, host, filepath.Join(dev, "class"), d.class+"\n", 0o444)
	writeFile(t, host, filepath.Join(dev, "device"), "0x2330\n", 0o444)
	writeFile(t, host, filepath.Join(dev, "numa_node"), "-1\n", 0o444)
	writeFile(t, host, filepath.Join(dev, "resource"), "0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n", 0o444)
	if d.driver != "" {
		drv := filepath.Join(host, "sys/bus/pci/drivers", d.driver)
		if err := os.MkdirAll(drv, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(drv, filepath.Join(host, dev, "driver")); err != nil {
			t.Fatal(err)
		}
	}
	if d.physfn != "" {
		if err := os.Symlink(filepath.Join(host, "sys/bus/pci/devices", d.physfn), filepath.Join(host, dev, "physfn")); err != nil {
			t.Fatal(err)
		}
	} else if d.numVFs > 0 {
		writeFile(t, host, filepath.Join(dev, "sriov_totalvfs"), "16\n", 0o444)
		writeFile(t, host, filepath.Join(dev, "sriov_numvfs"), fmt.Sprintf("%d\n", d.numVFs), 0o444)
	}
	if d.vgpuType != "" {
		writeFile(t, host, filepath.Join(dev, "nvidia/current_vgpu_type"), d.vgpuType+"\n", 0o444)
	}
}

func nodeWith(labels map[string]string, allocatable corev1.ResourceList) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: labels},
		Status:     corev1.NodeStatus{Capacity: allocatable, Allocatable: allocatable},
	}
}
