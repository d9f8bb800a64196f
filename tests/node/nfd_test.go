package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// nfdImage is the reference NFD's image is built and imported under: a registry of this test's, so the source
// build is never taken for upstream's image; its contract row is upstream's (registries are not part of a row).
const nfdImage = "kube-gpu-stack.test/nfd/node-feature-discovery:v0.19.0"

// gpuPresent is the label the chart's NodeFeatureRule gives a node with an NVIDIA display or 3D controller.
const gpuPresent = "nvidia.com/gpu.present"

// Node Feature Discovery, built from its source at the chart's version (ci/build-nfd.sh), deployed by the chart
// (nfd.mode bundled) on the real node: nfd-worker finds the node's features and publishes its NodeFeature,
// nfd-master applies the chart's NodeFeatureRule to it and labels the Node nvidia.com/gpu.present=true. The only
// fixture is the worker's sysfs: a tree with one NVIDIA 3D controller (10de, class 0302), where this machine has
// no GPU; its other host folders (os-release, /boot, /lib, ...) are this machine's.
func TestNFDLabelsNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := testNode.Cluster.Client

	start := time.Now()
	dir, err := BuildNFD(ctx, testNode.ModuleDir, testNode.Log)
	if errors.Is(err, ErrMissing) && os.Getenv("CI") != "true" {
		t.Skipf("SKIP: NFD cannot be built here (CI=true makes this a failure): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	g, err := NFDImage(nfdImage, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testNode.ImportImage(ctx, g); err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, f := range g.Files {
		if info, err := os.Stat(f); err == nil {
			size += info.Size()
		}
	}
	t.Logf("NFD built (or reused) and its image (%d binaries, %.1f MB) imported in %s", len(g.Files), float64(size)/1e6,
		time.Since(start).Round(100*time.Millisecond))

	sys := filepath.Join(testNode.Dir, "nfd-host", "sys")
	if err := PCIDevice(sys, NVIDIAGPU); err != nil {
		t.Fatal(err)
	}
	// The harness registers the node with the labels NFD would give it, for the tests that run without NFD: here
	// they go, so that only NFD can put them back; the node gets its registration labels again afterwards.
	restore := unlabelNode(t, ctx)
	t.Cleanup(restore)

	target := install.Target{Kubeconfig: testNode.Cluster.Kubeconfig, Release: "kgs-nfd", Namespace: namespace,
		Timeout: 5 * time.Minute, PostRenderer: workerSysfs(sys)}
	start = time.Now()
	if _, err := target.Install(ctx, []string{nfdValues(t)}); err != nil {
		describePods(t, ctx)
		t.Fatalf("install: %v", err)
	}
	t.Logf("helm install --wait (NFD master, worker and gc Ready) took %s", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if err := target.Uninstall(); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})

	var node *corev1.Node
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, testNode.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return n.Labels[gpuPresent] == "true", nil
	})
	if err != nil {
		describePods(t, ctx)
		logNodeFeature(t, ctx)
		t.Fatalf("the node did not get %s=true from NFD and the chart's NodeFeatureRule: %v; its labels: %v", gpuPresent, err, node.Labels)
	}
	t.Logf("node labelled %s=true %s after the install began", gpuPresent, time.Since(start).Round(100*time.Millisecond))

	// the worker's own labels, from the chart's worker config (pci deviceLabelFields: [vendor]) ...
	if got := node.Labels["feature.node.kubernetes.io/pci-10de.present"]; got != "true" {
		t.Errorf("feature.node.kubernetes.io/pci-10de.present = %q, want true (the chart's worker config)", got)
	}
	// ... and from this machine's own /etc/os-release, which the worker reads as it does on any node
	if want := osReleaseID(t); node.Labels["feature.node.kubernetes.io/system-os_release.ID"] != want {
		t.Errorf("feature.node.kubernetes.io/system-os_release.ID = %q, want %q (this machine's /etc/os-release)",
			node.Labels["feature.node.kubernetes.io/system-os_release.ID"], want)
	}
	// the worker's NodeFeature went through the chart's admission policy (each feature writer: its own node's only)
	policies, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(policies.Items, func(b admissionv1.ValidatingAdmissionPolicyBinding) bool {
		return strings.HasPrefix(b.Name, "kube-gpu-stack-node-scope-")
	}) {
		t.Error("the chart's admission policy is not bound: the worker's NodeFeature went unchecked")
	}
	overwriteRefused(t, ctx)
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, ctr := range p.Spec.Containers {
			logs, _ := c.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name}).DoRaw(ctx)
			if strings.Contains(string(logs), "is forbidden") {
				t.Errorf("pod %s: container %s was refused by the API server (RBAC):\n%s", p.Name, ctr.Name, logs)
			}
			// what the worker missed in the fixture sysfs (and anything else a daemon complains of), for the reader
			for _, l := range strings.Split(string(logs), "\n") {
				if strings.HasPrefix(l, "E") {
					t.Logf("%s: %s", ctr.Name, l)
				}
			}
		}
	}
}

