// Package placementplan is `kube-gpu-stack plan`: with the values one would install or upgrade to, what will run where.
// It renders the chart once and evaluates every node against the rendered DaemonSets with hooks/kube/placement (the
// evaluator the role-matrix tests prove), the driver pools with hooks/upgrade/driverpools, the driver change and allocation
// switch as hooks/release/upgradeplan compares them, GPU pods by hooks/kube/gpupods and their budgets by upgradeplan's rule. It
// only reads: nodes, pods, PodDisruptionBudgets and resource claims, or files of them.
package placementplan

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/placement"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecheck"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// Driver changes a node can see.
const (
	DriverNone    = "-"       // no driver DaemonSet runs on the node, and no driver pod does
	DriverSame    = "same"    // the running driver pod has the rendered config
	DriverChange  = "change"  // it has another config: the driver is reloaded, GPU pods evicted first
	DriverInstall = "install" // no driver pod runs there yet
	DriverRemove  = "remove"  // a driver pod runs but no driver DaemonSet selects the node any more
	DriverSkip    = "skip"    // nvidia.com/gpu-driver-upgrade.skip=true: the driver stays as it is
	DriverUnknown = "unknown" // no pods were given
)

// Options configure Run: Options -> Complete -> Validate -> Run.
type Options struct {
	RenderOptions
	// Client reads a live cluster; unset when NodesFile is given.
	Client kubernetes.Interface
	// NodesFile holds Node objects; PodsFile optionally Pods, PodDisruptionBudgets and ResourceClaims.
	NodesFile, PodsFile string
	// Output is table or json.
	Output string
}

// Complete fills defaults: the release and namespace of the README's install, and the newest Kubernetes minor
// the chart supports when the cluster is not asked.
func (o *Options) Complete() {
	if o.Release == "" {
		o.Release = "gpu"
	}
	if o.Namespace == "" {
		o.Namespace = "gpu-operator"
	}
	if o.Output == "" {
		o.Output = "table"
	}
	if o.KubeVersion == "" && o.Client != nil {
		if v, err := o.Client.Discovery().ServerVersion(); err == nil && v.GitVersion != "" {
			o.KubeVersion = v.GitVersion
		}
	}
	if o.KubeVersion == "" {
		o.KubeVersion = "v1.37.0"
	}
}

// Validate rejects options Run cannot act on.
func (o *Options) Validate() error {
	switch {
	case o.ChartDir == "":
		return errors.New("need --chart")
	case o.Client == nil && o.NodesFile == "":
		return errors.New("need a cluster (kubeconfig) or --nodes FILE")
	case o.PodsFile != "" && o.NodesFile == "":
		return errors.New("--pods needs --nodes")
	case o.Output != "table" && o.Output != "json":
		return fmt.Errorf("-o %s: want table or json", o.Output)
	}
	return nil
}

// Run renders the chart, reads the cluster or the files, and prints the plan.
func Run(ctx context.Context, o Options, out io.Writer) (*Plan, error) {
	r, err := Render(ctx, o.RenderOptions)
	if err != nil {
		return nil, err
	}
	var c *Cluster
	if o.NodesFile != "" {
		c, err = ReadFiles(o.NodesFile, o.PodsFile)
	} else {
		c, err = Read(ctx, o.Client)
	}
	if err != nil {
		return nil, err
	}
	// which pod templates change: a user who may only read gets the plan without them, told so
	templatesUnknown := ""
	if o.Client != nil {
		c.TemplateChanged, err = TemplateChanges(ctx, o.Client, o.Namespace, r.Manifests)
		switch {
		case apierrors.IsForbidden(err):
			templatesUnknown = "restarts for changed pod templates not known: " + err.Error()
		case err != nil:
			return nil, err
		}
	}
	p, err := Evaluate(ctx, r, c, o.Release, o.Namespace)
	if err != nil {
		return nil, err
	}
	p.TemplatesUnknown = templatesUnknown
	var hookPlan *upgradeplan.Plan
	if o.Client != nil && r.Pools != nil {
		// what the pre-upgrade hook will decide on this cluster, with these values (it only reads)
		hookPlan, err = upgradeplan.Compute(ctx, upgradeplan.Options{Client: o.Client, Namespace: o.Namespace, Release: o.Release,
			Pools: r.Pools, VGPUPools: r.VGPUPools, Evict: r.Evict, Force: r.Force, Now: time.Now})
		if err != nil {
			return nil, fmt.Errorf("the pre-upgrade hook's plan: %w", err)
		}
		p.Refusals = hookPlan.Refusals
		p.Verdict = verdict(hookPlan)
		if p.Totals.Unguarded > 0 && len(hookPlan.Refusals) == 0 {
			p.Verdict += fmt.Sprintf("; warning: %d GPU pod(s) still run where a driver stops at once (above)", p.Totals.Unguarded)
		}
	}
	if o.Output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return p, enc.Encode(p)
	}
	p.WriteTable(out)
	switch {
	case hookPlan != nil:
		fmt.Fprintln(out, "\nThe pre-upgrade hook's plan on this cluster:")
		hookPlan.Write(out)
		fmt.Fprintln(out, "verdict:", p.Verdict)
	case o.NodesFile != "":
		fmt.Fprintln(out, "\nverdict: not computed from --nodes files (the pre-upgrade hook's checks read the live cluster)")
	}
	return p, nil
}

