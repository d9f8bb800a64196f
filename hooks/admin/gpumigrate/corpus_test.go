package gpumigrate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// The corpus: for each known release, a site's ~20 changes to its values.yaml (testdata/corpus/<tag>-site.yaml),
// merged over the vendored file as a site edits its full copy. Each is migrated as `migrate -f` does, the chart
// rendered with the result as `helm install -f` would, and every change checked on the rendered objects, field by
// field; no default image tag of the release may reach them.

// siteChanges are a corpus file's changes.
func siteChanges(t *testing.T, tag string) map[string]any {
	t.Helper()
	return parse(t, filepath.Join("testdata", "corpus", tag+"-site.yaml")).Values
}

// corpusCopy is a release's full values.yaml with the corpus's site changes.
func corpusCopy(t *testing.T, tag string) map[string]any {
	t.Helper()
	values := parse(t, releaseFile(tag)).Values
	mergeMaps(values, siteChanges(t, tag))
	return values
}

// rendered are a render's objects, decoded generically.
type rendered []map[string]any

func renderValuesFile(t *testing.T, values string) rendered {
	t.Helper()
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	stream, err := chartrender.RenderRepo(t.Context(), []string{file}, nil)
	if err != nil {
		t.Fatalf("the values migrate wrote do not render: %v\n%s", err, values)
	}
	var objs rendered
	for _, doc := range strings.Split(stream, "\n---") {
		var obj map[string]any
		if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs
}

func (objs rendered) find(kind, name string) map[string]any {
	for _, o := range objs {
		if o["kind"] == kind && nameOf(o) == name {
			return o
		}
	}
	return nil
}

func nameOf(o map[string]any) string {
	s, _ := getPath(o, "metadata.name")
	name, _ := s.(string)
	return name
}

// daemonSets are the rendered DaemonSets whose name is name, or starts with it when it ends in "-".
func (objs rendered) daemonSets(t *testing.T, name string) []appsv1.DaemonSet {
	t.Helper()
	var out []appsv1.DaemonSet
	for _, o := range objs {
		n := nameOf(o)
		if o["kind"] != "DaemonSet" || !(n == name || strings.HasSuffix(name, "-") && strings.HasPrefix(n, name)) {
			continue
		}
		b, _ := sigsyaml.Marshal(o)
		var ds appsv1.DaemonSet
		if err := sigsyaml.Unmarshal(b, &ds); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		out = append(out, ds)
	}
	if len(out) == 0 {
		t.Fatalf("no DaemonSet %s rendered", name)
	}
	return out
}

// allDaemonSets are every rendered DaemonSet.
func (objs rendered) allDaemonSets(t *testing.T) []appsv1.DaemonSet {
	t.Helper()
	var out []appsv1.DaemonSet
	for _, o := range objs {
		if o["kind"] == "DaemonSet" {
			out = append(out, objs.daemonSets(t, nameOf(o))...)
		}
	}
	return out
}

// images are every image the objects name, pods and hooks alike.
func (objs rendered) images() []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch t := v.(type) {
		case map[string]any:
			if img, ok := t["image"].(string); ok {
				out = append(out, img)
			}
			for _, x := range t {
				walk(x)
			}
		case []any:
			for _, x := range t {
				walk(x)
			}
		}
	}
	for _, o := range objs {
		walk(o)
	}
	return out
}

func containers(ds appsv1.DaemonSet) []corev1.Container {
	return append(slices.Clone(ds.Spec.Template.Spec.InitContainers), ds.Spec.Template.Spec.Containers...)
}