// nfdValues turns on the bundled NFD, from the image built here, and turns off every operand (none is needed to
// label a node) and the post-install gate (it waits for GPU operands).
func nfdValues(t *testing.T) string {
	registry, rest, _ := strings.Cut(nfdImage, "/")
	repo, tag, _ := strings.Cut(rest, ":")
	values := fmt.Sprintf(`global:
  stackImage: {tag: %q, pullPolicy: Never}
  hostPaths: {kubeletRootDir: %s}
nfd:
  mode: bundled
  image: {registry: %s, repository: %s, tag: %s}
driver: {enabled: false}
toolkit: {enabled: false}
devicePlugin: {enabled: false}
dcgmExporter: {enabled: false}
gfd: {enabled: false}
migManager: {enabled: false}
validator: {enabled: false}
hooks:
  validation: {enabled: false}
`, projectTag, testNode.KubeletRoot(), registry, repo, tag)
	path := filepath.Join(t.TempDir(), "nfd.yaml")
	if err := os.WriteFile(path, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// workerSysfs is the test's post-renderer: it points the host-sys volume of the chart's nfd-worker DaemonSet at the
// fixture sysfs sys, and fails when the render has no such volume. Nothing else of the render changes.
type workerSysfs string

func (sys workerSysfs) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	found := false
	out, err := editDaemonSets(in, func(ds *appsv1.DaemonSet) bool {
		if !runs(ds.Spec.Template.Spec, "nfd-worker") {
			return false
		}
		for i, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == "host-sys" && v.HostPath != nil {
				ds.Spec.Template.Spec.Volumes[i].HostPath.Path = string(sys)
				found = true
			}
		}
		return found
	})
	if err == nil && !found {
		err = errors.New("post-render: no nfd-worker DaemonSet with a host-sys hostPath volume in the render")
	}
	return out, err
}

// editDaemonSets is a post-renderer's walk of a render: edit sees each DaemonSet and says whether it changed it; the
// render comes back with those DaemonSets as edit left them and every other document as it was.
func editDaemonSets(in *bytes.Buffer, edit func(*appsv1.DaemonSet) bool) (*bytes.Buffer, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(in))
	var out bytes.Buffer
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err == nil && ds.Kind == "DaemonSet" && edit(&ds) {
			if doc, err = yaml.Marshal(ds); err != nil {
				return nil, err
			}
		}
		out.WriteString("---\n")
		out.Write(doc)
		if !bytes.HasSuffix(doc, []byte("\n")) {
			out.WriteString("\n")
		}
	}
	return &out, nil
}

func runs(pod corev1.PodSpec, binary string) bool {
	return slices.ContainsFunc(pod.Containers, func(c corev1.Container) bool { return slices.Contains(c.Command, binary) })
}

// unlabelNode removes the node's NFD-made labels (the feature.node.kubernetes.io/ ones and gpu.present, which the
// harness set at registration) and returns the func that gives the node back its labels as they were, without
// what NFD added meanwhile (its labels and its nfd.node.kubernetes.io/ annotations).
func unlabelNode(t *testing.T, ctx context.Context) func() {
	c := testNode.Cluster.Client
	n, err := c.CoreV1().Nodes().Get(ctx, testNode.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	saved := n.Labels
	nfdMade := func(k string) bool {
		return k == gpuPresent || strings.HasPrefix(k, "feature.node.kubernetes.io/")
	}
	remove := map[string]any{}
	for k := range saved {
		if nfdMade(k) {
			remove[k] = nil
		}
	}
	patch(t, ctx, map[string]any{"labels": remove})
	return func() {
		n, err := c.CoreV1().Nodes().Get(context.Background(), testNode.Name, metav1.GetOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		labels, annotations := map[string]any{}, map[string]any{}
		for k := range n.Labels {
			if _, ok := saved[k]; !ok {
				labels[k] = nil
			}
		}
		for k, v := range saved {
			labels[k] = v
		}
		for k := range n.Annotations {
			if strings.HasPrefix(k, "nfd.node.kubernetes.io/") {
				annotations[k] = nil
			}
		}
		patch(t, context.Background(), map[string]any{"labels": labels, "annotations": annotations})
	}
}

func patch(t *testing.T, ctx context.Context, metadata map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": metadata})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testNode.Cluster.Client.CoreV1().Nodes().Patch(ctx, testNode.Name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Errorf("patch node %s: %v", testNode.Name, err)
	}
}

// osReleaseID is this machine's os-release ID.
func osReleaseID(t *testing.T) string {
	raw, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "ID="); ok {
			return strings.Trim(v, `"`)
		}
	}
	t.Fatal("/etc/os-release has no ID")
	return ""
}