// verdict is the plan's outcome in one line: the upgrade goes ahead (how many nodes change, each pool's canary
// first), or the pre-upgrade hook refuses it and Helm applies nothing.
func verdict(p *upgradeplan.Plan) string {
	if len(p.Refusals) > 0 {
		return fmt.Sprintf("refused: the pre-upgrade hook would stop this upgrade, changing nothing (%d reason(s) above, \"unsafe:\")", len(p.Refusals))
	}
	if len(p.Nodes) == 0 {
		return "proceeds: no node's driver changes"
	}
	var canaries []string
	for _, pool := range slices.Sorted(maps.Keys(p.Canary)) {
		for _, np := range p.Canary[pool] {
			canaries = append(canaries, np.Node+" (pool "+pool+")")
		}
	}
	v := fmt.Sprintf("proceeds: %d node(s) change their driver", len(p.Nodes))
	if len(canaries) > 0 {
		v += ", canaries first: " + strings.Join(canaries, ", ")
	}
	return v
}

// Plan is what will run where.
type Plan struct {
	Nodes []Node `json:"nodes"`
	// Evict: the driver managers evict GPU pods; otherwise a change waits for them to go, and no budget blocks it.
	Evict bool `json:"evict"`
	// Uncovered are the GPU nodes that need a driver and that no pool, or no driver DaemonSet of their pool (its
	// OS or kernel tag), covers: the post-install gate would fail on them.
	Uncovered []string `json:"uncovered,omitempty"`
	// Verdict is whether the pre-upgrade hook lets the upgrade go ahead, and Refusals why not (live cluster only).
	Verdict  string   `json:"verdict,omitempty"`
	Refusals []string `json:"refusals,omitempty"`
	// Totals add up the nodes' rows.
	Totals Totals `json:"totals"`
	// TemplatesUnknown says why the restarts leave out changed pod templates (the dry-run update was refused: a
	// user who may only read); empty when they are in.
	TemplatesUnknown string `json:"templatesUnknown,omitempty"`
}

// Totals are what the whole change does: nodes the driver managers cordon, GPU pods they evict, and the release's
// pods deleted and started again (or replaced).
type Totals struct {
	Cordons   int `json:"cordons"`
	Evictions int `json:"evictions"`
	Restarts  int `json:"restarts"`
	// Unguarded adds up the nodes' Unguarded GPU pods.
	Unguarded int `json:"unguardedGPUPods"`
}