func envOf(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// containerWithEnv is the DaemonSet's container that sets the environment variable name.
func containerWithEnv(t *testing.T, ds appsv1.DaemonSet, name string) map[string]string {
	t.Helper()
	for _, c := range containers(ds) {
		if env := envOf(c); env[name] != "" {
			return env
		}
	}
	t.Fatalf("no container of %s sets %s", ds.Name, name)
	return nil
}

// siteString is the site's value at path as a string.
func siteString(site map[string]any, path string) string {
	v, _ := getPath(site, path)
	return fmt.Sprint(v)
}

// siteEnv is a site's env list as a map.
func siteEnv(site map[string]any, path string) map[string]string {
	v, _ := getPath(site, path)
	list, _ := v.([]any)
	env := map[string]string{}
	for _, item := range list {
		e, _ := item.(map[string]any)
		env[fmt.Sprint(e["name"])] = fmt.Sprint(e["value"])
	}
	return env
}

// operandDaemonSets are the rendered DaemonSets of the operator's operand keys the corpus changes.
var operandDaemonSets = map[string]string{
	"driver": "nvidia-driver-daemonset-", "toolkit": "nvidia-container-toolkit-daemonset", "devicePlugin": "nvidia-device-plugin-daemonset",
	"gfd": "gpu-feature-discovery", "dcgmExporter": "nvidia-dcgm-exporter", "migManager": "nvidia-mig-manager",
	"validator": "nvidia-operator-validator", "dcgm": "nvidia-dcgm", "vfioManager": "nvidia-vfio-manager",
}

// corpusCheck checks that the site's changes at keys (the corpus's paths, a subtree each) reached the rendered
// objects; it runs where the corpus changes them.
type corpusCheck struct {
	keys  []string
	check func(t *testing.T, site map[string]any, objs rendered, tag string)
}

// operandImageChecks: an operand whose repository the site changed runs that repository's image, at the site's
// version or else at this chart's tag, never at the release's default one; its pods pull with the site's secrets.
func operandImageChecks() []corpusCheck {
	var checks []corpusCheck
	for _, op := range operands {
		ds, ok := operandDaemonSets[op.from]
		if !ok {
			continue
		}
		checks = append(checks,
			corpusCheck{keys: []string{op.from + ".repository", op.from + ".version"}, check: func(t *testing.T, site map[string]any, objs rendered, tag string) {
				repo := op.repo
				if r, set := getPath(site, op.from+".repository"); set {
					repo = fmt.Sprint(r)
				}
				for _, d := range objs.daemonSets(t, ds) {
					want := repo + "/" + op.image + ":"
					if op.ownImage {
						want = strings.SplitN(repo, "/", 2)[0] + "/kube-gpu-stack/kube-gpu-stack:"
					}
					if v, set := getPath(site, op.from+".version"); set {
						want += fmt.Sprint(v)
					}
					for _, c := range d.Spec.Template.Spec.Containers {
						if !strings.HasPrefix(c.Image, want) && !strings.Contains(c.Image, "/kube-gpu-stack/kube-gpu-stack:") {
							t.Errorf("%s container %s runs %s, not %s...", d.Name, c.Name, c.Image, want)
						}
					}
					if !slices.ContainsFunc(containers(d), func(c corev1.Container) bool { return strings.HasPrefix(c.Image, want) }) {
						t.Errorf("%s runs %v, none %s...", d.Name, containerImages(d), want)
					}
				}
			}},
			corpusCheck{keys: []string{op.from + ".imagePullSecrets"}, check: func(t *testing.T, site map[string]any, objs rendered, tag string) {
				want, _ := getPath(site, op.from+".imagePullSecrets")
				for _, d := range objs.daemonSets(t, ds) {
					for _, s := range want.([]any) {
						if !slices.ContainsFunc(d.Spec.Template.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == s }) {
							t.Errorf("%s pulls with %v, not the site's %v", d.Name, d.Spec.Template.Spec.ImagePullSecrets, s)
						}
					}
				}
			}})
	}
	return checks
}

func containerImages(d appsv1.DaemonSet) []string {
	var out []string
	for _, c := range containers(d) {
		out = append(out, c.Image)
	}
	return out
}

