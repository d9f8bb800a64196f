package chart

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/nodefixtures"
)

// OpenShift admits a pod only under a SecurityContextConstraints (SCC) that its ServiceAccount (or the creating
// user) may `use` (RBAC verb use on security.openshift.io securitycontextconstraints) and whose rules the pod meets.
// Every authenticated account may use restricted-v2 and nothing else by default. The default SCCs' rules, as
// OpenShift 4.11+ documents them (Authentication and authorization > Managing security context constraints):
//
//	restricted-v2  no privileged containers, no host namespaces (hostPID, hostIPC, hostNetwork), no hostPort, no
//	               hostPath volumes, capabilities: drop ALL, add at most NET_BIND_SERVICE, no privilege escalation,
//	               runAsUser MustRunAsRange (a fixed UID outside the namespace's range is refused), fsGroup
//	               MustRunAs (the namespace's range), seccomp runtime/default.
//	nonroot-v2     as restricted-v2, but runAsUser MustRunAsNonRoot (any non-zero UID) and fsGroup RunAsAny.
//	hostmount-anyuid, hostaccess, hostnetwork-v2, anyuid: single host features; privileged: everything.
//
// The chart grants `privileged` to every account whose pods need any host access or a privileged container (as the
// GPU Operator does), `nonroot-v2` to the accounts of pods that only pin a non-root UID, and nothing to the rest.

// The openshift profile's driver serves RHCOS only: the other fixture nodes get every container operand but the
// driver, the RHCOS nodes all of them.
func init() {
	m := sandboxOff(containerHostDriver)
	m["rhcos416"] = containerRole
	m["rhcos417-mig-capable"] = containerRole + " mig-manager"
	m["rhcos418"] = containerRole
	roleMatrix["openshift"] = m
	extraNodes["openshift"] = nodefixtures.OpenShift()
}

// sccNeeded names the default SCC a pod spec needs, with the reason; "" is restricted-v2 (no grant needed).
func sccNeeded(ps map[string]any) (scc, why string) {
	for _, k := range []string{"hostPID", "hostIPC", "hostNetwork"} {
		if ps[k] == true {
			return "privileged", k
		}
	}
	vols, _ := ps["volumes"].([]any)
	for _, v := range vols {
		if m, _ := v.(map[string]any); m["hostPath"] != nil {
			return "privileged", fmt.Sprintf("hostPath volume %v", m["name"])
		}
	}
	psc, _ := ps["securityContext"].(map[string]any)
	pinned := ""
	if u, ok := psc["runAsUser"]; ok {
		pinned = fmt.Sprintf("pod runAsUser %v", u)
		if fmt.Sprint(u) == "0" {
			return "privileged", "runs as root (pod runAsUser 0)"
		}
	}
	if _, ok := psc["fsGroup"]; ok && pinned == "" {
		pinned = "pod fsGroup"
	}
	for _, c := range containersOf(ps) {
		sc, _ := c["securityContext"].(map[string]any)
		if sc["privileged"] == true {
			return "privileged", fmt.Sprintf("container %v privileged", c["name"])
		}
		if sc["allowPrivilegeEscalation"] == true {
			return "privileged", fmt.Sprintf("container %v allowPrivilegeEscalation", c["name"])
		}
		caps, _ := sc["capabilities"].(map[string]any)
		add, _ := caps["add"].([]any)
		for _, a := range add {
			if a != "NET_BIND_SERVICE" {
				return "privileged", fmt.Sprintf("container %v adds %v", c["name"], a)
			}
		}
		ports, _ := c["ports"].([]any)
		for _, p := range ports {
			if m, _ := p.(map[string]any); m["hostPort"] != nil {
				return "privileged", fmt.Sprintf("container %v hostPort", c["name"])
			}
		}
		if u, ok := sc["runAsUser"]; ok {
			if fmt.Sprint(u) == "0" {
				return "privileged", fmt.Sprintf("container %v runs as root", c["name"])
			}
			if pinned == "" {
				pinned = fmt.Sprintf("container %v runAsUser %v", c["name"], u)
			}
		}
	}
	if pinned != "" {
		return "nonroot-v2", pinned
	}
	return "", "restricted-v2 admits it"
}