// Node is one node's row.
type Node struct {
	Name string `json:"name"`
	GPU  bool   `json:"gpu"`
	// Role is the node's role (container, vm-passthrough, vm-vgpu) for GPU nodes; RoleDefault when it is the
	// default role, not its label.
	Role        string `json:"role,omitempty"`
	RoleDefault bool   `json:"roleDefault,omitempty"`
	// FromRole is the role the node serves now, by the release's operands running there, when it is not Role: the
	// role changes (nvidia.com/gpu.workload.config was relabelled), and the node's operands are replaced.
	FromRole string `json:"fromRole,omitempty"`
	// Pool is the driver pool selecting the node (several joined with "+", an error the gate reports).
	Pool     string   `json:"pool,omitempty"`
	Operands []string `json:"operands"`
	// Driver is the driver DaemonSet that will run on the node; DriverChange one of the Driver* constants, From
	// and To the config digests compared.
	Driver       string `json:"driver,omitempty"`
	DriverChange string `json:"driverChange"`
	From         string `json:"from,omitempty"`
	To           string `json:"to,omitempty"`
	// FromVersion and ToVersion are the drivers themselves, as the running pod's and the rendered DaemonSet's
	// image tags say (595.91.07-ubuntu22.04): a downgrade shows, which config digests alone hide.
	FromVersion string `json:"fromVersion,omitempty"`
	ToVersion   string `json:"toVersion,omitempty"`
	// Allocation is "<from> -> <to>" when the node switches between the device plugin and DRA.
	Allocation string `json:"allocationSwitch,omitempty"`
	// Evicts are the GPU pods the driver change or switch evicts first.
	Evicts []Eviction `json:"evicts,omitempty"`
	// Cordon is CordonYes when the driver manager cordons the node, CordonKept when it is cordoned already.
	Cordon string `json:"cordon,omitempty"`
	// Restarts are the release's pods on the node that the change deletes (namespace/name): see restarts.
	Restarts []string `json:"restarts,omitempty"`
	// Unguarded are the GPU pods (namespace/name) still running when the node's driver stops: the node leaves every
	// driver DaemonSet of the release (a role change, nvidia.com/gpu.deploy.driver=false), so no next driver pod
	// takes it over and its driver stops at once, unemptied (docs/driver-upgrades.md): stop or move them first.
	Unguarded []string `json:"unguardedGPUPods,omitempty"`
}

// Eviction is one GPU pod to evict and the budgets that cover it.
type Eviction struct {
	Pod string `json:"pod"`
	// PDBs cover the pod (namespace/name); Blocked names those that never allow an eviction: the pre-upgrade hook
	// refuses then.
	PDBs    []string `json:"pdbs,omitempty"`
	Blocked []string `json:"blocked,omitempty"`
}

// Evaluate places every node: O(nodes x DaemonSets) scheduling checks, and one pass over the pods.
func Evaluate(ctx context.Context, r *Rendered, c *Cluster, release, namespace string) (*Plan, error) {
	placed, err := placement.Place(r.DaemonSets, c.Nodes)
	if err != nil {
		return nil, err
	}
	byName := map[string]placement.DaemonSet{}
	operandDS := map[string]bool{}
	for _, ds := range r.DaemonSets {
		byName[ds.Name] = ds
		operandDS[ds.Name] = true
	}
	driverPods := map[string]*corev1.Pod{} // node -> its driver pod of this release
	podsOn := map[string][]*corev1.Pod{}   // node -> its running pods
	ours := map[string][]*corev1.Pod{}     // node -> the release's pods but the driver's
	servedRole := map[string]string{}      // node -> the role its release operands serve now
	for _, p := range c.Pods {
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.Namespace == namespace && p.Labels["app.kubernetes.io/instance"] == release {
			if role := roleOperands[p.Labels["app.kubernetes.io/component"]]; role != "" {
				servedRole[p.Spec.NodeName] = role
			}
		}
		if p.Namespace == namespace && p.Labels["app.kubernetes.io/instance"] == release && p.Labels["app.kubernetes.io/component"] == "driver" {
			driverPods[p.Spec.NodeName] = p
			continue
		}
		if p.Namespace == namespace && p.Labels["app.kubernetes.io/instance"] == release {
			ours[p.Spec.NodeName] = append(ours[p.Spec.NodeName], p)
		}
		podsOn[p.Spec.NodeName] = append(podsOn[p.Spec.NodeName], p)
	}

	plan := &Plan{Evict: r.Evict}
	containerNodes := map[string]bool{}
	driverDS := map[string][]string{}
	for _, n := range c.Nodes {
		row := Node{Name: n.Name, GPU: n.Labels[releasecheck.GPUPresentLabel] == "true", Operands: placed.Operands(n.Name)}
		if row.Operands == nil {
			row.Operands = []string{}
		}
		for _, op := range row.Operands {
			if releasecheck.ContainerRoleOperand(op) {
				containerNodes[n.Name] = true
			}
		}
		if row.GPU {
			row.Role, row.RoleDefault = r.role(n)
			if now := servedRole[n.Name]; now != "" && now != row.Role {
				row.FromRole = now
			}
		}
		var pool *driverpools.Pool
		if row.GPU && len(r.Pools) > 0 {
			matched, err := driverpools.Matching(r.Pools, n)
			if err != nil {
				return nil, err
			}
			row.Pool = strings.Join(driverpools.Names(matched), "+")
			if len(matched) == 1 {
				pool = &matched[0]
			}
		}
		ds, hasDriver := byName[placed[n.Name]["driver"]]
		if hasDriver {
			row.Driver = ds.Name
			row.To = ds.Env(upgradeplan.DigestEnv)
			row.ToVersion = upgradeplan.DriverVersion(ds.Pod.Spec)
			driverDS[n.Name] = []string{ds.Name}
			// the pool's mode, as the pre-upgrade hook reads it; its driver DaemonSet's without the hooks' pools
			mode := ds.Env("GPU_ALLOCATION")
			if pool != nil && pool.Allocation != "" {
				mode = pool.Allocation
			}
			row.Allocation = upgradeplan.AllocationSwitch(n, mode)
		}
		pod := driverPods[n.Name]
		if pod != nil {
			row.FromVersion = upgradeplan.DriverVersion(pod.Spec)
		}
		row.setDriverChange(n, pod, hasDriver, c.PodsKnown)
		if err := row.gpuPods(ctx, c, podsOn[n.Name], r.Evict); err != nil {
			return nil, err
		}
		if c.PodsKnown {
			row.Cordon = cordon(row, n)
			row.Restarts = restarts(row, ours[n.Name], pod, placed[n.Name], operandDS, c.TemplateChanged)
		}
		if row.Cordon == CordonYes {
			plan.Totals.Cordons++
		}
		plan.Totals.Evictions += len(row.Evicts)
		plan.Totals.Restarts += len(row.Restarts)
		plan.Totals.Unguarded += len(row.Unguarded)
		plan.Nodes = append(plan.Nodes, row)
	}
	if r.Pools != nil {
		for _, p := range releasecheck.Coverage(c.Nodes, r.Pools, containerNodes, driverDS) {
			plan.Uncovered = append(plan.Uncovered, p.Message)
		}
	}
	return plan, nil
}

