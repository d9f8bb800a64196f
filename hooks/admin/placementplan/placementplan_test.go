package placementplan

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/gpupods"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// debian12 is a GPU node whose OS no driver DaemonSet has an image for: no pool's OS tag covers it.
func debian12() nodefixtures.Node {
	l := nodefixtures.OS{ID: "debian", VersionID: "12"}.Labels()
	maps.Copy(l, map[string]string{"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"})
	return nodefixtures.Node{Name: "gpu-debian12", Labels: l, GPUs: 8}
}

// row is a node's row reduced to what the role-matrix expectations compare: role, pool, driver DaemonSet, change,
// operands.
func row(n Node) string {
	role := n.Role
	if n.RoleDefault {
		role += "(default)"
	}
	return strings.Join([]string{role, n.Pool, n.Driver, n.DriverChange, strings.Join(n.Operands, " ")}, " | ")
}

const (
	ops          = "container-toolkit dcgm-exporter device-plugin driver gpu-feature-discovery operator-validator"
	opsHost      = "container-toolkit dcgm-exporter device-plugin gpu-feature-discovery operator-validator"
	opsDRA       = "container-toolkit dcgm-exporter dra-driver driver gpu-feature-discovery operator-validator"
	opsDRAOff    = "container-toolkit dcgm-exporter driver gpu-feature-discovery operator-validator"
	opsMIG       = "container-toolkit dcgm-exporter device-plugin driver gpu-feature-discovery mig-manager operator-validator"
	opsMPS       = "container-toolkit dcgm-exporter device-plugin driver gpu-feature-discovery mps-control-daemon operator-validator"
	opsPT        = "sandbox-device-plugin sandbox-validator vfio-manager"
	opsVGPU      = "sandbox-device-plugin sandbox-validator vgpu-device-manager vgpu-manager"
	ds2204       = "nvidia-driver-daemonset-ubuntu2204"
	ds2404       = "nvidia-driver-daemonset-ubuntu2404"
	dsRHEL9      = "nvidia-driver-daemonset-rhel9"
	debianNoPool = "GPU node gpu-debian12: pool default has no driver DaemonSet for its OS/kernel"
)

// The per-node rows of the role-matrix fixtures (and a Debian GPU node no OS tag covers), from nodes only: the
// driver change is unknown wherever a driver DaemonSet runs.
var planRows = map[string]struct {
	rows      map[string]string
	uncovered string
}{
	"driver-pools": {map[string]string{
		"container-ubuntu2204":      "container | default | " + ds2204 + " | unknown | " + ops,
		"container-rhel9":           "container | default | " + dsRHEL9 + " | unknown | " + ops,
		"mig-capable":               "container | default | " + ds2204 + " | unknown | " + opsMIG,
		"paused-for-driver-upgrade": "container | default | " + ds2204 + " | unknown | driver",
		"operands-off":              "container | default |  | - | ",
		"container-dedicated":       "container | default |  | - | ",
		"vm-passthrough":            "container | default | " + ds2204 + " | unknown | " + ops, // no sandbox workloads
		"cpu-only":                  " |  |  | - | ",
		"pool-r570-ubuntu2404":      "container | r570 | nvidia-driver-r570-ubuntu2404 | unknown | " + ops,
		"pool-r570-rhel9":           "container | r570 | nvidia-driver-r570-rhel9 | unknown | " + ops,
		"pool-precompiled-k5-15":    "container | precompiled | nvidia-driver-precompiled-ubuntu2204-5-15-0-140-generic | unknown | " + ops,
		"pool-precompiled-k6-8":     "container | precompiled | nvidia-driver-precompiled-ubuntu2204-6-8-0-60-generic | unknown | " + ops,
		"pool-host":                 "container | host |  | - | " + opsHost,
		"gpu-debian12":              "container | default |  | - | " + opsHost,
	}, debianNoPool},
	"mixed": {map[string]string{
		"container-ubuntu2204":      "container(default) | default | " + ds2204 + " | unknown | " + ops,
		"container-ubuntu2404":      "container | default | " + ds2404 + " | unknown | " + ops,
		"container-mps-capable":     "container | default | " + ds2204 + " | unknown | " + opsMPS,
		"vm-passthrough":            "vm-passthrough | default |  | - | " + opsPT,
		"vm-vgpu":                   "vm-vgpu | default |  | - | " + opsVGPU,
		"vm-passthrough-cc-resumed": "vm-passthrough | default |  | - | " + opsPT,
		"role-unknown":              "container(default) | default | " + ds2204 + " | unknown | " + ops,
		"pool-r570-rhel9":           "container(default) | default | " + dsRHEL9 + " | unknown | " + ops,
		"pool-host":                 "container(default) | default | " + ds2204 + " | unknown | " + ops,
		"gpu-debian12":              "container(default) | default |  | - | " + opsHost,
	}, debianNoPool},
	"dra-mixed": {map[string]string{
		"container-ubuntu2204":      "container | default | " + ds2204 + " | unknown | " + opsDRA,
		"mps-capable":               "container | default | " + ds2204 + " | unknown | " + opsDRA, // no MPS daemon under DRA
		"paused-for-driver-upgrade": "container | default | " + ds2204 + " | unknown | dra-driver driver",
		"dra-legacy":                "container | legacy | nvidia-driver-legacy-ubuntu2204 | unknown | " + ops,
		"dra-legacy-mps-capable":    "container | legacy | nvidia-driver-legacy-ubuntu2204 | unknown | " + opsMPS,
		"dra-opted-out":             "container | default | " + ds2204 + " | unknown | " + opsDRAOff,
		"dra-paused":                "container | default | " + ds2204 + " | unknown | " + opsDRAOff,
		"gpu-debian12":              "container | default |  | - | container-toolkit dcgm-exporter dra-driver gpu-feature-discovery operator-validator",
	}, debianNoPool},
}