// sccGrants: for each ServiceAccount (namespace-less name), the SCCs it may use through the rendered Roles and
// ClusterRoles bound to it.
func sccGrants(t *testing.T, objs []object) map[string][]string {
	t.Helper()
	roleSCCs := map[string][]string{} // kind/name -> SCCs
	for _, o := range objs {
		if k := o.kind(); k != "Role" && k != "ClusterRole" {
			continue
		}
		rules, _ := o.Raw["rules"].([]any)
		for _, r := range rules {
			m, _ := r.(map[string]any)
			if !listHas(m["apiGroups"], "security.openshift.io") || !listHas(m["resources"], "securitycontextconstraints") {
				continue
			}
			if !listHas(m["verbs"], "use") {
				t.Errorf("%s %s: an SCC rule without verb use: %v", o.kind(), o.name(), m)
				continue
			}
			names, _ := m["resourceNames"].([]any)
			if len(names) == 0 {
				t.Errorf("%s %s: an SCC use rule without resourceNames grants every SCC: %v", o.kind(), o.name(), m)
			}
			for _, n := range names {
				roleSCCs[o.kind()+"/"+o.name()] = append(roleSCCs[o.kind()+"/"+o.name()], fmt.Sprint(n))
			}
		}
	}
	out := map[string][]string{}
	for _, o := range objs {
		if k := o.kind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
			continue
		}
		ref, _ := o.Raw["roleRef"].(map[string]any)
		sccs := roleSCCs[fmt.Sprintf("%v/%v", ref["kind"], ref["name"])]
		subjects, _ := o.Raw["subjects"].([]any)
		for _, s := range subjects {
			m, _ := s.(map[string]any)
			if m["kind"] == "ServiceAccount" {
				sa := fmt.Sprint(m["name"])
				for _, scc := range sccs {
					if !slices.Contains(out[sa], scc) {
						out[sa] = append(out[sa], scc)
					}
				}
			}
		}
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

func listHas(l any, s string) bool {
	items, _ := l.([]any)
	return slices.Contains(items, any(s))
}

// TestOpenShiftSCCGrants: on OpenShift every rendered pod's ServiceAccount may use exactly the SCC the pod needs
// under the SCC admission rules above: privileged for privileged or host-access pods, nonroot-v2 for pods that only
// pin a non-root UID, nothing for pods restricted-v2 admits. Every profile is rendered with
// global.platform=openshift and the optional operands on, so every operand and hook pod is checked.
func TestOpenShiftSCCGrants(t *testing.T) {
	t.Parallel()
	checked := map[string]bool{}
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, append(slices.Clone(everythingOn), "global.platform=openshift")...))
		grants := sccGrants(t, objs)
		needs := map[string]string{} // ServiceAccount -> the SCC its pods need (the strongest)
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				sa, _ := ps["serviceAccountName"].(string)
				if sa == "" {
					t.Errorf("%s: %s has no serviceAccountName (it would run as default, which may use no SCC of ours)", p.name, where)
					continue
				}
				scc, why := sccNeeded(ps)
				if scc == "" {
					if g := grants[sa]; len(g) > 0 {
						t.Errorf("%s: %s needs no SCC grant (%s) but ServiceAccount %s may use %v", p.name, where, why, sa, g)
					}
					continue
				}
				checked[scc] = true
				if !slices.Contains(grants[sa], scc) {
					t.Errorf("%s: %s needs SCC %s (%s) but ServiceAccount %s may use %v", p.name, where, scc, why, sa, grants[sa])
				}
				if needs[sa] != "privileged" {
					needs[sa] = scc
				}
			}
		}
		// no account gets more than its pods need: a privileged grant on an account whose pods need only
		// nonroot-v2 is a privilege escalation path for anyone who can create pods under it
		for sa, g := range grants {
			if want, ok := needs[sa]; ok && (len(g) != 1 || g[0] != want) {
				t.Errorf("%s: ServiceAccount %s may use %v, its pods need %s only", p.name, sa, g, want)
			}
		}
		// the validator's CUDA workload pod (hooks/node/validation/workload.go) is created at run time, privileged,
		// under the workload account: that account must use privileged where the CUDA check runs
		if slices.ContainsFunc(objs, func(o object) bool { return o.kind() == "DaemonSet" && o.name() == "nvidia-operator-validator" }) {
			if !slices.Contains(grants["nvidia-validator-workload"], "privileged") {
				t.Errorf("%s: the validator's privileged CUDA workload account nvidia-validator-workload may use %v, not privileged",
					p.name, grants["nvidia-validator-workload"])
			}
		}
	}
	for _, scc := range []string{"privileged", "nonroot-v2"} {
		if !checked[scc] {
			t.Errorf("no pod needing SCC %s was found: is the classification right?", scc)
		}
	}
}