// logNodeFeature logs the node's NodeFeature objects' PCI devices: what the worker published, for a failure.
func logNodeFeature(t *testing.T, ctx context.Context) {
	dyn, err := dynamic.NewForConfig(testNode.Cluster.Config)
	if err != nil {
		t.Log(err)
		return
	}
	gvr := schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeatures"}
	list, err := dyn.Resource(gvr).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("NodeFeatures: %v", err)
		return
	}
	for _, nf := range list.Items {
		pci, _, _ := unstructured.NestedSlice(nf.Object, "spec", "features", "instances", "pci.device", "elements")
		t.Logf("NodeFeature %s: pci.device %v", nf.GetName(), pci)
	}
}

// overwriteRefused: a NodeFeature carrying nvidia.com/gpu.deploy.driver, as a compromised node's feature writer would
// publish one for its own node, is refused to the real nfd-worker's account (a token bound to its pod) by the
// chart's admission policy. The policy is what stops it: the same object from an account outside the policy (the
// admin's) has nfd-master v0.19.0 write the label over the admin's value (its restrictions.allowOverwrite=false
// does not protect foreign labels; it keeps nfd-master from updating its own), and its other label, new on the
// node, shows nfd-master read it.
func overwriteRefused(t *testing.T, ctx context.Context) {
	t.Helper()
	const switchLabel, marker = "nvidia.com/gpu.deploy.driver", "nvidia.com/kgs-test.overwrite-probe"
	c := testNode.Cluster.Client
	patch(t, ctx, map[string]any{"labels": map[string]any{switchLabel: "false"}})
	probe := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
			"metadata": map[string]any{"name": name, "namespace": namespace,
				"labels": map[string]any{"nfd.node.kubernetes.io/node-name": testNode.Name}},
			"spec": map[string]any{"labels": map[string]any{switchLabel: "true", marker: "1"}},
		}}
	}
	gvr := schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeatures"}

	// the worker's own account, with a token bound to its pod on this node
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + testNode.Name})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return runs(p.Spec, "nfd-worker") })
	if i < 0 {
		t.Fatal("no nfd-worker pod on the node")
	}
	worker := pods.Items[i]
	tok, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, worker.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: worker.Name, UID: worker.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(testNode.Cluster.Config)
	cfg.BearerToken = tok.Status.Token
	asWorker, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = asWorker.Resource(gvr).Namespace(namespace).Create(ctx, probe(testNode.Name+"-worker-probe"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), switchLabel) {
		t.Errorf("the nfd-worker's account published a NodeFeature with %s: %v; want it refused by the chart's admission policy", switchLabel, err)
	}

	// the same from the admin: nfd-master writes it over the admin's value
	admin, err := dynamic.NewForConfig(testNode.Cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	nf := probe(testNode.Name + "-overwrite-probe")
	if _, err := admin.Resource(gvr).Namespace(namespace).Create(ctx, nf, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := admin.Resource(gvr).Namespace(namespace).Delete(context.Background(), nf.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}()
	var node *corev1.Node
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, testNode.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return n.Labels[marker] == "1", nil
	})
	if err != nil {
		t.Fatalf("nfd-master did not apply the probe NodeFeature's new label %s: %v", marker, err)
	}
	if got := node.Labels[switchLabel]; got != "true" {
		t.Errorf("nfd-master left the admin's %s=false (got %q): it no longer overwrites foreign labels, so the chart may rely on restrictions.allowOverwrite=false; revisit the policy's reasoning", switchLabel, got)
	} else {
		t.Logf("nfd-master v0.19.0 wrote %s=true over the admin's false from a NodeFeature: the admission policy is what keeps the feature writers from it", switchLabel)
	}
}