// TestPlanRoleMatrix: the rows plan prints for the role-matrix fixtures on three profiles, from a file of nodes.
func TestPlanRoleMatrix(t *testing.T) {
	nodes := fixtureNodes(append(nodefixtures.RoleMatrix(), debian12()))
	for _, profile := range slices.Sorted(maps.Keys(planRows)) {
		want := planRows[profile]
		t.Run(profile, func(t *testing.T) {
			p, err := Evaluate(context.Background(), renderProfile(t, profile), nodesOnly(nodes), "gpu", "gpu-operator")
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Nodes) != len(nodes) {
				t.Fatalf("%d rows for %d nodes", len(p.Nodes), len(nodes))
			}
			for _, n := range p.Nodes {
				if w, ok := want.rows[n.Name]; ok && row(n) != w {
					t.Errorf("node %s:\n got  %s\n want %s", n.Name, row(n), w)
				}
				if n.Allocation != "" || len(n.Evicts) > 0 {
					t.Errorf("node %s: a switch or evictions without pods: %+v", n.Name, n)
				}
			}
			if len(p.Uncovered) != 1 || !strings.HasPrefix(p.Uncovered[0], want.uncovered) {
				t.Errorf("uncovered: got %q, want one starting %q", p.Uncovered, want.uncovered)
			}
		})
	}
}

func gpuPod(ns, name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{gpupods.GPUResource: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func driverPod(node, digest string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-operator", Name: "driver-" + node, Labels: map[string]string{
			"app.kubernetes.io/instance": "gpu", "app.kubernetes.io/component": "driver"}},
		// a newer driver than the chart's: a change to the chart's is a downgrade
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Image: "nvcr.io/nvidia/driver:600.10.01-ubuntu22.04",
			Env: []corev1.EnvVar{{Name: "DRIVER_CONFIG_DIGEST", Value: digest}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// blockingPDB never allows an eviction (minAvailable 1 of 1); relaxed allows one.
func pdb(name string, sel map[string]string, blocking bool) *policyv1.PodDisruptionBudget {
	p := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &intstr.IntOrString{IntVal: 1}, Selector: &metav1.LabelSelector{MatchLabels: sel}},
		Status:     policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1},
	}
	if !blocking {
		p.Status = policyv1.PodDisruptionBudgetStatus{CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2, DisruptionsAllowed: 1}
	}
	return p
}