// TestSCCRulesOnlyOnOpenShift: off OpenShift the API group does not exist; no Role names it.
func TestSCCRulesOnlyOnOpenShift(t *testing.T) {
	t.Parallel()
	for _, p := range profiles(t) {
		if strings.HasPrefix(p.name, "openshift") {
			continue
		}
		objs := objects(t, render(t, newestKube, p.files, everythingOn...))
		if g := sccGrants(t, objs); len(g) > 0 {
			t.Errorf("%s: SCC grants off OpenShift: %v", p.name, g)
		}
	}
}

// openshiftDTK: OpenShift 4.17 and 4.18 nodes built through the Driver Toolkit, behind a proxy, trusting the
// cluster's CA bundle; the 4.17 build's DTK image given by reference.
const openshiftDTK = `
global:
  platform: openshift
  proxy:
    httpProxy: http://proxy.example.com:3128
    httpsProxy: http://proxy.example.com:3129
    noProxy: .cluster.local,.svc,10.0.0.0/16
    trustedCA:
      enabled: true
driver:
  os: [rhel9, rhcos4.17, rhcos4.18]
  driverToolkit:
    enabled: true
    rhcosVersions: ["417.94.202501071621-0", "418.94.202502251302-0"]
    images:
      "417.94.202501071621-0": quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:1111111111111111111111111111111111111111111111111111111111111111
`

func daemonSetsByName(objs []object) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		if o.kind() == "DaemonSet" {
			for _, ps := range podSpecs(o) {
				out[o.name()] = ps
			}
		}
	}
	return out
}

func containerIn(ps map[string]any, name string) map[string]any {
	for _, c := range containersOf(ps) {
		if c["name"] == name {
			return c
		}
	}
	return nil
}

func envOf(c map[string]any) map[string]string {
	out := map[string]string{}
	env, _ := c["env"].([]any)
	for _, e := range env {
		m, _ := e.(map[string]any)
		if v, ok := m["value"].(string); ok {
			out[fmt.Sprint(m["name"])] = v
		}
	}
	return out
}

func mountAt(c map[string]any, path string) map[string]any {
	mounts, _ := c["volumeMounts"].([]any)
	for _, m := range mounts {
		if mm, _ := m.(map[string]any); mm["mountPath"] == path {
			return mm
		}
	}
	return nil
}

