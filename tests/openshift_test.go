package tests

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
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
	checked := map[string]bool{}
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, []string{p.file}, append(slices.Clone(everythingOn), "global.platform=openshift")...))
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
		// the validator's CUDA workload pod (hooks/validation/workload.go) is created at run time, privileged,
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
	for _, p := range profiles(t) {
		if strings.HasPrefix(p.name, "openshift") {
			continue
		}
		objs := objects(t, render(t, newestKube, []string{p.file}, everythingOn...))
		if g := sccGrants(t, objs); len(g) > 0 {
			t.Errorf("%s: SCC grants off OpenShift: %v", p.name, g)
		}
	}
}