// changeCluster is a dra-mixed cluster mid-life: one node's driver config changes under a GPU pod a PDB blocks, one
// stays, one gets its first driver, one is skipped, and a legacy-pool node labelled dra switches back to the device
// plugin with a DRA GPU pod that a relaxed PDB covers.
func changeCluster(t *testing.T, r *Rendered) []runtime.Object {
	t.Helper()
	digest := map[string]string{}
	for _, ds := range r.DaemonSets {
		digest[ds.Name] = ds.Env("DRIVER_CONFIG_DIGEST")
	}
	if digest[ds2204] == "" || digest["nvidia-driver-legacy-ubuntu2204"] == "" {
		t.Fatalf("driver DaemonSets without a digest: %v", digest)
	}
	rollout := nodefixtures.Rollout(4) // gpu-01..gpu-04 and cpu-only
	skip := rollout[3].Object()
	skip.Labels[nodestate.UpgradeSkipLabel] = "true"
	legacy := nodefixtures.DRA()[0].Object() // dra-legacy
	legacy.Labels[nodestate.AllocationLabel] = nodestate.AllocationDRA
	claim := "train-gpu"
	draPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "infer-0", Labels: map[string]string{"app": "infer"}},
		Spec: corev1.PodSpec{NodeName: legacy.Name, Containers: []corev1.Container{{Name: "c"}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	return []runtime.Object{
		rollout[0].Object(), rollout[1].Object(), rollout[2].Object(), skip, rollout[4].Object(), legacy,
		driverPod("gpu-01", "0ld0ld0ld0ld0ld"), driverPod("gpu-02", digest[ds2204]), driverPod("gpu-04", "0ld0ld0ld0ld0ld"),
		driverPod("dra-legacy", digest["nvidia-driver-legacy-ubuntu2204"]),
		gpuPod("team", "train-0", "gpu-01", map[string]string{"app": "train"}),
		gpuPod("team", "train-1", "gpu-02", map[string]string{"app": "train"}),
		gpuPod("team", "train-2", "gpu-04", map[string]string{"app": "train"}),
		// not a GPU pod: stays
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web-0", Labels: map[string]string{"app": "train"}},
			Spec: corev1.PodSpec{NodeName: "gpu-01", Containers: []corev1.Container{{Name: "c"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		draPod,
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: claim},
			Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
				Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpupods.DRADriver, Pool: legacy.Name, Device: "gpu-0"}}}}}},
		pdb("train", map[string]string{"app": "train"}, true),
		pdb("infer", map[string]string{"app": "infer"}, false),
	}
}

// checkChange asserts the rows of changeCluster.
func checkChange(t *testing.T, p *Plan, r *Rendered) {
	t.Helper()
	rows := map[string]Node{}
	for _, n := range p.Nodes {
		rows[n.Name] = n
	}
	var to2204 string
	for _, ds := range r.DaemonSets {
		if ds.Name == ds2204 {
			to2204 = ds.Env("DRIVER_CONFIG_DIGEST")
		}
	}
	type want struct {
		change, from, allocation string
		evicts                   []Eviction
	}
	for name, w := range map[string]want{
		"gpu-01": {DriverChange, "0ld0ld0ld0ld0ld", "", []Eviction{{Pod: "team/train-0", PDBs: []string{"team/train"}, Blocked: []string{"team/train"}}}},
		"gpu-02": {DriverSame, to2204, "", nil},
		"gpu-03": {DriverInstall, "", "", nil},
		"gpu-04": {DriverSkip, "0ld0ld0ld0ld0ld", "", nil},
		"dra-legacy": {DriverSame, rows["dra-legacy"].To, "dra -> device-plugin",
			[]Eviction{{Pod: "team/infer-0", PDBs: []string{"team/infer"}}}},
		"cpu-only": {DriverNone, "", "", nil},
	} {
		got := rows[name]
		if got.DriverChange != w.change || got.From != w.from || got.Allocation != w.allocation ||
			fmt.Sprint(got.Evicts) != fmt.Sprint(w.evicts) {
			t.Errorf("node %s:\n got  change=%s from=%s allocation=%q evicts=%v\n want change=%s from=%s allocation=%q evicts=%v",
				name, got.DriverChange, got.From, got.Allocation, got.Evicts, w.change, w.from, w.allocation, w.evicts)
		}
	}
	if rows["gpu-01"].To != to2204 || rows["gpu-01"].Driver != ds2204 {
		t.Errorf("gpu-01: driver %s to %s, want %s to %s", rows["gpu-01"].Driver, rows["gpu-01"].To, ds2204, to2204)
	}
}

