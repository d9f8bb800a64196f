package gpumigrate

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// driverRules map an NVIDIADriver's spec to a driver pool (To is relative to the pool; the default CR's pool is the
// top-level driver values).
var driverRules = buildDriverRules()

const poolNoPlace = "a driver pool has no setting of its own for this; the top-level driver values apply to every pool"

func buildDriverRules() []Rule {
	rs := []Rule{
		{From: "repository", conv: imagePart, Targets: []string{"image.registry", "image.repository"}},
		{From: "image", conv: imagePart, Targets: []string{"image.registry", "image.repository"}},
		{From: "version", conv: imagePart, Targets: []string{"image.tag"}},
		{From: "kernelModuleType", To: "kernelModuleType"},
		{From: "useOpenKernelModules", conv: openModules("kernelModuleType"), Targets: []string{"kernelModuleType"}},
		{From: "usePrecompiled", conv: func(c *converter, at string, v any) Entry {
			c.set("usePrecompiled", v)
			e := Entry{Action: Mapped, To: []string{"usePrecompiled"}}
			if v == true {
				e.Why = "list the pool's kernels in its kernels (one DaemonSet per kernel; migrate --from-cluster fills driver.kernels from the nodes)"
			}
			return e
		}, Targets: []string{"usePrecompiled"}},
		{From: "rdma.enabled", To: "rdma.enabled"},
		{From: "rdma.useHostMofed", To: "rdma.useHostMofed"},
		{From: "gds.enabled", To: "gds.enabled"},
		{From: "gdrcopy.enabled", To: "gdrcopy.enabled"},
		{From: "gds", Action: Decision, Why: "the GDS container's image and settings are driver.gds, shared by all pools"},
		{From: "gdrcopy", Action: Decision, Why: "the GDRCopy container's image and settings are driver.gdrcopy, shared by all pools"},
		{From: "licensingConfig.name", To: "licensingConfig.configMapName"},
		{From: "licensingConfig.secretName", To: "licensingConfig.secretName"},
		{From: "licensingConfig.nlsEnabled", To: "licensingConfig.nlsEnabled"},
		{From: "repoConfig.name", To: "repoConfig.configMapName"},
		{From: "certConfig.name", conv: certConfig, Targets: []string{"certConfig.name"}},
		{From: "kernelModuleConfig.name", To: "kernelModuleConfig.name"},
		{From: "upgradePolicy.autoUpgrade", To: "upgradePolicy.autoUpgrade"},
		{From: "upgradePolicy.maxParallelUpgrades", conv: poolBound, Targets: []string{"upgradePolicy.maxUnavailable"}},
		{From: "upgradePolicy.maxUnavailable", conv: poolBound, Targets: []string{"upgradePolicy.maxUnavailable"}},
		{From: "upgradePolicy", Action: Decision, Why: "drain, pod deletion and waiting are driver.manager.*, shared by all pools"},
		{From: "driverType", conv: driverType, Targets: []string{"source"}},
		{From: "default", Action: Dropped, Why: "the default NVIDIADriver becomes the top-level driver values"},
		{From: "nodeSelector", conv: func(*converter, string, any) Entry {
			return Entry{Action: Mapped, To: []string{"nodeSelector.matchLabels"}}
		}, Targets: []string{"nodeSelector.matchLabels"}},
		{From: "virtualTopologyConfig", Action: Decision, Why: "no place for a vGPU virtual topology ConfigMap"},
		{From: "secretEnv", Action: Decision, Why: "no place for a Secret of driver environment; put its values in driver.extraEnv"},
		{From: "manager", Action: Dropped, Why: "the driver manager here is this project's own, not NVIDIA's k8s-driver-manager"},
		{From: "startupProbe", Action: Decision, Why: "driver.startupProbe is shared by all pools"},
		{From: "livenessProbe", Action: Dropped, Why: "the driver pod's health is judged by its startup probe and the validator"},
		{From: "readinessProbe", Action: Dropped, Why: "the driver pod is ready when its status file is written"},
	}
	for _, k := range []string{"annotations", "labels", "tolerations", "nodeAffinity", "priorityClassName", "env", "args",
		"resources", "imagePullPolicy", "imagePullSecrets", "hostNetwork", "podSecurityContext"} {
		rs = append(rs, Rule{From: k, Action: Decision, Why: poolNoPlace + " (driver." + k + ")"})
	}
	for i := range rs {
		if rs[i].Action == "" {
			rs[i].Action = Mapped
		}
		if rs[i].To != "" && rs[i].Targets == nil {
			rs[i].Targets = []string{rs[i].To}
		}
	}
	return rs
}

// DriverRules returns the NVIDIADriver table; its targets are keys of a driver pool.
func DriverRules() []Rule { return driverRules }