// setDriverChange says what happens to the node's driver, from its running driver pod (nil: none) and whether a
// driver DaemonSet will run there (the row's To already set from it); podsKnown false when no pods were given.
func (row *Node) setDriverChange(n *corev1.Node, pod *corev1.Pod, hasDriver, podsKnown bool) {
	switch {
	case !podsKnown && hasDriver:
		row.DriverChange = DriverUnknown
	case pod == nil && hasDriver:
		row.DriverChange = DriverInstall
	case pod == nil:
		row.DriverChange = DriverNone
	case !hasDriver:
		row.DriverChange, row.From = DriverRemove, upgradeplan.PodDigest(pod)
	case n.Labels[nodestate.UpgradeSkipLabel] == "true":
		row.DriverChange, row.From, row.Allocation = DriverSkip, upgradeplan.PodDigest(pod), ""
	default:
		row.From = upgradeplan.PodDigest(pod)
		row.DriverChange = DriverSame
		if row.From != row.To {
			row.DriverChange = DriverChange
		}
	}
}

// gpuPods fills in the GPU pods among the node's pods that its driver change concerns: those a change or an
// allocation switch evicts first (Evicts), and those still running where the driver stops at once (Unguarded).
func (row *Node) gpuPods(ctx context.Context, c *Cluster, pods []*corev1.Pod, evict bool) error {
	var err error
	if row.DriverChange == DriverChange || (row.Allocation != "" && row.DriverChange != DriverSkip) {
		if row.Evicts, err = evictions(ctx, c, pods, evict); err != nil {
			return err
		}
	}
	if row.DriverChange == DriverRemove {
		running, err := evictions(ctx, c, pods, false)
		if err != nil {
			return err
		}
		for _, e := range running {
			row.Unguarded = append(row.Unguarded, e.Pod)
		}
	}
	return nil
}

// roleOperands are the operands (component labels) that run on one role's nodes alone: a node running one of the
// release's serves that role now.
var roleOperands = map[string]string{
	"container-toolkit": "container", "operator-validator": "container",
	"vfio-manager": "vm-passthrough",
	"vgpu-manager": "vm-vgpu", "vgpu-device-manager": "vm-vgpu",
}

