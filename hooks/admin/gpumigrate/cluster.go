package gpumigrate

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The operator's resources, and the name its chart gives the ClusterPolicy.
var (
	ClusterPolicyGVR = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1", Resource: "clusterpolicies"}
	NVIDIADriverGVR  = schema.GroupVersionResource{Group: "nvidia.com", Version: "v1alpha1", Resource: "nvidiadrivers"}
	nodeGVR          = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// ClusterPolicyName is the ClusterPolicy the operator's chart creates.
const ClusterPolicyName = "cluster-policy"

// NodeLabelCount is how many nodes carry one operator label value.
type NodeLabelCount struct {
	Label string
	Value string
	Nodes int
	Note  string
}

// Cluster is what --from-cluster read.
type Cluster struct {
	Input
	// Policy is the ClusterPolicy read: ClusterPolicyName, or the cluster's only one by another name.
	Policy string
	Labels []NodeLabelCount
	// Kernels are the GPU nodes' kernels (feature.node.kubernetes.io/kernel-version.full), for precompiled drivers.
	Kernels []string
	// OS counts the GPU nodes' operating systems (NFD's os_release ID and VERSION_ID).
	OS map[string]int
}

// labelNotes says, for each operator node label, what it means to this chart; labels not listed are not reported.
var labelNotes = []struct{ prefix, note string }{
	{"nvidia.com/gpu.deploy.", "written by the operator to pause or place operands; this chart's hooks pause operands with the same keys"},
	{"nvidia.com/gpu-driver-upgrade-state", "the operator's driver upgrade state; this chart's driver manager uses the same label"},
	{"nvidia.com/gpu-driver-upgrade", "the operator's driver upgrade bookkeeping"},
	{"nvidia.com/mig.config.state", "written by the MIG manager; kept"},
	{"nvidia.com/mig.config", "an admin's (or the operator's default) MIG layout; this chart's MIG manager reads it"},
	{"nvidia.com/gpu.workload.config", "the node's role; this chart reads it with global.sandboxWorkloads.enabled"},
	{"nvidia.com/vgpu.config", "the node's vGPU layout; this chart's vGPU device manager reads it"},
	{"nvidia.com/device-plugin.config", "the node's device plugin config; this chart's device plugin reads it"},
	{"nvidia.com/gpu.present", "GPU presence; this chart's NodeFeatureRule writes the same label"},
	{"nvidia.com/cc.mode", "the node's confidential computing mode; this chart's CC manager reads it"},
}

// FromCluster reads the ClusterPolicy, every NVIDIADriver and the operator's labels on the nodes.
func FromCluster(ctx context.Context, dyn dynamic.Interface) (Cluster, error) {
	var c Cluster
	cp, err := clusterPolicy(ctx, dyn)
	if err != nil {
		return c, err
	}
	c.Policy = cp.GetName()
	spec, _ := cp.Object["spec"].(map[string]any)
	c.Values = spec
	if c.Values == nil {
		c.Values = map[string]any{}
	}
	drivers, err := dyn.Resource(NVIDIADriverGVR).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && drivers == nil):
	case err != nil:
		return c, fmt.Errorf("listing NVIDIADrivers: %w", err)
	default:
		for _, d := range drivers.Items {
			c.Drivers = append(c.Drivers, map[string]any{"metadata": map[string]any{"name": d.GetName()}, "spec": d.Object["spec"]})
		}
	}
	nodes, err := dyn.Resource(nodeGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return c, fmt.Errorf("listing nodes: %w", err)
	}
	counts := map[[2]string]int{}
	kernels := map[string]bool{}
	c.OS = map[string]int{}
	for _, n := range nodes.Items {
		labels := n.GetLabels()
		for k, v := range labels {
			for _, ln := range labelNotes {
				if strings.HasPrefix(k, ln.prefix) {
					counts[[2]string{k, v}]++
					break
				}
			}
		}
		if labels["nvidia.com/gpu.present"] != "true" && labels["feature.node.kubernetes.io/pci-10de.present"] != "true" {
			continue
		}
		if k := labels["feature.node.kubernetes.io/kernel-version.full"]; k != "" {
			kernels[k] = true
		}
		if id := labels["feature.node.kubernetes.io/system-os_release.ID"]; id != "" {
			c.OS[id+labels["feature.node.kubernetes.io/system-os_release.VERSION_ID"]]++
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(counts), func(a, b [2]string) int {
		return strings.Compare(a[0]+"="+a[1], b[0]+"="+b[1])
	}) {
		note := ""
		for _, ln := range labelNotes {
			if strings.HasPrefix(k[0], ln.prefix) {
				note = ln.note
				break
			}
		}
		c.Labels = append(c.Labels, NodeLabelCount{Label: k[0], Value: k[1], Nodes: counts[k], Note: note})
	}
	c.Kernels = slices.Sorted(maps.Keys(kernels))
	return c, nil
}