// TestPlanLive: against a cluster (a fake clientset) plan reads, and only reads: every request is a get, list or
// watch, or a dry-run update (of a DaemonSet, TemplateChanges), which stores nothing. It finds the driver change with the GPU pod a PDB blocks, and the allocation switch with its DRA pod.
func TestPlanLive(t *testing.T) {
	r := renderProfile(t, "dra-mixed")
	client := fake.NewClientset(changeCluster(t, r)...)
	o := Options{RenderOptions: RenderOptions{ChartDir: filepath.Join(repoRoot(), "charts", "kube-gpu-stack"),
		ValueFiles: []string{filepath.Join(repoRoot(), "values", "dra-mixed.yaml")}, KubeVersion: "v1.37.0"},
		Client: client, Output: "json"}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := Run(context.Background(), o, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" && !dryRun(a) {
			t.Errorf("plan made a %s request on %s", v, a.GetResource())
		}
	}
	if !slices.ContainsFunc(client.Actions(), func(a k8stesting.Action) bool { return a.GetResource().Resource == "resourceclaims" }) {
		t.Error("plan never read the resource claims of the DRA pod")
	}
	checkChange(t, p, r)
	var back Plan
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || len(back.Nodes) != len(p.Nodes) {
		t.Fatalf("-o json: %v, %d nodes", err, len(back.Nodes))
	}
	// the verdict is the pre-upgrade hook's own: refused for the PDB that never lets train-0 go, and with
	// hooks.preUpgrade.force it goes ahead, its canaries named
	if !strings.HasPrefix(p.Verdict, "refused") || !slices.ContainsFunc(p.Refusals, func(r string) bool { return strings.Contains(r, "team/train") }) {
		t.Errorf("verdict %q, refusals %v; want refused for PodDisruptionBudget team/train", p.Verdict, p.Refusals)
	}
	// the fixture nodes and driver pods report no Ready condition: the hook also refuses for want of a canary; on
	// Ready nodes whose drivers validated only the budget stands in the way, which force lets go
	nodes, _ := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	for _, n := range nodes.Items {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), &n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	drivers, _ := client.CoreV1().Pods("gpu-operator").List(context.Background(), metav1.ListOptions{})
	for _, p := range drivers.Items {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if _, err := client.CoreV1().Pods("gpu-operator").UpdateStatus(context.Background(), &p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	o.Output = "json"
	out.Reset()
	if p, err = Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.Verdict, "refused") || len(p.Refusals) != 1 || !strings.Contains(p.Refusals[0], "team/train") {
		t.Errorf("on Ready nodes: verdict %q, refusals %v; want refused for PodDisruptionBudget team/train alone", p.Verdict, p.Refusals)
	}
	client.ClearActions()
	o.Set, o.Output = []string{"hooks.preUpgrade.force=true"}, "table"
	out.Reset()
	if p, err = Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.Verdict, "proceeds") || !strings.Contains(p.Verdict, "canaries first:") ||
		!strings.Contains(out.String(), "verdict: proceeds") || !strings.Contains(out.String(), "canary:") {
		t.Errorf("with hooks.preUpgrade.force: verdict %q; want it to proceed, naming the canaries:\n%s", p.Verdict, out.String())
	}
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" && !dryRun(a) {
			t.Errorf("plan made a %s request on %s", v, a.GetResource())
		}
	}
}

