package chart

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// projectImageRepo is the repository of the project's image (global.stackImage); a registry override keeps it.
const projectImageRepo = "kube-gpu-stack/kube-gpu-stack"

// runAsUser is the container's user as the kubelet resolves it: the container's runAsUser, else the pod's, else
// the image's (nil: the project's image says USER 65532).
func runAsUser(pod, c map[string]any) any {
	for _, sc := range []any{c["securityContext"], pod["securityContext"]} {
		if m, ok := sc.(map[string]any); ok {
			if u, ok := m["runAsUser"]; ok {
				return u
			}
		}
	}
	return nil
}

// needsPrivileges: privileged, or capabilities added.
func needsPrivileges(c map[string]any) bool {
	sc, _ := c["securityContext"].(map[string]any)
	if p, _ := sc["privileged"].(bool); p {
		return true
	}
	caps, _ := sc["capabilities"].(map[string]any)
	add, _ := caps["add"].([]any)
	return len(add) > 0
}

// TestProjectImagePrivilegesRunAsRoot: a non-root process has no effective capabilities even in a privileged
// container (CapEff 0), so every container of the project's image (USER 65532) that is privileged or adds
// capabilities must run as root; every other one runs as the image's non-root user, but those that write root-owned
// host files, which run as root with no capability (rootForHostFiles).
func TestProjectImagePrivilegesRunAsRoot(t *testing.T) {
	t.Parallel()
	seen := map[string]int{}
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					img, _ := c["image"].(string)
					if !strings.Contains(img, "/"+projectImageRepo) {
						continue
					}
					name := fmt.Sprintf("%s: %s container %s", p.name, where, c["name"])
					user := runAsUser(ps, c)
					if needsPrivileges(c) {
						seen["privileged"]++
						if fmt.Sprint(user) != "0" {
							t.Errorf("%s is privileged or adds capabilities but runs as user %v: it gets no capabilities; set runAsUser: 0", name, orImage(user))
						}
						continue
					}
					seen["unprivileged"]++
					if _, owner := rootForHostFiles[fmt.Sprint(c["name"])]; owner {
						if fmt.Sprint(user) != "0" {
							t.Errorf("%s writes root-owned host files but runs as user %v; set runAsUser: 0", name, orImage(user))
						}
						continue
					}
					if fmt.Sprint(user) == "0" {
						t.Errorf("%s needs no privileges but runs as root; keep the image's user 65532", name)
					}
				}
			}
		}
	}
	if seen["privileged"] == 0 || seen["unprivileged"] == 0 {
		t.Fatalf("found %d privileged and %d unprivileged containers of the project's image: is the image matched?", seen["privileged"], seen["unprivileged"])
	}
}

// rootForHostFiles are the project image's containers that run as root with no capability, for the host files they
// write, which root owns (the owner's rights need none), and why.
var rootForHostFiles = map[string]string{
	"runtime-config-keeper": "writes the runtime's root-owned main config back, and removes the toolkit's CDI spec",
}

func orImage(u any) any {
	if u == nil {
		return "65532 (the image's)"
	}
	return u
}