// corpusChecks check each kind of change the corpus makes.
var corpusChecks = append(operandImageChecks(), []corpusCheck{
	{keys: []string{"driver.rdma"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		for _, d := range objs.daemonSets(t, operandDaemonSets["driver"]) {
			env := containerWithEnv(t, d, "USE_HOST_MOFED")
			if env["GPU_DIRECT_RDMA_ENABLED"] != siteString(site, "driver.rdma.enabled") || env["USE_HOST_MOFED"] != siteString(site, "driver.rdma.useHostMofed") {
				t.Errorf("%s: GPU_DIRECT_RDMA_ENABLED=%s USE_HOST_MOFED=%s, want the site's rdma %v", d.Name, env["GPU_DIRECT_RDMA_ENABLED"], env["USE_HOST_MOFED"], site["driver"].(map[string]any)["rdma"])
			}
		}
	}},
	{keys: []string{"driver.upgradePolicy.maxParallelUpgrades"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		// the operator's maxUnavailable default is a percentage, so maxParallelUpgrades is the one bound
		want := siteString(site, "driver.upgradePolicy.maxParallelUpgrades")
		pools := driverPools(t, objs)
		for _, p := range pools {
			if fmt.Sprint(p["maxUnavailable"]) != want {
				t.Errorf("driver pool %v upgrades %v nodes at once, want the site's %s", p["name"], p["maxUnavailable"], want)
			}
		}
	}},
	{keys: []string{"driver.upgradePolicy.drain"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		for _, d := range objs.daemonSets(t, operandDaemonSets["driver"]) {
			env := containerWithEnv(t, d, "ENABLE_AUTO_DRAIN")
			if env["ENABLE_AUTO_DRAIN"] != siteString(site, "driver.upgradePolicy.drain.enable") ||
				env["DRAIN_POD_SELECTOR_LABEL"] != siteString(site, "driver.upgradePolicy.drain.podSelector") ||
				!strings.HasPrefix(env["DRAIN_TIMEOUT_SECONDS"], siteString(site, "driver.upgradePolicy.drain.timeoutSeconds")) {
				t.Errorf("%s: driver manager drain env %v, want the site's %v", d.Name, env, site["driver"].(map[string]any)["upgradePolicy"])
			}
		}
	}},
	{keys: []string{"toolkit.env"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		for _, d := range objs.daemonSets(t, operandDaemonSets["toolkit"]) {
			env := containerWithEnv(t, d, "CONTAINERD_CONFIG")
			for k, v := range siteEnv(site, "toolkit.env") {
				switch k {
				case "CONTAINERD_CONFIG", "CONTAINERD_SOCKET":
					// the toolkit edits the host's file through a mount of its folder, as the operator's does
					if !strings.HasSuffix(env[k], "/"+filepath.Base(v)) || !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(vol corev1.Volume) bool {
						return vol.HostPath != nil && vol.HostPath.Path == filepath.Dir(v)
					}) {
						t.Errorf("%s: %s=%q and no mount of %s: not the site's %s", d.Name, k, env[k], filepath.Dir(v), v)
					}
				default:
					if env[k] != v {
						t.Errorf("%s: %s=%q, want the site's %q", d.Name, k, env[k], v)
					}
				}
			}
		}
	}},
	{keys: []string{"devicePlugin.config"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		name, def := siteString(site, "devicePlugin.config.name"), siteString(site, "devicePlugin.config.default")
		cm := objs.find("ConfigMap", name)
		if got, _ := getPath(cm, "data."+def); got != siteString(site, "devicePlugin.config.data."+def) {
			t.Errorf("ConfigMap %s holds %v under %s, want the site's config", name, got, def)
		}
		for _, d := range objs.daemonSets(t, operandDaemonSets["devicePlugin"]) {
			if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == name }) {
				t.Errorf("%s does not mount ConfigMap %s", d.Name, name)
			}
			if env := containerWithEnv(t, d, "DEFAULT_CONFIG"); env["DEFAULT_CONFIG"] != def {
				t.Errorf("%s: DEFAULT_CONFIG=%s, want the site's %s", d.Name, env["DEFAULT_CONFIG"], def)
			}
		}
	}},
	{keys: []string{"devicePlugin.resources"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		var want corev1.ResourceRequirements
		v, _ := getPath(site, "devicePlugin.resources")
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		for _, d := range objs.daemonSets(t, operandDaemonSets["devicePlugin"]) {
			if !slices.ContainsFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return sameResources(c.Resources, want) }) {
				t.Errorf("no container of %s has the site's resources %v", d.Name, v)
			}
		}
	}},
	{keys: []string{"dcgm.enabled"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		objs.daemonSets(t, operandDaemonSets["dcgm"])
		for _, d := range objs.daemonSets(t, operandDaemonSets["dcgmExporter"]) {
			if env := containerWithEnv(t, d, "DCGM_REMOTE_HOSTENGINE_INFO"); env["DCGM_REMOTE_HOSTENGINE_INFO"] != "nvidia-dcgm:5555" {
				t.Errorf("%s reads the host engine at %q, not the standalone DCGM's nvidia-dcgm:5555", d.Name, env["DCGM_REMOTE_HOSTENGINE_INFO"])
			}
		}
	}},
	{keys: []string{"dcgm.hostPort"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		want, _ := getPath(site, "dcgm.hostPort")
		for _, d := range objs.daemonSets(t, operandDaemonSets["dcgm"]) {
			if !slices.ContainsFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return fmt.Sprint(p.HostPort) == fmt.Sprint(want) })
			}) {
				t.Errorf("no container of %s exposes the host engine on the site's host port %v", d.Name, want)
			}
		}
	}},
	{keys: []string{"dcgmExporter.serviceMonitor"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		sm := objs.find("ServiceMonitor", "nvidia-dcgm-exporter")
		if sm == nil {
			t.Fatal("no ServiceMonitor nvidia-dcgm-exporter rendered")
		}
		endpoints, _ := getPath(sm, "spec.endpoints")
		for _, ep := range endpoints.([]any) {
			if got := ep.(map[string]any)["interval"]; got != siteString(site, "dcgmExporter.serviceMonitor.interval") {
				t.Errorf("the ServiceMonitor scrapes every %v, not the site's %s", got, siteString(site, "dcgmExporter.serviceMonitor.interval"))
			}
		}
		labels, _ := getPath(site, "dcgmExporter.serviceMonitor.additionalLabels")
		for k, v := range labels.(map[string]any) {
			if got, _ := getPath(sm, "metadata.labels."+k); got != v {
				t.Errorf("the ServiceMonitor's label %s=%v, want the site's %v", k, got, v)
			}
		}
	}},
	{keys: []string{"mig.strategy"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		for _, name := range []string{operandDaemonSets["devicePlugin"], operandDaemonSets["gfd"]} {
			for _, d := range objs.daemonSets(t, name) {
				if env := containerWithEnv(t, d, "MIG_STRATEGY"); env["MIG_STRATEGY"] != siteString(site, "mig.strategy") {
					t.Errorf("%s: MIG_STRATEGY=%s, want the site's %s", d.Name, env["MIG_STRATEGY"], siteString(site, "mig.strategy"))
				}
			}
		}
	}},
	{keys: []string{"migManager.config.default"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		want := "nvidia.com/mig.config=" + siteString(site, "migManager.config.default")
		for _, d := range objs.daemonSets(t, operandDaemonSets["migManager"]) {
			if !slices.ContainsFunc(containers(d), func(c corev1.Container) bool {
				return slices.Contains(c.Command, want) || slices.Contains(c.Args, want)
			}) {
				t.Errorf("%s does not seed %s", d.Name, want)
			}
		}
	}},
	{keys: []string{"daemonsets.priorityClassName", "daemonsets.labels", "daemonsets.tolerations"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		var tolerations []corev1.Toleration
		v, _ := getPath(site, "daemonsets.tolerations")
		b, _ := json.Marshal(v)
		if err := json.Unmarshal(b, &tolerations); err != nil {
			t.Fatal(err)
		}
		labels, _ := getPath(site, "daemonsets.labels")
		for _, d := range objs.allDaemonSets(t) {
			spec := d.Spec.Template.Spec
			if spec.PriorityClassName != siteString(site, "daemonsets.priorityClassName") {
				t.Errorf("%s runs at priority %q, not the site's %s", d.Name, spec.PriorityClassName, siteString(site, "daemonsets.priorityClassName"))
			}
			for k, v := range labels.(map[string]any) {
				if d.Spec.Template.Labels[k] != v {
					t.Errorf("%s's pods are labelled %s=%q, not the site's %v", d.Name, k, d.Spec.Template.Labels[k], v)
				}
			}
			for _, tl := range tolerations {
				if !slices.ContainsFunc(spec.Tolerations, func(x corev1.Toleration) bool { return x.MatchToleration(&tl) }) {
					t.Errorf("%s does not tolerate the site's %v", d.Name, tl)
				}
			}
		}
	}},
	{keys: []string{"validator.driver.env"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		want := siteEnv(site, "validator.driver.env")
		for _, d := range objs.daemonSets(t, operandDaemonSets["validator"]) {
			if !slices.ContainsFunc(containers(d), func(c corev1.Container) bool { return c.Name == "driver-validation" && subset(want, envOf(c)) }) {
				t.Errorf("%s's driver-validation container lacks the site's env %v", d.Name, want)
			}
		}
	}},
	{keys: []string{"nfd.enabled"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		if site["nfd"].(map[string]any)["enabled"] != false {
			t.Skip("the corpus keeps the bundled NFD")
		}
		for _, o := range objs {
			if (o["kind"] == "DaemonSet" || o["kind"] == "Deployment") && strings.Contains(nameOf(o), "node-feature-discovery") {
				t.Errorf("%s %s rendered, but the site runs NFD separately", o["kind"], nameOf(o))
			}
		}
	}},
	{keys: []string{"sandboxWorkloads.enabled"}, check: func(t *testing.T, site map[string]any, objs rendered, _ string) {
		// the vm-passthrough nodes' VFIO manager runs this chart's image, never the 24.x/25.x default CUDA one
		for _, d := range objs.daemonSets(t, operandDaemonSets["vfioManager"]) {
			if !slices.ContainsFunc(containerImages(d), func(i string) bool { return strings.Contains(i, "/k8s-driver-manager:") }) ||
				slices.ContainsFunc(containerImages(d), func(i string) bool { return strings.Contains(i, "/cuda:") }) {
				t.Errorf("%s runs %v, not this chart's vfio-manager (k8s-driver-manager) image", d.Name, containerImages(d))
			}
		}
		objs.daemonSets(t, "nvidia-sandbox-device-plugin-daemonset")
	}},
}...)