func requiresLabel(ps map[string]any, key, value string) bool {
	aff, _ := ps["affinity"].(map[string]any)
	na, _ := aff["nodeAffinity"].(map[string]any)
	req, _ := na["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)
	terms, _ := req["nodeSelectorTerms"].([]any)
	if len(terms) == 0 {
		return false
	}
	for _, term := range terms { // every term must require it
		exprs, _ := term.(map[string]any)["matchExpressions"].([]any)
		if !slices.ContainsFunc(exprs, func(e any) bool {
			m, _ := e.(map[string]any)
			vals, _ := m["values"].([]any)
			return m["key"] == key && m["operator"] == "In" && len(vals) == 1 && vals[0] == value
		}) {
			return false
		}
	}
	return true
}

// TestOpenShiftDriverToolkit: on RHCOS with the Driver Toolkit, one driver DaemonSet per RHCOS build, on the nodes
// of that build (NFD's OSTREE_VERSION), the driver container started through ocp_dtk_entrypoint and sharing an
// emptyDir with the DTK side container of that build's image; the proxy and the cluster trust bundle reach the
// driver container; other OS tags are untouched; every container keeps its image's contract.
func TestOpenShiftDriverToolkit(t *testing.T) {
	t.Parallel()
	values := writeTemp(t, "dtk.yaml", openshiftDTK)
	stream := render(t, newestKube, []string{values})
	objs := objects(t, stream)
	ds := daemonSetsByName(objs)
	builds := map[string]struct{ build, version, dtkImage string }{
		"nvidia-driver-daemonset-rhcos417-417-94-202501071621-0": {"417.94.202501071621-0", "4.17", "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:1111111111111111111111111111111111111111111111111111111111111111"},
		"nvidia-driver-daemonset-rhcos418-418-94-202502251302-0": {"418.94.202502251302-0", "4.18", "image-registry.openshift-image-registry.svc:5000/openshift/driver-toolkit:418.94.202502251302-0"},
	}
	var drivers []string
	for name := range ds {
		if strings.HasPrefix(name, "nvidia-driver-daemonset-") {
			drivers = append(drivers, name)
		}
	}
	sort.Strings(drivers)
	if want := []string{"nvidia-driver-daemonset-rhcos417-417-94-202501071621-0", "nvidia-driver-daemonset-rhcos418-418-94-202502251302-0", "nvidia-driver-daemonset-rhel9"}; !slices.Equal(drivers, want) {
		t.Fatalf("driver DaemonSets %v, want %v", drivers, want)
	}
	for name, b := range builds {
		ps := ds[name]
		if !requiresLabel(ps, "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION", b.build) ||
			!requiresLabel(ps, "feature.node.kubernetes.io/system-os_release.ID", "rhcos") ||
			!requiresLabel(ps, "feature.node.kubernetes.io/system-os_release.VERSION_ID", b.version) {
			t.Errorf("%s: not confined to rhcos %s build %s nodes: %v", name, b.version, b.build, ps["affinity"])
		}
		driver := containerIn(ps, "nvidia-driver-ctr")
		if got := fmt.Sprint(driver["command"], driver["args"]); got != "[ocp_dtk_entrypoint] [nv-ctr-run-with-dtk]" {
			t.Errorf("%s: driver container runs %s, want ocp_dtk_entrypoint nv-ctr-run-with-dtk", name, got)
		}
		if img := fmt.Sprint(driver["image"]); !strings.HasSuffix(img, "-rhcos"+b.version) {
			t.Errorf("%s: driver image %s is not the rhcos%s image", name, img, b.version)
		}
		dtk := containerIn(ps, "openshift-driver-toolkit-ctr")
		if dtk == nil {
			t.Fatalf("%s: no openshift-driver-toolkit-ctr", name)
		}
		if dtk["image"] != b.dtkImage {
			t.Errorf("%s: DTK image %v, want %s", name, dtk["image"], b.dtkImage)
		}
		for _, c := range []map[string]any{driver, dtk} {
			if envOf(c)["RHCOS_VERSION"] != b.build {
				t.Errorf("%s: %v RHCOS_VERSION=%q, want %s", name, c["name"], envOf(c)["RHCOS_VERSION"], b.build)
			}
			m := mountAt(c, "/mnt/shared-nvidia-driver-toolkit")
			if m == nil {
				t.Errorf("%s: %v does not mount the shared DTK directory", name, c["name"])
				continue
			}
			vols, _ := ps["volumes"].([]any)
			if !slices.ContainsFunc(vols, func(v any) bool {
				vm, _ := v.(map[string]any)
				return vm["name"] == m["name"] && vm["emptyDir"] != nil
			}) {
				t.Errorf("%s: the shared DTK directory %v is not an emptyDir of the pod", name, m["name"])
			}
		}
		if sc, _ := dtk["securityContext"].(map[string]any); sc["privileged"] != true {
			t.Errorf("%s: the DTK container is not privileged (it builds and installs kernel modules)", name)
		}
	}
	// the proxy and trust bundle: every driver container, DTK or not
	for _, name := range drivers {
		driver := containerIn(ds[name], "nvidia-driver-ctr")
		env := envOf(driver)
		for k, want := range map[string]string{"HTTP_PROXY": "http://proxy.example.com:3128", "https_proxy": "http://proxy.example.com:3129", "NO_PROXY": ".cluster.local,.svc,10.0.0.0/16", "no_proxy": ".cluster.local,.svc,10.0.0.0/16"} {
			if env[k] != want {
				t.Errorf("%s: driver container %s=%q, want %q", name, k, env[k], want)
			}
		}
		m := mountAt(driver, "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem")
		if m == nil || m["subPath"] != "tls-ca-bundle.pem" || m["readOnly"] != true {
			t.Errorf("%s: the cluster trust bundle is not mounted read-only as the image's tls-ca-bundle.pem: %v", name, m)
		}
		if gate := containerIn(ds[name], "driver-upgrade-gate"); gate != nil && envOf(gate)["HTTPS_PROXY"] != "" {
			t.Errorf("%s: the API client sidecar got the proxy", name)
		}
	}
	if strings.Contains(fmt.Sprint(ds["nvidia-driver-daemonset-rhel9"]), "driver-toolkit") {
		t.Error("the rhel9 DaemonSet got Driver Toolkit parts")
	}
	cm := slices.IndexFunc(objs, func(o object) bool { return o.kind() == "ConfigMap" && o.name() == "gpu-stack-trusted-ca" })
	if cm < 0 {
		t.Fatal("no trusted CA ConfigMap gpu-stack-trusted-ca")
	}
	meta, _ := objs[cm].Raw["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	if labels["config.openshift.io/inject-trusted-cabundle"] != "true" || objs[cm].Raw["data"] != nil {
		t.Errorf("trusted CA ConfigMap is not an empty ConfigMap labelled for injection: %v", objs[cm].Raw)
	}
	found, n := contractViolations(t, stream)
	for _, v := range found {
		if strings.Contains(v, "ocp-v4.0-art-dev@sha256") && strings.HasSuffix(v, "no row in the contract table") {
			continue // the 4.17 build's DTK image given by reference: a user-supplied image
		}
		if strings.Contains(v, "driver-toolkit") || strings.Contains(v, "nvidia-driver-ctr") || strings.Contains(v, "rhcos") {
			t.Errorf("contract: %s", v)
		}
	}
	if n == 0 {
		t.Error("no container was checked against the contract table")
	}
}

// driverDigests: DRIVER_CONFIG_DIGEST of each driver DaemonSet.
func driverDigests(t *testing.T, files []string, set ...string) map[string]string {
	out := map[string]string{}
	for name, ps := range daemonSetsByName(objects(t, render(t, newestKube, files, set...))) {
		if c := containerIn(ps, "nvidia-driver-ctr"); c != nil {
			out[name] = envOf(c)["DRIVER_CONFIG_DIGEST"]
		}
	}
	return out
}

// TestOpenShiftDigests: the DTK image is part of the driver config digest of the DTK DaemonSets only (a new DTK
// image is a new kernel build), and the proxy is part of none (a proxy change keeps the loaded driver).
func TestOpenShiftDigests(t *testing.T) {
	t.Parallel()
	values := writeTemp(t, "dtk.yaml", openshiftDTK)
	base := driverDigests(t, []string{values})
	other := driverDigests(t, []string{values}, "driver.driverToolkit.images.418\\.94\\.202502251302-0=quay.io/x/dtk@sha256:2222222222222222222222222222222222222222222222222222222222222222",
		"global.proxy.httpsProxy=http://other:3128")
	for name, d := range base {
		changed := other[name] != d
		if want := name == "nvidia-driver-daemonset-rhcos418-418-94-202502251302-0"; changed != want {
			t.Errorf("%s: digest changed=%v with a new 4.18 DTK image and proxy, want %v", name, changed, want)
		}
	}
	plain := driverDigests(t, []string{values}, "driver.driverToolkit.enabled=false")
	if plain["nvidia-driver-daemonset-rhel9"] != base["nvidia-driver-daemonset-rhel9"] {
		t.Error("turning the Driver Toolkit on changed the rhel9 DaemonSet's digest")
	}
}

// TestOpenShiftValuesRefused: Driver Toolkit settings that would leave nodes without a driver, and a trust bundle
// nothing injects, fail at render naming the key.
func TestOpenShiftValuesRefused(t *testing.T) {
	t.Parallel()
	values := writeTemp(t, "dtk.yaml", openshiftDTK)
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"driver.driverToolkit.rhcosVersions={417.94.202501071621-0}"}, "rhcos4.18 with driver.driverToolkit.enabled needs the RHCOS builds"},
		{[]string{"driver.driverToolkit.rhcosVersions={417.94.202501071621-0,418.94.202502251302-0,419.96.202510011200-0}"}, "RHCOS build 419.96.202510011200-0 belongs to no rhcos OS tag"},
		{[]string{"driver.usePrecompiled=true", "driver.kernels={5.14.0-427.el9.x86_64}"}, "driver.driverToolkit.enabled=true with driver.usePrecompiled=true"},
		{[]string{"global.platform=generic"}, "global.proxy.trustedCA.enabled: the trust bundle is injected by OpenShift only"},
	} {
		_, err := renderErr(t, newestKube, []string{values}, c.set...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.set, err, c.want)
		}
	}
}