// TestDriverManagerTokenOnlyInOurContainers: a pod running the driver manager (driver, vGPU manager, VFIO manager)
// runs a third-party container beside it with the same ServiceAccount, whose rights (cordon, evict, pause) are the
// driver manager's. So the pod automounts no token; our own containers (the project's image) mount the pod's
// token, CA and namespace at the standard path from one projected volume, and no other container mounts it. The
// driver manager also names itself (POD_NAME) in the node's Lease.
func TestDriverManagerTokenOnlyInOurContainers(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				cs := containersOf(ps)
				runsManager := slices.ContainsFunc(cs, func(c map[string]any) bool {
					cmd, _ := c["command"].([]any)
					return len(cmd) > 0 && cmd[0] == "driver-manager"
				})
				if !runsManager {
					continue
				}
				checked++
				name := p.name + ": " + where
				if auto, ok := ps["automountServiceAccountToken"].(bool); !ok || auto {
					t.Errorf("%s runs the driver manager beside third-party containers but automounts its token", name)
				}
				volumes, _ := ps["volumes"].([]any)
				var token map[string]any
				for _, v := range volumes {
					if m, _ := v.(map[string]any); m["name"] == "kube-api-access" {
						token = m
					}
				}
				if !projectsToken(token) {
					t.Errorf("%s: volume kube-api-access %v is not the projected token, CA and namespace", name, token)
				}
				for _, c := range cs {
					img, _ := c["image"].(string)
					ours := strings.Contains(img, "/"+projectImageRepo)
					mounts := mountsAt(c, "kube-api-access", "/var/run/secrets/kubernetes.io/serviceaccount")
					switch {
					case ours && !mounts:
						t.Errorf("%s: our container %s does not mount the pod's token at the standard path", name, c["name"])
					case !ours && mountsVolume(c, "kube-api-access"):
						t.Errorf("%s: third-party container %s (%s) mounts the driver manager's token", name, c["name"], img)
					}
					cmd, _ := c["command"].([]any)
					if len(cmd) > 1 && cmd[0] == "driver-manager" && cmd[1] == "uninstall-driver" && !hasEnvFrom(c, "POD_NAME", "metadata.name") {
						t.Errorf("%s: container %s holds the node's Lease but has no POD_NAME from metadata.name to name itself", name, c["name"])
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no pod running the driver manager found")
	}
}

func projectsToken(v map[string]any) bool {
	proj, _ := v["projected"].(map[string]any)
	sources, _ := proj["sources"].([]any)
	var token, ca, ns bool
	for _, s := range sources {
		m, _ := s.(map[string]any)
		if sat, ok := m["serviceAccountToken"].(map[string]any); ok && sat["path"] == "token" && sat["audience"] == nil {
			token = true
		}
		if cm, ok := m["configMap"].(map[string]any); ok && cm["name"] == "kube-root-ca.crt" {
			ca = true
		}
		if d, ok := m["downwardAPI"].(map[string]any); ok && strings.Contains(fmt.Sprint(d), "metadata.namespace") {
			ns = true
		}
	}
	return token && ca && ns
}

func mountsVolume(c map[string]any, volume string) bool {
	ms, _ := c["volumeMounts"].([]any)
	return slices.ContainsFunc(ms, func(m any) bool { mm, _ := m.(map[string]any); return mm["name"] == volume })
}

func mountsAt(c map[string]any, volume, path string) bool {
	ms, _ := c["volumeMounts"].([]any)
	return slices.ContainsFunc(ms, func(m any) bool {
		mm, _ := m.(map[string]any)
		return mm["name"] == volume && mm["mountPath"] == path && mm["readOnly"] == true
	})
}

func hasEnvFrom(c map[string]any, name, fieldPath string) bool {
	env, _ := c["env"].([]any)
	return slices.ContainsFunc(env, func(e any) bool {
		m, _ := e.(map[string]any)
		return m["name"] == name && strings.Contains(fmt.Sprint(m["valueFrom"]), fieldPath)
	})
}

// TestUnprivilegedContainersRunUnderSeccomp: every container that is not privileged runs under a seccomp profile
// (RuntimeDefault unless its template sets another), from its own securityContext or its pod's. A privileged
// container runs unconfined whatever the pod says (the container runtimes skip seccomp for it), so the pod-wide
// default confines exactly the others. Before the default, 9 to 18 containers per profile ran unconfined.
func TestUnprivilegedContainersRunUnderSeccomp(t *testing.T) {
	t.Parallel()
	confined := 0
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				podSC, _ := ps["securityContext"].(map[string]any)
				for _, c := range containersOf(ps) {
					sc, _ := c["securityContext"].(map[string]any)
					if p, _ := sc["privileged"].(bool); p {
						continue
					}
					profile, _ := sc["seccompProfile"].(map[string]any)
					if profile == nil {
						profile, _ = podSC["seccompProfile"].(map[string]any)
					}
					switch typ, _ := profile["type"].(string); typ {
					case "RuntimeDefault", "Localhost":
						confined++
					default:
						t.Errorf("%s: %s container %s runs without a seccomp profile (%q)", p.name, where, c["name"], typ)
					}
				}
			}
		}
	}
	if confined == 0 {
		t.Fatal("no unprivileged container seen: the profiles render none?")
	}
}