// TestPlanFiles: the same cluster from files (a List of nodes, multi-document pods, budgets and claims) plans the
// same; the table names the change, the switch, the pods and the blocking budget.
func TestPlanFiles(t *testing.T) {
	r := renderProfile(t, "dra-mixed")
	dir := t.TempDir()
	list := &corev1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	var docs []string
	for _, obj := range changeCluster(t, r) {
		gvk := map[string]string{"*v1.Node": "Node", "*v1.Pod": "Pod", "*v1.PodDisruptionBudget": "PodDisruptionBudget", "*v1.ResourceClaim": "ResourceClaim"}[fmt.Sprintf("%T", obj)]
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		m["kind"] = gvk
		m["apiVersion"] = map[string]string{"Node": "v1", "Pod": "v1", "PodDisruptionBudget": "policy/v1", "ResourceClaim": "resource.k8s.io/v1"}[gvk]
		if gvk == "Node" {
			raw, _ = json.Marshal(m)
			list.Items = append(list.Items, runtime.RawExtension{Raw: raw})
			continue
		}
		doc, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(doc))
	}
	nodesYAML, err := yaml.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	nodesFile, podsFile := filepath.Join(dir, "nodes.yaml"), filepath.Join(dir, "pods.yaml")
	if err := os.WriteFile(nodesFile, nodesYAML, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(podsFile, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	o := Options{RenderOptions: RenderOptions{ChartDir: filepath.Join(repoRoot(), "charts", "kube-gpu-stack"),
		ValueFiles: []string{filepath.Join(repoRoot(), "values", "dra-mixed.yaml")}}, NodesFile: nodesFile, PodsFile: podsFile}
	o.Complete()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := Run(context.Background(), o, &out)
	if err != nil {
		t.Fatal(err)
	}
	checkChange(t, p, r)
	table := out.String()
	// the versions first, a downgrade called out, then the config digests
	for _, s := range []string{"NODE", "change 600.10.01-ubuntu22.04->5", "DOWNGRADE (config 0ld0ld0ld0ld->", "team/train-0 [PDB team/train BLOCKS]", "dra -> device-plugin", "team/infer-0 [PDB team/infer]"} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
	if strings.Contains(table, "web-0") {
		t.Errorf("table lists a pod without GPUs:\n%s", table)
	}

	// managers that do not evict: the same pods must go, but no budget blocks the change
	o.Set = []string{"driver.manager.gpuPodDeletion.enabled=false"}
	out.Reset()
	if p, err = Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		if n.Name == "gpu-01" && (fmt.Sprint(n.Evicts) != fmt.Sprint([]Eviction{{Pod: "team/train-0", PDBs: []string{"team/train"}}}) || p.Evict) {
			t.Errorf("gpuPodDeletion off: gpu-01 evicts %v, plan evict %v", n.Evicts, p.Evict)
		}
	}
	if !strings.Contains(out.String(), "gpuPodDeletion is off") {
		t.Errorf("table does not say the managers do not evict:\n%s", out.String())
	}
	o.Set = nil

	// without --pods: the driver change is unknown, nothing is evicted
	o.PodsFile = ""
	out.Reset()
	if p, err = Run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		if n.Driver != "" && n.DriverChange != DriverUnknown || len(n.Evicts) > 0 {
			t.Errorf("node %s without pods: change %s, evicts %v", n.Name, n.DriverChange, n.Evicts)
		}
	}
}