// TestOpenShiftProfileBuildsWithTheDriverToolkit: on OpenShift the profile builds the driver with the cluster's
// Driver Toolkit, as the GPU Operator does, not against Red Hat's package repositories (which needs an entitlement
// most clusters lack), and leaves NFD to Red Hat's NFD Operator, which owns its CRDs there. A render without the
// site's RHCOS builds fails naming the key to list them in; with the example builds, each RHCOS node has a DTK
// DaemonSet and the chart ships only its NodeFeatureRule of NFD.
func TestOpenShiftProfileBuildsWithTheDriverToolkit(t *testing.T) {
	t.Parallel()
	var p profile
	for _, q := range profiles(t) {
		if q.name == "openshift" {
			p = q
		}
	}
	if len(p.files) != 2 {
		t.Fatalf("the openshift profile's files %v: want the profile and its site example (its RHCOS builds)", p.files)
	}
	_, err := renderErr(t, newestKube, []string{p.file})
	if err == nil || !strings.Contains(err.Error(), "driver.driverToolkit.rhcosVersions") {
		t.Errorf("the profile without its RHCOS builds: error %v, want one naming driver.driverToolkit.rhcosVersions", err)
	}
	objs := objects(t, render(t, newestKube, p.files))
	var drivers, nfd []string
	rules := 0
	for _, o := range objs {
		switch {
		case o.kind() == "DaemonSet" && strings.HasPrefix(o.name(), "nvidia-driver-daemonset-"):
			drivers = append(drivers, o.name())
		case o.kind() == "NodeFeatureRule":
			rules++
		case strings.Contains(o.name(), "nfd") || strings.Contains(o.name(), "node-feature-discovery"):
			nfd = append(nfd, o.kind()+"/"+o.name())
		}
	}
	sort.Strings(drivers)
	want := []string{
		"nvidia-driver-daemonset-rhcos416-416-94-202501270445-0",
		"nvidia-driver-daemonset-rhcos417-417-94-202501071621-0",
		"nvidia-driver-daemonset-rhcos418-418-94-202502251302-0",
	}
	if !slices.Equal(drivers, want) {
		t.Errorf("driver DaemonSets %v, want one Driver Toolkit build per RHCOS build: %v", drivers, want)
	}
	if rules == 0 || len(nfd) > 0 {
		t.Errorf("NFD: %d NodeFeatureRules and %v; want the chart's NodeFeatureRule only (external NFD)", rules, nfd)
	}
}
