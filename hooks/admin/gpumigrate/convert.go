package gpumigrate

import (
	"cmp"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Entry accounts for one input key: where it went, or why it went nowhere.
type Entry struct {
	Key    string   `json:"key"`
	Action Action   `json:"action"`
	To     []string `json:"to,omitempty"`
	Why    string   `json:"why,omitempty"`
}

// Result is a conversion: the values for this chart and the report on every input key.
type Result struct {
	Values map[string]any
	Report []Entry
	// Nodes summarises the operator's node labels (live mode only).
	Nodes []NodeLabelCount
	// Source is the GPU Operator release the values were read against.
	Source Source
}

// imageRef collects an operand's repository, image and version, which become one image.* block.
type imageRef struct {
	op                        operand
	out                       string // the output key of the operand (or pool), "" for a pool's root
	repo, image, version      string
	setRepo, setImage, setVer bool
	digest                    string
}

// converter walks one input tree with one rule table into out.
type converter struct {
	rules []Rule
	// root is the whole input, defaults included, for rules that read a sibling: the operator applied them too
	root map[string]any
	// defaults are the values of the release the input came from (OperatorTag's when not known)
	defaults map[string]any
	out      map[string]any
	prefix   string // input key prefix in the report (NVIDIADriver/<name>.spec.)
	images   map[string]*imageRef
	report   *[]Entry
	// imageOf resolves the operand of an input path's parent (values: operand keys; NVIDIADriver: the pool).
	imageOf func(parent string) (operand, bool)
}

func newConverter(rules []Rule, root map[string]any, out map[string]any, report *[]Entry) *converter {
	c := &converter{rules: rules, root: root, out: out, images: map[string]*imageRef{}, report: report}
	c.imageOf = func(parent string) (operand, bool) {
		for _, op := range operands {
			if op.from == parent {
				return op, true
			}
		}
		return operand{}, false
	}
	return c
}

// Convert turns GPU Operator values (or a ClusterPolicy spec, which uses the same keys) and NVIDIADriver objects
// into this chart's values, every value taken as the site's.
func Convert(values map[string]any, drivers []map[string]any) Result {
	return convert(values, drivers, Source{})
}

// convert converts values read against the defaults of the release src names: those are dropped, not converted.
func convert(values map[string]any, drivers []map[string]any, src Source) Result {
	r := Result{Values: map[string]any{}, Source: src}
	own := values
	if src.Version != "" {
		own = dropDefaults("", values, src.defaults(), src.Version, &r.Report)
	}
	if src.Doubt != "" {
		r.Report = append(r.Report, Entry{Key: "(source) GPU Operator release", Action: Decision, Why: src.Doubt})
	}
	c := newConverter(rules, values, r.Values, &r.Report)
	c.defaults = src.defaults()
	c.walk("", own)
	c.finishImages()
	convertDrivers(drivers, r.Values, &r.Report)
	mirrorOwnImage(r.Values, &r.Report)
	slices.SortStableFunc(r.Report, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return r
}

func (c *converter) add(e Entry) {
	e.Key = c.prefix + e.Key
	*c.report = append(*c.report, e)
}

func (c *converter) walk(path string, v any) {
	m, isMap := v.(map[string]any)
	if path != "" {
		r := lookup(c.rules, path)
		switch {
		case isMap && len(m) > 0 && hasRuleBelow(c.rules, path):
			// walked key by key below
		case r != nil:
			c.apply(r, path, v)
			return
		default:
			if a := c.ancestor(path); a != nil {
				c.apply(a, path, v)
				return
			}
			if !isMap || len(m) == 0 {
				c.add(Entry{Key: path, Action: Unknown, Why: "no place in kube-gpu-stack"})
				return
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		c.walk(strings.TrimPrefix(path+"."+k, "."), m[k])
	}
}

// ancestor is the nearest rule above path, which speaks for its whole subtree.
func (c *converter) ancestor(path string) *Rule {
	for p := path; strings.Contains(p, "."); {
		p = p[:strings.LastIndex(p, ".")]
		if r := lookup(c.rules, p); r != nil {
			return r
		}
	}
	return nil
}

func (c *converter) apply(r *Rule, path string, v any) {
	switch {
	case r.conv != nil:
		e := r.conv(c, path, v)
		e.Key = path
		c.add(e)
	case r.Action == Mapped:
		// an empty map changes nothing in Helm's merge; an empty list does (it replaces the default), so it is kept;
		// a list for a target an earlier key of the input filled (gds.imagePullSecrets and gdrcopy.imagePullSecrets
		// after driver.imagePullSecrets) adds to it: a full upstream copy's empty defaults must not wipe a set value
		prev, had := getPath(c.out, r.To)
		prevList, wasList := prev.([]any)
		list, isList := v.([]any)
		switch m, isMap := v.(map[string]any); {
		case had && wasList && isList:
			c.set(r.To, union(prevList, list))
		case !isMap || len(m) > 0:
			c.set(r.To, v)
		}
		c.add(Entry{Key: path, Action: Mapped, To: []string{r.To}})
	case r.Same != nil && equal(v, r.Same) && r.Action == Decision:
		c.add(Entry{Key: path, Action: Dropped, Why: fmt.Sprintf("%s: nothing to carry over (%s)", show(v), r.Why)})
	case r.Same != nil && equal(v, r.Same):
		c.add(Entry{Key: path, Action: Dropped, Why: fmt.Sprintf("%v is this chart's behaviour: %s", show(r.Same), r.Why)})
	case r.Same != nil:
		c.add(Entry{Key: path, Action: Decision, Why: fmt.Sprintf("set to %s: %s", show(v), r.Why)})
	default:
		c.add(Entry{Key: path, Action: r.Action, Why: r.Why})
	}
}

// union is a followed by the items of b it lacks, in order.
func union(a, b []any) []any {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.ContainsFunc(out, func(y any) bool { return equal(x, y) }) {
			out = append(out, x)
		}
	}
	return out
}

// set writes v at the dotted output path, creating maps on the way.
func (c *converter) set(path string, v any) { setPath(c.out, path, v) }

func setPath(m map[string]any, path string, v any) {
	segs := strings.Split(path, ".")
	for _, s := range segs[:len(segs)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[s] = next
		}
		m = next
	}
	m[segs[len(segs)-1]] = v
}

func getPath(m map[string]any, path string) (any, bool) {
	var cur any = m
	for _, s := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[s]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func equal(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	// an empty list or map equals its other empty spellings; numbers compare by value
	if isEmpty(a) && isEmpty(b) {
		return true
	}
	fa, oka := number(a)
	fb, okb := number(b)
	return oka && okb && fa == fb
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case []any:
		return len(t) == 0
	case map[string]any:
		return len(t) == 0
	}
	return false
}

func number(v any) (float64, bool) {
	switch t := v.(type) {
	case int:
		return float64(t), true
	case int64:
		return float64(t), true
	case float64:
		return t, true
	}
	return 0, false
}

func show(v any) string {
	switch t := v.(type) {
	case string:
		return strconv.Quote(t)
	case []any:
		if len(t) == 0 {
			return "[]"
		}
	case map[string]any:
		if len(t) == 0 {
			return "{}"
		}
		return "a map"
	}
	return fmt.Sprint(v)
}

// imagePart records one of repository / image / version / digest; finishImages writes them as image.*.
func imagePart(c *converter, at string, v any) Entry {
	parent, key := at[:max(strings.LastIndex(at, "."), 0)], at[strings.LastIndex(at, ".")+1:]
	op, ok := c.imageOf(parent)
	if !ok {
		return Entry{Action: Unknown, Why: "no place in kube-gpu-stack"}
	}
	ref := c.images[op.to]
	if ref == nil {
		ref = &imageRef{op: op, out: op.to}
		c.images[op.to] = ref
	}
	s := fmt.Sprint(v)
	t := strings.TrimPrefix(op.to+".", ".")
	switch key {
	case "repository":
		ref.repo, ref.setRepo = s, true
		return Entry{Action: Mapped, To: []string{t + "image.registry", t + "image.repository"}}
	case "image":
		ref.image, ref.setImage = s, true
		return Entry{Action: Mapped, To: []string{t + "image.registry", t + "image.repository"}}
	case "digest":
		ref.digest = s
		return Entry{Action: Mapped, To: []string{t + "image.digest"}}
	}
	if ran := c.ranImage(parent); !ref.setImage && ran != "" && ran[strings.LastIndex(ran, "/")+1:] != op.image {
		return Entry{Action: Decision, To: []string{t + "image.tag"}, Why: fmt.Sprintf("%s is a version of %s, which the operator ran there, "+
			"not of %s/%s, which this chart runs: not carried over (the chart's own tag applies); set %simage.tag to a tag of that image if you must",
			show(v), ran, op.repo, op.image, t)}
	}
	ref.version, ref.setVer = s, true
	if strings.HasPrefix(s, "sha256:") {
		return Entry{Action: Mapped, To: []string{t + "image.digest"}}
	}
	return Entry{Action: Mapped, To: []string{t + "image.tag"}}
}

// ranImage is the image the operator ran for the operand at parent where the input names none of its own: the
// default the input carried (dropped as such), else its release's; "" when neither names one.
func (c *converter) ranImage(parent string) string {
	for _, m := range []map[string]any{c.root, c.defaults} {
		if name, _ := getPath(m, parent+".image"); name != nil && name != "" {
			repo, _ := getPath(m, parent+".repository")
			return strings.TrimPrefix(fmt.Sprintf("%v/%v", valueOr(repo, ""), name), "/")
		}
	}
	return ""
}

// publicRegistries serve the operands' upstream images; any other registry the converted images name is the site's
// mirror.
var publicRegistries = map[string]bool{"nvcr.io": true, "registry.k8s.io": true, "ghcr.io": true, "docker.io": true,
	"quay.io": true, "registry.access.redhat.com": true, "registry.redhat.io": true}

// mirrorOwnImage: a site whose operand images come from its own mirror pulls this project's image (validators,
// driver managers, hooks) from there too, with the pull secrets its operands use: global.stackImage.registry is the
// mirror the most images name (its repository path kept, as `airgap mirror` and `image push` lay it out), and
// global.imagePullSecrets every secret an operand named.
func mirrorOwnImage(out map[string]any, report *[]Entry) {
	counts := map[string]int{}
	var secrets []any
	var walk func(any)
	walk = func(v any) {
		switch m := v.(type) {
		case map[string]any:
			if img, ok := m["image"].(map[string]any); ok {
				if reg, _ := img["registry"].(string); reg != "" && !publicRegistries[reg] {
					counts[reg]++
				}
			}
			if ps, ok := m["imagePullSecrets"].([]any); ok {
				for _, p := range ps {
					if !slices.ContainsFunc(secrets, func(q any) bool { return equal(p, q) }) {
						secrets = append(secrets, p)
					}
				}
			}
			for _, k := range slices.Sorted(maps.Keys(m)) {
				walk(m[k])
			}
		case []any:
			for _, e := range m {
				walk(e)
			}
		}
	}
	walk(out)
	if len(counts) == 0 {
		return
	}
	mirror := slices.MaxFunc(slices.Sorted(maps.Keys(counts)), func(a, b string) int { return cmp.Compare(counts[a], counts[b]) })
	if _, set := getPath(out, "global.stackImage.registry"); !set {
		setPath(out, "global.stackImage.registry", mirror)
	}
	e := Entry{Key: "(images) this project's own image", Action: Mapped, To: []string{"global.stackImage.registry=" + mirror},
		Why: "the operands' images come from the mirror " + mirror + ": the validators, driver managers and hooks run this project's image, " +
			"pulled from " + mirror + "/kube-gpu-stack/kube-gpu-stack; mirror it there (`kube-gpu-stack image push --registry " + mirror +
			"`, or `kube-gpu-stack airgap mirror`)"}
	if len(secrets) > 0 {
		if _, set := getPath(out, "global.imagePullSecrets"); !set {
			setPath(out, "global.imagePullSecrets", secrets)
		}
		e.To = append(e.To, "global.imagePullSecrets")
		e.Why += "; the operands' pull secrets go to every pod of the chart (global.imagePullSecrets), so its own image pulls with them"
	}
	*report = append(*report, e)
}

func (c *converter) finishImages() {
	for _, k := range slices.Sorted(maps.Keys(c.images)) {
		ref := c.images[k]
		img := map[string]any{}
		if full := ref.full(); full != "" {
			registry, repository, tag, digest := splitImage(full)
			img["registry"], img["repository"] = registry, repository
			if tag != "" {
				img["tag"] = tag
			}
			if digest != "" {
				img["digest"] = digest
			}
		}
		if ref.setVer && ref.version != "" {
			if strings.HasPrefix(ref.version, "sha256:") {
				img["digest"] = ref.version
			} else {
				img["tag"] = ref.version
			}
		}
		if ref.digest != "" {
			img["digest"] = ref.digest
		}
		path := strings.TrimPrefix(ref.out+".image", ".")
		for _, f := range slices.Sorted(maps.Keys(img)) {
			setPath(c.out, path+"."+f, img[f])
		}
	}
}

// full is the image reference the operator would run, from the repository and image set (each defaulting to the
// operator's own), or "" when neither was set or they name no image (the vGPU manager's empty default).
func (ref *imageRef) full() string {
	if !ref.setRepo && !ref.setImage {
		return ""
	}
	repo, name := ref.op.repo, ref.op.image
	if ref.setRepo {
		repo = ref.repo
	}
	if ref.setImage {
		name = ref.image
	}
	switch {
	case strings.Contains(name, "/"):
		return name
	case repo == "" || name == "":
		return ""
	}
	return repo + "/" + name
}

// splitImage splits registry/path[:tag][@digest]; a first segment without a dot, colon or `localhost` is a path on
// Docker Hub, as container runtimes read it.
func splitImage(ref string) (registry, repository, tag, digest string) {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref, digest = ref[:i], ref[i+1:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref, tag = ref[:i], ref[i+1:]
	}
	first, rest, ok := strings.Cut(ref, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first, rest, tag, digest
	}
	return "docker.io", ref, tag, digest
}

// envToMap turns a list of {name, value} into this chart's NAME: value map at target.
func envToMap(target string) convertFunc {
	return func(c *converter, at string, v any) Entry {
		list, _ := v.([]any)
		if len(list) == 0 {
			return Entry{Action: Mapped, To: []string{target}, Why: "empty"}
		}
		env, _ := getPath(c.out, target)
		m, _ := env.(map[string]any)
		if m == nil {
			m = map[string]any{}
		}
		var refs []string
		for _, item := range list {
			e, _ := item.(map[string]any)
			name, _ := e["name"].(string)
			if _, from := e["valueFrom"]; from || name == "" {
				refs = append(refs, name)
				continue
			}
			m[name] = fmt.Sprint(valueOr(e["value"], ""))
		}
		if len(m) > 0 {
			c.set(target, m)
		}
		if len(refs) > 0 {
			return Entry{Action: Decision, To: []string{target}, Why: fmt.Sprintf("variables with valueFrom (%s) have no place: %s takes plain values", strings.Join(refs, ", "), target)}
		}
		return Entry{Action: Mapped, To: []string{target}}
	}
}

func valueOr(v, def any) any {
	if v == nil {
		return def
	}
	return v
}

// platform presets of the container toolkit (docs/install.md, "Platforms"): the main config and socket each one implies.
var platformPresets = []struct{ platform, marker, config, socket string }{
	{"k3s", "/var/lib/rancher/k3s/", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml", "/run/k3s/containerd/containerd.sock"},
	{"rke2", "/var/lib/rancher/rke2/", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml", "/run/k3s/containerd/containerd.sock"},
	{"microk8s", "/var/snap/microk8s/", "/var/snap/microk8s/current/args/containerd-template.toml", "/var/snap/microk8s/common/run/containerd.sock"},
	{"k0s", "/etc/k0s/", "/etc/k0s/containerd.toml", "/run/k0s/containerd.sock"},
}

// toolkitEnv maps the toolkit's environment: the runtime paths become global.platform where they are a known
// distribution's (and toolkit.runtimeConfig.* where they differ from its preset), the rest toolkit.extraEnv.
func toolkitEnv(c *converter, at string, v any) Entry {
	list, _ := v.([]any)
	env := map[string]string{}
	var order []string
	for _, item := range list {
		e, _ := item.(map[string]any)
		name, _ := e["name"].(string)
		if name == "" {
			continue
		}
		env[name] = fmt.Sprint(valueOr(e["value"], ""))
		order = append(order, name)
	}
	var to, notes []string
	preset := ""
	for _, p := range platformPresets {
		if strings.HasPrefix(env["CONTAINERD_CONFIG"], p.marker) || strings.HasPrefix(env["CONTAINERD_SOCKET"], p.marker) ||
			(env["CONTAINERD_SOCKET"] == p.socket && p.platform == "k3s" && !strings.Contains(env["CONTAINERD_CONFIG"], "rke2")) {
			preset = p.platform
			c.set("global.platform", p.platform)
			to = append(to, "global.platform="+p.platform)
			if cfg := env["CONTAINERD_CONFIG"]; cfg != "" && cfg != p.config {
				c.set("toolkit.runtimeConfig.config", cfg)
				to = append(to, "toolkit.runtimeConfig.config")
				notes = append(notes, cfg+" differs from the "+p.platform+" preset's "+p.config+"; kept (docs/install.md, \"Platforms\")")
			}
			if s := env["CONTAINERD_SOCKET"]; s != "" && s != p.socket {
				c.set("toolkit.runtimeConfig.socket", s)
				to = append(to, "toolkit.runtimeConfig.socket")
			}
			break
		}
	}
	extra := map[string]any{}
	for _, name := range order {
		val := env[name]
		switch name {
		case "CONTAINERD_CONFIG", "CONTAINERD_SOCKET":
			if preset == "" && val != "" {
				k := map[string]string{"CONTAINERD_CONFIG": "config", "CONTAINERD_SOCKET": "socket"}[name]
				c.set("toolkit.runtimeConfig."+k, val)
				to = append(to, "toolkit.runtimeConfig."+k)
			}
		case "RUNTIME_CONFIG", "CRIO_CONFIG":
			c.set("toolkit.runtimeConfig.config", val)
			to = append(to, "toolkit.runtimeConfig.config")
		case "RUNTIME_DROP_IN_CONFIG":
			c.set("toolkit.runtimeConfig.dropInConfig", val)
			to = append(to, "toolkit.runtimeConfig.dropInConfig")
		case "RUNTIME_SOCKET":
			c.set("toolkit.runtimeConfig.socket", val)
			to = append(to, "toolkit.runtimeConfig.socket")
		case "RUNTIME":
			c.set("toolkit.runtime", val)
			to = append(to, "toolkit.runtime")
		case "CONTAINERD_RUNTIME_CLASS":
			c.set("global.runtimeClassName", val)
			to = append(to, "global.runtimeClassName")
		case "CONTAINERD_SET_AS_DEFAULT", "RUNTIME_SET_AS_DEFAULT":
			if val == "true" {
				notes = append(notes, name+"=true needs a decision: the nvidia runtime is never the default here; pods reach GPUs through CDI and the nvidia runtime class")
			} else {
				notes = append(notes, name+"="+val+" is this chart's behaviour")
			}
		default:
			extra[name] = val
		}
	}
	if len(extra) > 0 {
		c.set("toolkit.extraEnv", extra)
		to = append(to, "toolkit.extraEnv ("+strings.Join(slices.Sorted(maps.Keys(extra)), ", ")+")")
	}
	action := Mapped
	for _, n := range notes {
		if strings.Contains(n, "needs a decision") {
			action = Decision
		}
	}
	return Entry{Action: action, To: to, Why: strings.Join(notes, "; ")}
}

func openshiftPlatform(c *converter, at string, v any) Entry {
	if v == true {
		c.set("global.platform", "openshift")
		return Entry{Action: Mapped, To: []string{"global.platform=openshift"}}
	}
	return Entry{Action: Dropped, Why: "false: global.platform follows toolkit.env or stays generic"}
}

// psaLabels: the operator labels its namespace privileged with psa.enabled. This chart does so only for a
// namespace it renders itself (namespace.create=true, installed without --create-namespace), a choice of how the
// release is installed that migrate cannot make; setting namespace.podSecurityLabels alone would do nothing.
func psaLabels(c *converter, at string, v any) Entry {
	if v != true {
		return Entry{Action: Dropped, Why: "false: the namespace's labels are left alone, as they are here unless namespace.create=true"}
	}
	return Entry{Action: Decision, Why: "the release namespace must admit privileged pods: label it yourself (kubectl label ns NAMESPACE " +
		"pod-security.kubernetes.io/enforce=privileged), or set namespace.create=true and install without --create-namespace, " +
		"and the chart renders it labelled (namespace.podSecurityLabels, on by default)"}
}

func nfdMode(c *converter, at string, v any) Entry {
	if v == false {
		c.set("nfd.mode", "external")
		return Entry{Action: Mapped, To: []string{"nfd.mode=external"}, Why: "NFD installed separately; use nfd.mode=none if there is none and GPU nodes are labelled by hand"}
	}
	c.set("nfd.mode", "bundled")
	return Entry{Action: Mapped, To: []string{"nfd.mode=bundled"}}
}

// intOrPercent writes a count the operator allows as a string ("1") as the integer the API server accepts.
func intOrPercent(target string) convertFunc {
	return func(c *converter, at string, v any) Entry {
		if s, ok := v.(string); ok {
			if n, err := strconv.Atoi(s); err == nil {
				v = n
			}
		}
		c.set(target, v)
		return Entry{Action: Mapped, To: []string{target}}
	}
}

func precompiled(c *converter, at string, v any) Entry {
	c.set("driver.usePrecompiled", v)
	if v == true {
		return Entry{Action: Mapped, To: []string{"driver.usePrecompiled"}, Why: "list the GPU nodes' kernels in driver.kernels (one DaemonSet per kernel; migrate --from-cluster fills it from the nodes)"}
	}
	return Entry{Action: Mapped, To: []string{"driver.usePrecompiled"}}
}

func openModules(target string) convertFunc {
	return func(c *converter, at string, v any) Entry {
		if v == true {
			c.set(target, "open")
			return Entry{Action: Mapped, To: []string{target + "=open"}}
		}
		return Entry{Action: Dropped, Why: "false: " + target + " decides"}
	}
}

func certConfig(c *converter, at string, v any) Entry {
	if v == "" || v == nil {
		return Entry{Action: Dropped, Why: "\"\" is this chart's default"}
	}
	return Entry{Action: Decision, To: []string{"driver.certConfig.name", "driver.certConfig.keys"},
		Why: fmt.Sprintf("set driver.certConfig.name=%v and list the ConfigMap's file names in driver.certConfig.keys (not written: the chart refuses a name without keys)", v)}
}

func driverType(c *converter, at string, v any) Entry {
	switch v {
	case "gpu", "", nil:
		return Entry{Action: Dropped, Why: "the driver chart installs the data-center (gpu) driver"}
	case "vgpu":
		return Entry{Action: Dropped, Why: "a vGPU guest driver is the driver image you set plus driver.licensingConfig"}
	}
	return Entry{Action: Decision, To: []string{"vgpuManager"}, Why: fmt.Sprintf("driverType %v: the vGPU host driver is vgpuManager here (vm-vgpu nodes)", v)}
}

func kataManager(c *converter, at string, v any) Entry {
	m, _ := v.(map[string]any)
	if m["enabled"] == true {
		return Entry{Action: Decision, Why: "this chart has no Kata manager: install the Kata runtime and its RuntimeClasses yourself (global.sandboxWorkloads.mode=kata)"}
	}
	return Entry{Action: Dropped, Why: "disabled, and this chart has no Kata manager"}
}

func defaultRuntime(c *converter, at string, v any) Entry {
	switch v {
	case "containerd", "crio":
		c.set("toolkit.runtime", v)
		return Entry{Action: Mapped, To: []string{"toolkit.runtime"}}
	}
	return Entry{Action: Decision, Why: fmt.Sprintf("runtime %v is not supported: containerd or crio", show(v))}
}

// upgradeBound folds maxParallelUpgrades and maxUnavailable into this chart's one bound: the operator upgrades at
// most the smaller of both at once; a percentage cannot be compared with a count, so maxParallelUpgrades wins then.
func upgradeBound(policy map[string]any) (any, bool) {
	mp, hasMP := number(policy["maxParallelUpgrades"])
	mu, hasMU := policy["maxUnavailable"]
	if s, ok := mu.(string); ok {
		if n, err := strconv.Atoi(s); err == nil {
			mu = n
		}
	}
	if hasMP && mp > 0 {
		if n, ok := number(mu); hasMU && ok && n >= 1 && n < mp {
			return int(n), true
		}
		return int(mp), true
	}
	if hasMU {
		return mu, true
	}
	return nil, false
}

func upgradeBoundRule(policyPath, target string) convertFunc {
	return func(c *converter, at string, v any) Entry {
		p, _ := getPath(c.root, policyPath)
		policy, _ := p.(map[string]any)
		b, ok := upgradeBound(policy)
		if !ok {
			return Entry{Action: Dropped, Why: "0 means unlimited: maxUnavailable bounds the rollout"}
		}
		if n, isNum := number(b); isNum && n < 1 {
			return Entry{Action: Decision, To: []string{target}, Why: "unbounded parallel upgrades: this chart needs a bound of at least 1"}
		}
		c.set(target, b)
		return Entry{Action: Mapped, To: []string{fmt.Sprintf("%s=%v", target, b)}, Why: "one bound here: the smaller of maxParallelUpgrades and maxUnavailable (maxParallelUpgrades when maxUnavailable is a percentage)"}
	}
}

var (
	maxParallel    = upgradeBoundRule("driver.upgradePolicy", "driver.upgradePolicy.maxUnavailable")
	maxUnavailable = maxParallel
)

// dcgmHostEngine is where the operator points the exporter when the standalone DCGM runs (its Service and port).
const dcgmHostEngine = "nvidia-dcgm:5555"

// dcgmStandalone: with the standalone DCGM on, the operator points the exporter at it; this chart needs the address
// said (dcgmExporter.remoteHostEngine), or refuses to render rather than run a second, embedded engine.
func dcgmStandalone(c *converter, at string, v any) Entry {
	c.set("dcgm.enabled", v)
	if v != true {
		return Entry{Action: Mapped, To: []string{"dcgm.enabled"}}
	}
	if _, set := getPath(c.out, "dcgmExporter.remoteHostEngine"); !set {
		c.set("dcgmExporter.remoteHostEngine", dcgmHostEngine)
	}
	return Entry{Action: Mapped, To: []string{"dcgm.enabled", "dcgmExporter.remoteHostEngine=" + dcgmHostEngine},
		Why: "the exporter reads the standalone host engine, as the operator set it up"}
}

// serviceMonitor: the operator creates the ServiceMonitor only where its CRD exists; this chart renders it when asked.
func serviceMonitor(c *converter, at string, v any) Entry {
	c.set("dcgmExporter.serviceMonitor.enabled", v)
	e := Entry{Action: Mapped, To: []string{"dcgmExporter.serviceMonitor.enabled"}}
	if v == true {
		e.Why = "the chart then renders a ServiceMonitor: the cluster must serve monitoring.coreos.com/v1 (the operator skipped it where the CRD was missing)"
	}
	return e
}

// nfdSubchart: the operator's NFD subchart values. Its defaults (PCI whitelist, GPU tolerations, GC) are what the
// bundled NFD here does; anything changed from them must be carried over by hand, the keys differ, so the report
// names each changed key.
func nfdSubchart(c *converter, at string, v any) Entry {
	changed := changedKeys(at, v, c.defaults["node-feature-discovery"])
	if len(changed) == 0 {
		return Entry{Action: Dropped, Why: "the operator's defaults: the bundled NFD (nfd.mode=bundled) has the same PCI whitelist, GPU tolerations and GC"}
	}
	return Entry{Action: Decision, To: []string{"nfd.worker", "nfd.master", "nfd.gc"},
		Why: "changed from the operator's defaults: " + strings.Join(changed, ", ") +
			"; carry them over to nfd.worker / nfd.master / nfd.gc (operands/node-feature-discovery/values.yaml), whose keys differ"}
}

// changedKeys are the paths under at whose values in v differ from def, down to scalars and lists. A key v leaves
// out keeps its default, and so does an empty map (Helm merges values files), so only v's keys count.
func changedKeys(at string, v, def any) []string {
	m, isMap := v.(map[string]any)
	dm, defIsMap := def.(map[string]any)
	switch {
	case isMap && len(m) == 0:
		return nil
	case !isMap || !defIsMap:
		if equal(v, def) {
			return nil
		}
		return []string{at}
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, changedKeys(at+"."+k, m[k], dm[k])...)
	}
	return out
}

// migConfigData: the operator's MIG ConfigMap data is a map of file name to content; here it is the one config.yaml.
func migConfigData(c *converter, at string, v any) Entry {
	m, _ := v.(map[string]any)
	if len(m) == 0 {
		return Entry{Action: Dropped, Why: "{}: nothing to carry over (the chart's MIG layouts apply)"}
	}
	if len(m) == 1 {
		for k, body := range m {
			if s, ok := body.(string); ok {
				c.set("migManager.config.data", s)
				return Entry{Action: Mapped, To: []string{"migManager.config.data"}, Why: "the content of " + k}
			}
		}
	}
	return Entry{Action: Decision, To: []string{"migManager.config.data"}, Why: "several files: write the MIG configurations as one config.yaml in migManager.config.data (a string)"}
}

// migConfigName: with create the operator made that ConfigMap from config.data (and takes it away when removed);
// here the chart renders config.data itself, and config.name names a ConfigMap of your own.
func migConfigName(c *converter, at string, v any) Entry {
	if create, _ := getPath(c.root, "migManager.config.create"); create == true {
		return Entry{Action: Dropped, Why: "the operator created it from config.data; the chart renders migManager.config.data into its own ConfigMap"}
	}
	if v != "" {
		c.set("migManager.config.name", v)
	}
	return Entry{Action: Mapped, To: []string{"migManager.config.name"}}
}