// TestPlanShowsARoleChange: a node relabelled from vm-passthrough to container still runs the release's VFIO
// manager; the plan says its role changes (its operands are replaced), and a node that keeps its role says nothing.
func TestPlanShowsARoleChange(t *testing.T) {
	r := renderProfile(t, "mixed")
	var nodes []*corev1.Node
	for _, n := range nodefixtures.Demo() {
		nodes = append(nodes, n.Object())
	}
	byName := map[string]*corev1.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	byName["vm-passthrough"].Labels["nvidia.com/gpu.workload.config"] = "container"
	running := func(node, component string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: component + "-" + node, Namespace: "gpu-operator",
			Labels: map[string]string{"app.kubernetes.io/instance": "gpu", "app.kubernetes.io/component": component}},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	c := &Cluster{Nodes: nodes, PodsKnown: true, GPU: gpupods.NewOffline(nil), Pods: []*corev1.Pod{
		running("vm-passthrough", "vfio-manager"), running("gpu-ubuntu2204", "container-toolkit"), running("vm-vgpu", "vgpu-manager"),
		// another release's VFIO manager says nothing of this one's roles
		{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "gpu-operator", Labels: map[string]string{"app.kubernetes.io/instance": "other", "app.kubernetes.io/component": "vfio-manager"}},
			Spec: corev1.PodSpec{NodeName: "gpu-rhel9"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
	}}
	p, err := Evaluate(context.Background(), r, c, "gpu", "gpu-operator")
	if err != nil {
		t.Fatal(err)
	}
	from := map[string]string{}
	for _, n := range p.Nodes {
		from[n.Name] = n.FromRole + "->" + n.Role
	}
	want := map[string]string{"vm-passthrough": "vm-passthrough->container", "gpu-ubuntu2204": "->container", "vm-vgpu": "->vm-vgpu", "gpu-rhel9": "->container"}
	for node, w := range want {
		if from[node] != w {
			t.Errorf("node %s: role %q, want %q", node, from[node], w)
		}
	}
	var out bytes.Buffer
	p.WriteTable(&out)
	if !strings.Contains(out.String(), "vm-passthrough->container ROLE CHANGE") || strings.Count(out.String(), "ROLE CHANGE") != 1 {
		t.Errorf("the table names one role change:\n%s", out.String())
	}
}

// A node that leaves every driver pool (here: relabelled to vm-passthrough) has its driver stopped at once, not
// emptied first: the plan names the GPU pods still running there, in its rows, totals, table and verdict, and says
// nothing of a node whose driver stays or of a pod that uses no GPU.
func TestPlanWarnsOfGPUPodsWhereADriverStopsAtOnce(t *testing.T) {
	r := renderProfile(t, "mixed")
	var nodes []*corev1.Node
	for _, n := range nodefixtures.Demo() {
		nodes = append(nodes, n.Object())
	}
	nodes[0].Labels["nvidia.com/gpu.workload.config"] = "vm-passthrough" // gpu-ubuntu2204, a container node now
	pod := func(name, node, component string, gpus int64) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "jobs"},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		if component != "" {
			p.Namespace, p.Labels = "gpu-operator", map[string]string{"app.kubernetes.io/instance": "gpu", "app.kubernetes.io/component": component}
		}
		if gpus > 0 {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)}
		}
		return p
	}
	c := &Cluster{Nodes: nodes, PodsKnown: true, GPU: gpupods.NewOffline(nil), Pods: []*corev1.Pod{
		pod("driver-a", "gpu-ubuntu2204", "driver", 0), pod("toolkit-a", "gpu-ubuntu2204", "container-toolkit", 0),
		pod("train", "gpu-ubuntu2204", "", 1), pod("web", "gpu-ubuntu2204", "", 0),
		pod("driver-b", "gpu-rhel9", "driver", 0), pod("infer", "gpu-rhel9", "", 1),
	}}
	p, err := Evaluate(context.Background(), r, c, "gpu", "gpu-operator")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		var want []string
		if n.Name == "gpu-ubuntu2204" {
			want = []string{"jobs/train"}
			if n.DriverChange != DriverRemove {
				t.Errorf("node %s: driver change %q, want %q", n.Name, n.DriverChange, DriverRemove)
			}
		}
		if !slices.Equal(n.Unguarded, want) {
			t.Errorf("node %s: GPU pods under a driver that stops at once %v, want %v", n.Name, n.Unguarded, want)
		}
	}
	if p.Totals.Unguarded != 1 {
		t.Errorf("totals: %d unguarded GPU pods, want 1", p.Totals.Unguarded)
	}
	var out bytes.Buffer
	p.WriteTable(&out)
	if !strings.Contains(out.String(), "warning: node gpu-ubuntu2204 leaves every driver pool, so its driver stops at once, not emptied first, under 1 running GPU pod(s): jobs/train") ||
		strings.Count(out.String(), "warning:") != 1 {
		t.Errorf("the table warns once, of gpu-ubuntu2204's GPU pod:\n%s", out.String())
	}
}

// dryRun says whether a is an update sent with dryRun=All.
func dryRun(a k8stesting.Action) bool {
	u, ok := a.(k8stesting.UpdateActionImpl)
	return ok && slices.Equal(u.GetUpdateOptions().DryRun, []string{metav1.DryRunAll})
}