func poolBound(c *converter, at string, v any) Entry {
	p, _ := getPath(c.root, "upgradePolicy")
	policy, _ := p.(map[string]any)
	b, ok := upgradeBound(policy)
	if !ok {
		return Entry{Action: Dropped, Why: "0 means unlimited: maxUnavailable bounds the rollout"}
	}
	if n, isNum := number(b); isNum && n < 1 {
		return Entry{Action: Decision, Why: "unbounded parallel upgrades: a pool needs a bound of at least 1"}
	}
	c.set("upgradePolicy.maxUnavailable", b)
	return Entry{Action: Mapped, To: []string{fmt.Sprintf("upgradePolicy.maxUnavailable=%v", b)}, Why: "one bound here: the smaller of maxParallelUpgrades and maxUnavailable"}
}

var poolName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$`)

// convertDrivers turns NVIDIADriver objects into driver pools; the one marked default becomes the top-level driver.
func convertDrivers(drivers []map[string]any, values map[string]any, report *[]Entry) {
	var pools []any
	slices.SortFunc(drivers, func(a, b map[string]any) int { return strings.Compare(objName(a), objName(b)) })
	for _, d := range drivers {
		name := objName(d)
		spec, _ := d["spec"].(map[string]any)
		pool := map[string]any{}
		first := len(*report)
		c := newConverter(driverRules, spec, pool, report)
		c.prefix = "NVIDIADriver/" + name + ".spec."
		c.imageOf = func(parent string) (operand, bool) {
			if parent != "" {
				return operand{}, false
			}
			return operand{from: "", to: "", repo: "nvcr.io/nvidia", image: "driver"}, true
		}
		c.walk("", spec)
		c.finishImages()
		if spec["driverType"] == "vgpu-host-manager" {
			continue // reported as needing a decision: it is vgpuManager here
		}
		target := "driver."
		if spec["default"] != true {
			target = "driver.pools[" + name + "]."
		}
		for i := first; i < len(*report); i++ {
			for j, to := range (*report)[i].To {
				if !strings.HasPrefix(to, "driver") && to != "vgpuManager" {
					(*report)[i].To[j] = target + to
				}
			}
		}
		if spec["default"] == true {
			if ns, _ := spec["nodeSelector"].(map[string]any); len(ns) > 0 {
				*report = append(*report, Entry{Key: "NVIDIADriver/" + name + ".spec.nodeSelector", Action: Decision, To: []string{"driver"},
					Why: "the default pool serves every GPU node no pool selects, not only those matching this selector"})
			}
			for _, k := range slices.Sorted(maps.Keys(pool)) {
				mergeInto(values, "driver."+k, pool[k])
			}
			*report = append(*report, Entry{Key: "NVIDIADriver/" + name, Action: Mapped, To: []string{"driver (the default pool)"}})
			continue
		}
		pname := name
		why := ""
		if !poolName.MatchString(pname) {
			pname = sanitizePool(name)
			why = fmt.Sprintf("pool names are at most 20 lower-case letters, digits and '-': %q became %q", name, pname)
		}
		pool["name"] = pname
		sel := map[string]any{}
		if ns, ok := spec["nodeSelector"].(map[string]any); ok && len(ns) > 0 {
			sel["matchLabels"] = ns
		} else {
			why = strings.TrimPrefix(why+"; no nodeSelector: the pool selects every node, so it overlaps the others (select it on a label such as nvidia.com/driver.pool)", "; ")
			sel["matchExpressions"] = []any{map[string]any{"key": "nvidia.com/driver.pool", "operator": "In", "values": []any{pname}}}
		}
		pool["nodeSelector"] = sel
		pools = append(pools, pool)
		action := Mapped
		if strings.Contains(why, "no nodeSelector") {
			action = Decision
		}
		*report = append(*report, Entry{Key: "NVIDIADriver/" + name, Action: action, To: []string{"driver.pools[" + pname + "]"}, Why: why})
	}
	if len(pools) > 0 {
		setPath(values, "driver.pools", pools)
	}
	if len(drivers) > 0 && !slices.ContainsFunc(drivers, func(d map[string]any) bool {
		spec, _ := d["spec"].(map[string]any)
		return spec["default"] == true
	}) {
		*report = append(*report, Entry{Key: "NVIDIADriver (none with default: true)", Action: Decision, To: []string{"driver"},
			Why: "the operator gave no driver to GPU nodes that no NVIDIADriver selects; here the top-level driver values serve them: check that those values are what such nodes should get, or select every GPU node with a pool"})
	}
}

func objName(o map[string]any) string {
	md, _ := o["metadata"].(map[string]any)
	n, _ := md["name"].(string)
	return n
}

func sanitizePool(name string) string {
	b := []byte(strings.ToLower(name))
	for i, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
			b[i] = '-'
		}
	}
	s := strings.Trim(string(b), "-")
	if len(s) > 20 {
		s = strings.Trim(s[:20], "-")
	}
	if s == "" {
		s = "pool"
	}
	return s
}

// mergeInto sets path to v, merging maps key by key so a default NVIDIADriver refines the ClusterPolicy's driver.
func mergeInto(m map[string]any, path string, v any) {
	if vm, ok := v.(map[string]any); ok {
		for k, x := range vm {
			mergeInto(m, path+"."+k, x)
		}
		return
	}
	setPath(m, path, v)
}