// TestPodsWithoutAPIRightsGetNoToken: a pod whose ServiceAccount no role grants anything (an OpenShift SCC `use`
// grant is admission's, not an API right) makes no API call it could be allowed, so it mounts no token: one stolen
// from it would still name the account to the API server. Derived from each profile's render (its bindings and
// roles), so a new operand without rights is held to it too.
func TestPodsWithoutAPIRightsGetNoToken(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, p := range profiles(t) {
		objs := objects(t, render(t, newestKube, p.files, everythingOn...))
		apiRules := map[string]bool{} // Role or ClusterRole (kind/name) with a rule beyond SCC use
		for _, o := range objs {
			if o.kind() != "Role" && o.kind() != "ClusterRole" {
				continue
			}
			rules, _ := o.Raw["rules"].([]any)
			for _, r := range rules {
				resources, _ := r.(map[string]any)["resources"].([]any)
				if len(resources) != 1 || resources[0] != "securitycontextconstraints" {
					apiRules[o.kind()+"/"+o.name()] = true
				}
			}
		}
		hasRights := map[string]bool{}
		for _, o := range objs {
			if o.kind() != "RoleBinding" && o.kind() != "ClusterRoleBinding" {
				continue
			}
			ref, _ := o.Raw["roleRef"].(map[string]any)
			if !apiRules[fmt.Sprint(ref["kind"], "/", ref["name"])] {
				continue
			}
			subjects, _ := o.Raw["subjects"].([]any)
			for _, s := range subjects {
				if sm, _ := s.(map[string]any); sm["kind"] == "ServiceAccount" {
					hasRights[fmt.Sprint(sm["name"])] = true
				}
			}
		}
		for _, o := range objs {
			for where, ps := range podSpecs(o) {
				sa, _ := ps["serviceAccountName"].(string)
				if sa == "" || hasRights[sa] {
					continue
				}
				checked++
				if auto, ok := ps["automountServiceAccountToken"].(bool); !ok || auto {
					t.Errorf("%s: %s runs as %s, which no role grants anything, yet mounts its token: set automountServiceAccountToken: false", p.name, where, sa)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no pod without API rights seen: the test checks nothing")
	}
}

// TestProjectContainersHaveReadOnlyRootFilesystems: every container of the project's image, privileged or not,
// writes only to its mounts (host paths, emptyDirs), so its root filesystem is read-only: a compromised one cannot
// plant a binary in its own image layer for the next exec.
func TestProjectContainersHaveReadOnlyRootFilesystems(t *testing.T) {
	t.Parallel()
	seen := 0
	for _, p := range profiles(t) {
		for _, o := range objects(t, render(t, newestKube, p.files, everythingOn...)) {
			for where, ps := range podSpecs(o) {
				for _, c := range containersOf(ps) {
					if img, _ := c["image"].(string); !strings.Contains(img, "/"+projectImageRepo) {
						continue
					}
					seen++
					sc, _ := c["securityContext"].(map[string]any)
					if ro, _ := sc["readOnlyRootFilesystem"].(bool); !ro {
						t.Errorf("%s: %s container %s (the project's image) has a writable root filesystem", p.name, where, c["name"])
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no container of the project's image seen")
	}
}

// TestSecureMetricsRenderAGuardedExporterAndAScraperThatCanPass: with nodeStatusExporter.secureMetrics the
// exporter is told to guard /metrics, its probe goes to the open /healthz over HTTPS, its account may ask the API
// server about tokens and access, the chart offers a ClusterRole that lets a scraper GET /metrics, and the
// ServiceMonitor scrapes with HTTPS and Prometheus' token. (tests/admission runs the exporter behind these roles.)
func TestSecureMetricsRenderAGuardedExporterAndAScraperThatCanPass(t *testing.T) {
	t.Parallel()
	stream := render(t, newestKube, []string{profileFile("monitoring")}, "nodeStatusExporter.secureMetrics=true")
	exporter := containerNamed(t, daemonSet(t, stream, "nvidia-node-status-exporter"), "nvidia-node-status-exporter")
	env := map[string]string{}
	for _, e := range exporter.Env {
		env[e.Name] = e.Value
	}
	if env["METRICS_SECURE"] != "true" {
		t.Errorf("METRICS_SECURE=%q, want true", env["METRICS_SECURE"])
	}
	if p := exporter.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != "HTTPS" {
		t.Errorf("readiness probe %+v, want HTTPS /healthz (it has no token for /metrics)", p)
	}
	rules := map[string]bool{}
	for _, o := range objects(t, stream) {
		if o.kind() != "ClusterRole" {
			continue
		}
		list, _ := o.Raw["rules"].([]any)
		for _, r := range list {
			rm := r.(map[string]any)
			rules[o.name()+" "+fmt.Sprint(rm["resources"], rm["nonResourceURLs"], rm["verbs"])] = true
		}
	}
	for _, want := range []string{
		"nvidia-node-status-exporter-gpu-operator [tokenreviews] <nil> [create]",
		"nvidia-node-status-exporter-gpu-operator [subjectaccessreviews] <nil> [create]",
		"nvidia-node-status-exporter-metrics-reader-gpu-operator <nil> [/metrics] [get]",
	} {
		if !rules[want] {
			t.Errorf("no ClusterRole rule %q among %v", want, slices.Sorted(maps.Keys(rules)))
		}
	}
	sm := ""
	for _, doc := range strings.Split(stream, "\n---") {
		if strings.Contains(doc, "kind: ServiceMonitor") && strings.Contains(doc, "name: nvidia-node-status-exporter\n") {
			sm = doc
		}
	}
	for _, want := range []string{"scheme: https", "insecureSkipVerify: true", "bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"} {
		if !strings.Contains(sm, want) {
			t.Errorf("the exporter's ServiceMonitor lacks %q:\n%s", want, sm)
		}
	}
}