// subset reports whether every pair of want is in got.
func subset(want, got map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

func sameResources(got, want corev1.ResourceRequirements) bool {
	same := func(a, b corev1.ResourceList) bool {
		if len(a) != len(b) {
			return false
		}
		for k, q := range b {
			if g, ok := a[k]; !ok || g.Cmp(q) != 0 {
				return false
			}
		}
		return true
	}
	return same(got.Requests, want.Requests) && same(got.Limits, want.Limits)
}

// driverPools are the driver pools the chart hands its driver manager (DRIVER_POOLS, JSON).
func driverPools(t *testing.T, objs rendered) []map[string]any {
	t.Helper()
	var walk func(any) string
	walk = func(v any) string {
		switch x := v.(type) {
		case map[string]any:
			if x["name"] == "DRIVER_POOLS" {
				s, _ := x["value"].(string)
				return s
			}
			for _, y := range x {
				if s := walk(y); s != "" {
					return s
				}
			}
		case []any:
			for _, y := range x {
				if s := walk(y); s != "" {
					return s
				}
			}
		}
		return ""
	}
	for _, o := range objs {
		if s := walk(o); s != "" {
			var pools []map[string]any
			if err := json.Unmarshal([]byte(s), &pools); err != nil {
				t.Fatal(err)
			}
			return pools
		}
	}
	t.Fatal("no DRIVER_POOLS rendered")
	return nil
}

// TestCorpusReachesTheRenderedObjects migrates each release's full copy with the site's changes, renders the chart
// with the values written, and checks every change on the rendered objects.
func TestCorpusReachesTheRenderedObjects(t *testing.T) {
	for _, tag := range KnownVersions() {
		t.Run(tag, func(t *testing.T) {
			t.Parallel()
			site := siteChanges(t, tag)
			for _, k := range leaves("", site) {
				if !slices.ContainsFunc(corpusChecks, func(c corpusCheck) bool {
					return slices.ContainsFunc(c.keys, func(key string) bool { return k == key || strings.HasPrefix(k, key+".") })
				}) {
					t.Errorf("the corpus changes %s, which no check looks for", k)
				}
			}
			r, values, _ := migrateValues(t, corpusCopy(t, tag), "")
			if r.Source.Version != tag {
				t.Fatalf("the corpus copy of %s is read as %q: %s", tag, r.Source.Version, r.Source.How)
			}
			objs := renderValuesFile(t, values)
			for _, c := range corpusChecks {
				if !slices.ContainsFunc(c.keys, func(k string) bool { _, set := getPath(site, k); return set }) {
					continue
				}
				t.Run(strings.Join(c.keys, ","), func(t *testing.T) { c.check(t, site, objs, tag) })
			}
			t.Run("no default image tag of "+tag, func(t *testing.T) { noReleaseDefaultTags(t, site, objs, tag) })
		})
	}
}

// noReleaseDefaultTags: an image version the site left at the release's default is not rendered, unless it is
// also v26.7.0's (this chart's own tags follow it).
func noReleaseDefaultTags(t *testing.T, site map[string]any, objs rendered, tag string) {
	images := objs.images()
	current := imageVersionPaths("", releaseDefaults()[OperatorTag])
	for p, v := range imageVersionPaths("", releaseDefaults()[tag]) {
		if _, set := getPath(site, p); set || current[p] == v {
			continue
		}
		for _, img := range images {
			if strings.HasSuffix(img, ":"+v) {
				t.Errorf("%s runs %s, the %s default of %s", img, v, tag, p)
			}
		}
	}
	for _, img := range images {
		if strings.Contains(img, "nvcr.io/nvidia/cuda:") {
			t.Errorf("a CUDA base image is rendered: %s", img)
		}
	}
}