// clusterPolicy reads ClusterPolicyName, else the cluster's only ClusterPolicy (the operator acts on one; OpenShift's
// documented one is gpu-cluster-policy). Without one there is nothing to convert: values made from nothing would
// install as if the site had changed no setting.
func clusterPolicy(ctx context.Context, dyn dynamic.Interface) (*unstructured.Unstructured, error) {
	cp, err := dyn.Resource(ClusterPolicyGVR).Get(ctx, ClusterPolicyName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		if err != nil {
			return nil, fmt.Errorf("reading ClusterPolicy %s: %w", ClusterPolicyName, err)
		}
		return cp, nil
	}
	looked := fmt.Sprintf("no ClusterPolicy %q (%s, the GPU Operator's)", ClusterPolicyName, ClusterPolicyGVR.GroupVersion())
	list, err := dyn.Resource(ClusterPolicyGVR).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%s: the cluster serves no %s %s, so no GPU Operator runs there; convert its values file with -f instead",
			looked, ClusterPolicyGVR.GroupVersion(), ClusterPolicyGVR.Resource)
	case err != nil:
		return nil, fmt.Errorf("%s; listing ClusterPolicies: %w", looked, err)
	case len(list.Items) == 1:
		return &list.Items[0], nil
	case len(list.Items) == 0:
		return nil, fmt.Errorf("%s, and no other ClusterPolicy: the GPU Operator is not set up there; convert its values file with -f instead", looked)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.GetName())
	}
	slices.Sort(names)
	return nil, fmt.Errorf("%s, and several others (%s): the operator acts on one; convert its values with -f (kubectl get clusterpolicy NAME -o yaml)",
		looked, strings.Join(names, ", "))
}

// ConvertCluster converts what FromCluster read, against the defaults of the release it recognises.
func ConvertCluster(c Cluster) Result { return ConvertClusterFrom(c, Recognise(c.Values)) }

// ConvertClusterFrom converts what FromCluster (or a file) read, against the defaults of the release src names;
// precompiled drivers get the GPU nodes' kernels.
func ConvertClusterFrom(c Cluster, src Source) Result {
	r := convert(c.Values, c.Drivers, src)
	r.Nodes = c.Labels
	if precompiledAnywhere(r.Values) {
		if kernels := slices.Compact(slices.Sorted(slices.Values(c.Kernels))); len(kernels) > 0 {
			ks := make([]any, len(kernels))
			for i, k := range kernels {
				ks[i] = k
			}
			setPath(r.Values, "driver.kernels", ks)
			r.Report = append(r.Report, Entry{Key: "(nodes) feature.node.kubernetes.io/kernel-version.full", Action: Mapped, To: []string{"driver.kernels"},
				Why: "the GPU nodes' kernels (and --kernel), for the precompiled driver images; pools inherit them"})
		} else {
			r.Report = append(r.Report, Entry{Key: "(nodes) feature.node.kubernetes.io/kernel-version.full", Action: Decision, To: []string{"driver.kernels"}, Why: "precompiled drivers, but no kernels known (no GPU node with an NFD kernel label, no --kernel): list them in driver.kernels, or the chart refuses to render"})
		}
	}
	// the operator finds each node's OS; this chart runs a driver only on the OS tags driver.os lists
	osEntry := Entry{Key: "(nodes) feature.node.kubernetes.io/system-os_release", Action: Decision, To: []string{"driver.os"}}
	if len(c.OS) > 0 {
		var parts []string
		for _, os := range slices.Sorted(maps.Keys(c.OS)) {
			parts = append(parts, fmt.Sprintf("%s x%d", os, c.OS[os]))
		}
		osEntry.Why = "GPU nodes run " + strings.Join(parts, ", ") + ": check that driver.os (and each pool's os) has a tag for each"
		r.Report = append(r.Report, osEntry)
	} else if enabled, _ := getPath(r.Values, "driver.enabled"); enabled != false {
		osEntry.Why = "the GPU nodes' operating systems were not read (no --from-cluster, or no NFD os_release labels): a GPU node " +
			"whose OS has no tag in driver.os gets no driver; `kube-gpu-stack plan -f VALUES` lists the GPU nodes no OS tag covers"
		r.Report = append(r.Report, osEntry)
	}
	return r
}

// precompiledAnywhere: the default pool or any pool uses precompiled driver images.
func precompiledAnywhere(values map[string]any) bool {
	if v, _ := getPath(values, "driver.usePrecompiled"); v == true {
		return true
	}
	pools, _ := getPath(values, "driver.pools")
	list, _ := pools.([]any)
	return slices.ContainsFunc(list, func(p any) bool {
		m, _ := p.(map[string]any)
		return m["usePrecompiled"] == true
	})
}