// role is the node's role as the chart's node affinity reads it: its nvidia.com/gpu.workload.config when sandbox
// workloads are on and the label is a role, else the default (every GPU node is a container node without sandbox
// workloads).
func (r *Rendered) role(n *corev1.Node) (string, bool) {
	if !r.Sandbox {
		return "container", false
	}
	if l := n.Labels["nvidia.com/gpu.workload.config"]; roles[l] {
		return l, false
	}
	return r.DefaultRole, true
}

// evictions are the GPU pods among pods (gpupods' definition, as the driver manager evicts) and the budgets that
// hold each (upgradeplan's rule, as the pre-upgrade hook refuses when the managers evict).
func evictions(ctx context.Context, c *Cluster, pods []*corev1.Pod, evict bool) ([]Eviction, error) {
	var out []Eviction
	for _, p := range pods {
		uses, err := c.GPU.Uses(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if !uses {
			continue
		}
		e := Eviction{Pod: p.Namespace + "/" + p.Name}
		for _, pdb := range upgradeplan.Holding(c.PDBs, p) {
			name := pdb.Namespace + "/" + pdb.Name
			e.PDBs = append(e.PDBs, name)
			if evict && upgradeplan.NeverAllows(pdb) {
				e.Blocked = append(e.Blocked, name)
			}
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Eviction) int { return strings.Compare(a.Pod, b.Pod) })
	return out, nil
}

// versionChange is the row's driver versions, from -> to ("595.91.07-ubuntu22.04 kept" when only the config
// changes), marked when the new one is older.
func versionChange(n Node) string {
	to := n.ToVersion
	if n.DriverChange == DriverRemove {
		to = "none"
	}
	switch {
	case n.FromVersion == "" && to == "":
		return "-"
	case n.FromVersion == to:
		return to + " kept"
	case upgradeplan.Downgrade(n.FromVersion, to):
		return n.FromVersion + "->" + to + " DOWNGRADE"
	}
	return n.FromVersion + "->" + to
}

// WriteTable prints one row per node, then the uncovered nodes.
func (p *Plan) WriteTable(out io.Writer) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tROLE\tPOOL\tDRIVER\tCHANGE\tALLOCATION\tOPERANDS\tCORDON\tRESTARTS\tEVICTS")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, n := range p.Nodes {
		role := n.Role
		if n.RoleDefault {
			role += " (default)"
		}
		if n.FromRole != "" {
			role = n.FromRole + "->" + role + " ROLE CHANGE"
		}
		change := n.DriverChange
		if change == DriverChange || change == DriverRemove || change == DriverSkip {
			change += " " + versionChange(n) + " (config " + nodestate.ShortDigest(n.From) + "->" + nodestate.ShortDigest(n.To) + ")"
		}
		var evicts []string
		for _, e := range n.Evicts {
			s := e.Pod
			if len(e.PDBs) > 0 {
				s += " [PDB " + strings.Join(e.PDBs, ",")
				if len(e.Blocked) > 0 {
					s += " BLOCKS"
				}
				s += "]"
			}
			evicts = append(evicts, s)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", n.Name, dash(role), dash(n.Pool), dash(n.Driver), change,
			dash(n.Allocation), dash(strings.Join(n.Operands, ",")), dash(n.Cordon), len(n.Restarts), dash(strings.Join(evicts, " ")))
	}
	w.Flush()
	fmt.Fprintf(out, "totals: %d node(s) cordoned, %d GPU pod(s) evicted, %d pod(s) of the release restarted\n",
		p.Totals.Cordons, p.Totals.Evictions, p.Totals.Restarts)
	if p.TemplatesUnknown != "" {
		fmt.Fprintln(out, p.TemplatesUnknown)
	}
	if !p.Evict && slices.ContainsFunc(p.Nodes, func(n Node) bool { return len(n.Evicts) > 0 }) {
		fmt.Fprintln(out, "driver.manager.gpuPodDeletion is off: a change waits for the GPU pods listed to go; no budget blocks it")
	}
	for _, u := range p.Uncovered {
		fmt.Fprintln(out, "uncovered:", u)
	}
	for _, n := range p.Nodes {
		if len(n.Unguarded) > 0 {
			fmt.Fprintf(out, "warning: node %s leaves every driver pool, so its driver stops at once, not emptied first, under %d running GPU pod(s): %s; stop or move them first\n",
				n.Name, len(n.Unguarded), strings.Join(n.Unguarded, " "))
		}
	}
}
