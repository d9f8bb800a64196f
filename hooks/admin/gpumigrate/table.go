package gpumigrate

import "strings"

// Action is what became of one input key.
type Action string

const (
	// Mapped: the key's value is written to a key of this chart.
	Mapped Action = "mapped"
	// Dropped: this chart has the behaviour by design, or the key configures something it does not run.
	Dropped Action = "dropped"
	// Decision: the key has no automatic equivalent; someone must choose.
	Decision Action = "needs-decision"
	// Unknown: the key is not in the table at all.
	Unknown Action = "unknown"
)

// convertFunc writes v (found at the input path `at`) into the output and returns where it went (or why not).
type convertFunc func(c *converter, at string, v any) Entry

// Rule maps one GPU Operator key (or subtree). From is a dotted path of the operator's values / ClusterPolicy spec;
// a `*` segment matches any operand key. To is this chart's key (a dotted path from the umbrella chart's root;
// `[]` marks a list element) for a plain copy of the value.
type Rule struct {
	From   string
	To     string
	Action Action
	Why    string
	// Same: for a Dropped key, the value this chart always behaves as; any other value needs a decision.
	Same any
	// conv replaces the plain copy to To.
	conv convertFunc
	// Targets are the chart keys conv writes, for the table's test and the schema hints.
	Targets []string
}

// operand is one GPU Operator operand key and this chart's key for it.
type operand struct {
	from, to string
	// ownImage: this chart runs its own binary there (global.stackImage), so the operator's image is not used.
	ownImage bool
	// args: the chart's operand takes `args`.
	args bool
	// repo, image: the operator's default repository and image name, for a file that sets only one of them.
	repo, image string
}

var operands = []operand{
	{from: "driver", to: "driver", repo: "nvcr.io/nvidia", image: "driver"},
	{from: "toolkit", to: "toolkit", repo: "nvcr.io/nvidia/k8s", image: "container-toolkit"},
	{from: "devicePlugin", to: "devicePlugin", args: true, repo: "nvcr.io/nvidia", image: "k8s-device-plugin"},
	{from: "dcgm", to: "dcgm", args: true, repo: "nvcr.io/nvidia/cloud-native", image: "dcgm"},
	{from: "dcgmExporter", to: "dcgmExporter", args: true, repo: "nvcr.io/nvidia/k8s", image: "dcgm-exporter"},
	{from: "gfd", to: "gfd", repo: "nvcr.io/nvidia", image: "k8s-device-plugin"},
	{from: "migManager", to: "migManager", repo: "nvcr.io/nvidia/cloud-native", image: "k8s-mig-manager"},
	{from: "nodeStatusExporter", to: "nodeStatusExporter", ownImage: true, repo: "nvcr.io/nvidia", image: "gpu-operator"},
	{from: "validator", to: "validator", ownImage: true, repo: "nvcr.io/nvidia", image: "gpu-operator"},
	{from: "vfioManager", to: "vfioManager", repo: "nvcr.io/nvidia/cloud-native", image: "k8s-driver-manager"},
	{from: "sandboxDevicePlugin", to: "sandboxDevicePlugin", args: true, repo: "nvcr.io/nvidia", image: "kubevirt-gpu-device-plugin"},
	{from: "kataSandboxDevicePlugin", to: "kataSandboxDevicePlugin", args: true, repo: "nvcr.io/nvidia/cloud-native", image: "nvidia-sandbox-device-plugin"},
	{from: "vgpuManager", to: "vgpuManager", repo: "", image: "vgpu-manager"},
	{from: "vgpuDeviceManager", to: "vgpuDeviceManager", repo: "nvcr.io/nvidia/cloud-native", image: "vgpu-device-manager"},
	{from: "ccManager", to: "ccManager", repo: "nvcr.io/nvidia/cloud-native", image: "k8s-cc-manager"},
	{from: "gds", to: "driver.gds", repo: "nvcr.io/nvidia/cloud-native", image: "nvidia-fs"},
	{from: "gdrcopy", to: "driver.gdrcopy", repo: "nvcr.io/nvidia/cloud-native", image: "gdrdrv"},
	{from: "draDriver", to: "draDriver", repo: "nvcr.io/nvidia", image: "dra-driver-nvidia-gpu"},
}

const ownImageWhy = "this chart runs its own binary there (global.stackImage), not the operator's image"

// operandRules are the keys every operator operand has.
func operandRules(op operand) []Rule {
	p := op.from + "."
	t := op.to + "."
	sub := strings.Contains(op.to, ".") // gds/gdrcopy live inside the driver chart: no enabled/pod keys of their own
	var rs []Rule
	if op.ownImage {
		for _, k := range []string{"repository", "image", "version"} {
			rs = append(rs, Rule{From: p + k, Action: Dropped, Why: ownImageWhy})
		}
		rs = append(rs, Rule{From: p + "imagePullPolicy", To: "global.stackImage.pullPolicy"})
	} else {
		rs = append(rs,
			Rule{From: p + "repository", conv: imagePart, Targets: []string{t + "image.registry", t + "image.repository"}},
			Rule{From: p + "image", conv: imagePart, Targets: []string{t + "image.registry", t + "image.repository"}},
			Rule{From: p + "version", conv: imagePart, Targets: []string{t + "image.tag"}},
		)
		if !sub {
			rs = append(rs, Rule{From: p + "imagePullPolicy", To: t + "image.pullPolicy"})
		} else {
			rs = append(rs, Rule{From: p + "imagePullPolicy", Action: Dropped, Same: "IfNotPresent", Why: "the driver chart's side containers pull IfNotPresent"})
		}
	}
	rs = append(rs, Rule{From: p + "enabled", To: t + "enabled"})
	if sub {
		rs = append(rs,
			Rule{From: p + "imagePullSecrets", To: "driver.imagePullSecrets"},
			Rule{From: p + "env", Action: Decision, Same: []any{}, Why: "the driver chart has no separate environment for this container; driver.extraEnv applies to all of the driver pod"},
			Rule{From: p + "args", Action: Decision, Same: []any{}, Why: "no place for extra arguments of this container"},
		)
		return rs
	}
	rs = append(rs,
		Rule{From: p + "imagePullSecrets", To: t + "imagePullSecrets"},
		Rule{From: p + "env", conv: envToMap(t + "extraEnv"), Targets: []string{t + "extraEnv"}},
		Rule{From: p + "resources", To: t + "resources"},
		Rule{From: p + "hostNetwork", Action: Dropped, Same: false, Why: "operand pods never use the host network here"},
		Rule{From: p + "nodeSelector", To: t + "nodeSelector"},
		Rule{From: p + "tolerations", To: t + "tolerations"},
		Rule{From: p + "priorityClassName", To: t + "priorityClassName"},
	)
	if op.args {
		rs = append(rs, Rule{From: p + "args", To: t + "args"})
	} else {
		rs = append(rs, Rule{From: p + "args", Action: Decision, Same: []any{}, Why: "this chart's " + op.to + " takes no extra arguments"})
	}
	return rs
}

// rules is the table. Keys not listed are reported as having no place in kube-gpu-stack.
var rules = buildRules()

func buildRules() []Rule {
	rs := []Rule{
		// Cluster-wide settings.
		{From: "platform.openshift", conv: openshiftPlatform, Targets: []string{"global.platform"}},
		{From: "psa.enabled", conv: psaLabels},
		{From: "psp.enabled", Action: Dropped, Same: false, Why: "PodSecurityPolicy was removed in Kubernetes 1.25"},
		{From: "cdi.enabled", To: "global.cdi.enabled"},
		{From: "cdi.nriPluginEnabled", To: "global.cdi.nriPluginEnabled"},
		{From: "cdi.default", Action: Dropped, Why: "deprecated by the operator; with global.cdi.enabled the runtime injects through CDI"},
		{From: "sandboxWorkloads.enabled", To: "global.sandboxWorkloads.enabled"},
		{From: "sandboxWorkloads.defaultWorkload", To: "global.sandboxWorkloads.defaultWorkload"},
		{From: "sandboxWorkloads.mode", To: "global.sandboxWorkloads.mode"},
		{From: "hostPaths.rootFS", To: "global.hostPaths.rootFS"},
		{From: "hostPaths.driverInstallDir", To: "global.hostPaths.driverInstallDir"},
		{From: "hostPaths.kubeletRootDir", To: "global.hostPaths.kubeletRootDir"},
		{From: "mig.strategy", To: "global.mig.strategy"},
		{From: "daemonsets.labels", To: "global.podLabels"},
		{From: "daemonsets.annotations", To: "global.podAnnotations"},
		{From: "daemonsets.priorityClassName", To: "global.priorityClassName"},
		{From: "daemonsets.tolerations", To: "global.tolerations"},
		{From: "daemonsets.updateStrategy", To: "global.updateStrategy.type"},
		{From: "daemonsets.rollingUpdate.maxUnavailable", conv: intOrPercent("global.updateStrategy.rollingUpdate.maxUnavailable"), Targets: []string{"global.updateStrategy.rollingUpdate.maxUnavailable"}},
		{From: "daemonsets.podSecurityContext", Action: Decision, Why: "operand pods here carry the security context each operand needs; set <operand>.securityContext where you must"},
		{From: "nfd.enabled", conv: nfdMode, Targets: []string{"nfd.mode"}},
		{From: "nfd.nodefeaturerules", Action: Dropped, Why: "this chart always renders its NodeFeatureRule for GPU nodes"},
		{From: "node-feature-discovery", conv: nfdSubchart, Why: "the bundled NFD (nfd.mode=bundled) is configured under nfd.* (nfd.worker, nfd.master, nfd.gc)"},

		// What this chart has by design: no operator, no custom resources.
		{From: "operator", Action: Dropped, Why: "kube-gpu-stack has no operator: Helm renders the operands, hooks do the node work"},
		{From: "clusterPolicy", Action: Dropped, Why: "there is no ClusterPolicy: these values are the policy"},
		{From: "gpuCluster", Action: Dropped, Why: "there is no GPUCluster resource"},
		{From: "extraObjects", Action: Decision, Same: []any{}, Why: "this chart renders no extra objects; apply them separately"},
		{From: "kataManager", conv: kataManager, Why: "this chart has no Kata manager: install the Kata runtime and its RuntimeClasses yourself"},
		{From: "operator.defaultRuntime", conv: defaultRuntime, Targets: []string{"toolkit.runtime"}},

		// The driver.
		{From: "driver.version", conv: imagePart, Targets: []string{"driver.image.tag"}},
		{From: "driver.usePrecompiled", conv: precompiled, Targets: []string{"driver.usePrecompiled"}},
		{From: "driver.kernelModuleType", To: "driver.kernelModuleType"},
		{From: "driver.useOpenKernelModules", conv: openModules("driver.kernelModuleType"), Targets: []string{"driver.kernelModuleType"}},
		{From: "driver.startupProbe.initialDelaySeconds", To: "driver.startupProbe.initialDelaySeconds"},
		{From: "driver.startupProbe.periodSeconds", To: "driver.startupProbe.periodSeconds"},
		{From: "driver.startupProbe.timeoutSeconds", To: "driver.startupProbe.timeoutSeconds"},
		{From: "driver.startupProbe.failureThreshold", To: "driver.startupProbe.failureThreshold"},
		{From: "driver.startupProbe.successThreshold", Action: Dropped, Why: "Kubernetes allows only 1 for a startup probe"},
		{From: "driver.livenessProbe", Action: Dropped, Why: "the driver pod's health is judged by its startup probe and the validator"},
		{From: "driver.readinessProbe", Action: Dropped, Why: "the driver pod is ready when its status file is written"},
		{From: "driver.rdma.enabled", To: "driver.rdma.enabled"},
		{From: "driver.rdma.useHostMofed", To: "driver.rdma.useHostMofed"},
		{From: "driver.repoConfig.configMapName", To: "driver.repoConfig.configMapName"},
		{From: "driver.certConfig.name", conv: certConfig, Targets: []string{"driver.certConfig.name"}},
		{From: "driver.licensingConfig.secretName", To: "driver.licensingConfig.secretName"},
		{From: "driver.licensingConfig.configMapName", To: "driver.licensingConfig.configMapName"},
		{From: "driver.licensingConfig.nlsEnabled", To: "driver.licensingConfig.nlsEnabled"},
		{From: "driver.kernelModuleConfig.name", To: "driver.kernelModuleConfig.name"},
		{From: "driver.virtualTopology.config", Action: Decision, Same: "", Why: "no place for a vGPU virtual topology ConfigMap"},
		{From: "driver.secretEnv", Action: Decision, Same: "", Why: "no place for a Secret of driver environment; put its values in driver.extraEnv"},
		{From: "driver.nvidiaDriverCRD.enabled", Action: Dropped, Why: "NVIDIADriver resources become driver.pools (kube-gpu-stack migrate --from-cluster reads them)"},
		{From: "driver.nvidiaDriverCRD.deployDefaultCR", Action: Dropped, Why: "the top-level driver values are the default pool"},
		{From: "driver.nvidiaDriverCRD.driverType", conv: driverType, Why: "the driver kind follows the driver image (vGPU host drivers are vgpuManager)"},
		{From: "driver.nvidiaDriverCRD.nodeSelector", Action: Decision, Same: map[string]any{}, Why: "the default pool serves every GPU node no pool selects; select the others with driver.pools"},
		{From: "driver.useNvidiaDriverCRD", Action: Dropped, Why: "NVIDIADriver resources become driver.pools"},
		{From: "driver.manager", Action: Dropped, Why: "the driver manager here is this project's own (driver.manager.image defaults to global.stackImage), not NVIDIA's k8s-driver-manager"},
		// the GPU Operator's keys for its k8s-driver-manager image: refused by name, not as unknown keys of ours
		{From: "driver.manager.repository", Action: Dropped, Why: "the driver manager here is this project's own: its image is global.stackImage, or driver.manager.image (registry, repository, tag)"},
		{From: "driver.manager.version", Action: Dropped, Why: "the driver manager here is this project's own: its image is global.stackImage, or driver.manager.image (registry, repository, tag)"},
		{From: "driver.manager.imagePullPolicy", Action: Dropped, Why: "the driver manager runs this project's image: driver.manager.image.pullPolicy, or global.stackImage.pullPolicy"},
		{From: "driver.manager.env", Action: Dropped, Why: "the driver manager's settings are driver.manager.gpuPodDeletion and driver.manager.drain (what the GPU Operator's env ENABLE_GPU_POD_EVICTION and ENABLE_AUTO_DRAIN switch)"},
		{From: "driver.upgradePolicy.autoUpgrade", To: "driver.upgradePolicy.autoUpgrade"},
		{From: "driver.upgradePolicy.maxParallelUpgrades", conv: maxParallel, Targets: []string{"driver.upgradePolicy.maxUnavailable"}},
		{From: "driver.upgradePolicy.maxUnavailable", conv: maxUnavailable, Targets: []string{"driver.upgradePolicy.maxUnavailable"}},
		{From: "driver.upgradePolicy.gpuPodDeletion.force", To: "driver.manager.gpuPodDeletion.force"},
		{From: "driver.upgradePolicy.gpuPodDeletion.timeoutSeconds", To: "driver.manager.gpuPodDeletion.timeoutSeconds"},
		{From: "driver.upgradePolicy.gpuPodDeletion.deleteEmptyDir", To: "driver.manager.gpuPodDeletion.deleteEmptyDir"},
		{From: "driver.upgradePolicy.podDeletion.force", To: "driver.manager.gpuPodDeletion.force"},
		{From: "driver.upgradePolicy.podDeletion.timeoutSeconds", To: "driver.manager.gpuPodDeletion.timeoutSeconds"},
		{From: "driver.upgradePolicy.podDeletion.deleteEmptyDir", To: "driver.manager.gpuPodDeletion.deleteEmptyDir"},
		{From: "driver.upgradePolicy.drain.enable", To: "driver.manager.drain.enabled"},
		{From: "driver.upgradePolicy.drain.force", To: "driver.manager.drain.force"},
		{From: "driver.upgradePolicy.drain.podSelector", To: "driver.manager.drain.podSelector"},
		{From: "driver.upgradePolicy.drain.timeoutSeconds", To: "driver.manager.drain.timeoutSeconds"},
		{From: "driver.upgradePolicy.drain.deleteEmptyDir", To: "driver.manager.drain.deleteEmptyDir"},
		{From: "driver.upgradePolicy.waitForCompletion.timeoutSeconds", Action: Decision, Same: 0, Why: "the driver change does not wait for jobs to finish; GPU pods are evicted (driver.manager.gpuPodDeletion) within their PodDisruptionBudgets"},
		{From: "driver.upgradePolicy.waitForCompletion.podSelector", Action: Decision, Same: "", Why: "the driver change does not wait for selected pods; protect them with a PodDisruptionBudget"},

		// The container toolkit.
		{From: "toolkit.env", conv: toolkitEnv, Targets: []string{"global.platform", "toolkit.runtime", "toolkit.runtimeConfig.config", "toolkit.runtimeConfig.dropInConfig", "toolkit.runtimeConfig.socket", "global.runtimeClassName", "toolkit.extraEnv"}},
		{From: "toolkit.installDir", To: "global.hostPaths.toolkitInstallDir"},

		// The device plugin (its config is also GFD's).
		{From: "devicePlugin.config.create", To: "devicePlugin.config.create"},
		{From: "devicePlugin.config.name", To: "devicePlugin.config.name"},
		{From: "devicePlugin.config.default", To: "devicePlugin.config.default"},
		{From: "devicePlugin.config.data", To: "devicePlugin.config.data"},
		{From: "devicePlugin.mps.root", To: "devicePlugin.mps.root"},

		// ahead of the operand rules' dcgm.enabled: the first exact rule wins
		{From: "dcgm.enabled", conv: dcgmStandalone, Targets: []string{"dcgm.enabled", "dcgmExporter.remoteHostEngine"}},
		{From: "dcgm.hostPort", To: "dcgm.hostPort"},
		{From: "dcgmExporter.annotations", To: "dcgmExporter.podAnnotations"},
		{From: "dcgmExporter.hostPID", Action: Dropped, Same: false, Why: "the exporter maps GPU processes to pods through the kubelet's pod-resources API"},
		{From: "dcgmExporter.enablePodLabels", To: "dcgmExporter.enablePodLabels"},
		{From: "dcgmExporter.enablePodUID", To: "dcgmExporter.enablePodUID"},
		{From: "dcgmExporter.podLabelAllowlistRegex", To: "dcgmExporter.podLabelAllowlistRegex"},
		{From: "dcgmExporter.hpcJobMapping.enabled", To: "dcgmExporter.hpcJobMapping.enabled"},
		{From: "dcgmExporter.hpcJobMapping.directory", To: "dcgmExporter.hpcJobMapping.directory"},
		{From: "dcgmExporter.service.type", To: "dcgmExporter.service.type"},
		{From: "dcgmExporter.service.internalTrafficPolicy", To: "dcgmExporter.service.internalTrafficPolicy"},
		{From: "dcgmExporter.serviceMonitor.enabled", conv: serviceMonitor, Targets: []string{"dcgmExporter.serviceMonitor.enabled"}},
		{From: "dcgmExporter.serviceMonitor.interval", To: "dcgmExporter.serviceMonitor.interval"},
		{From: "dcgmExporter.serviceMonitor.scrapeTimeout", To: "dcgmExporter.serviceMonitor.scrapeTimeout"},
		{From: "dcgmExporter.serviceMonitor.honorLabels", To: "dcgmExporter.serviceMonitor.honorLabels"},
		{From: "dcgmExporter.serviceMonitor.additionalLabels", To: "dcgmExporter.serviceMonitor.additionalLabels"},
		{From: "dcgmExporter.serviceMonitor.relabelings", To: "dcgmExporter.serviceMonitor.relabelings"},
		{From: "dcgmExporter.config.name", To: "dcgmExporter.config.name"},
		{From: "dcgmExporter.config.create", To: "dcgmExporter.config.create"},
		{From: "dcgmExporter.config.data", To: "dcgmExporter.config.data"},

		{From: "migManager.config.default", To: "migManager.config.default"},
		{From: "migManager.config.name", conv: migConfigName, Targets: []string{"migManager.config.name"}},
		{From: "migManager.config.create", Action: Dropped, Why: "migManager.config.data is always rendered into a ConfigMap unless migManager.config.name names your own"},
		{From: "migManager.config.data", conv: migConfigData, Targets: []string{"migManager.config.data"}},
		{From: "migManager.gpuClientsConfig.name", To: "migManager.gpuClientsConfig.name"},

		{From: "validator.driver.env", conv: envToMap("validator.driver.env"), Targets: []string{"validator.driver.env"}},
		{From: "validator.toolkit.env", conv: envToMap("validator.toolkit.env"), Targets: []string{"validator.toolkit.env"}},
		{From: "validator.cuda.env", conv: envToMap("validator.cuda.env"), Targets: []string{"validator.cuda.env"}},
		{From: "validator.plugin.env", conv: envToMap("validator.plugin.env"), Targets: []string{"validator.plugin.env"}},
		{From: "validator.vfioPCI.env", conv: envToMap("sandboxValidator.vfioPCI.env"), Targets: []string{"sandboxValidator.vfioPCI.env"}},
		{From: "validator.vgpuManager.env", conv: envToMap("sandboxValidator.vgpuManager.env"), Targets: []string{"sandboxValidator.vgpuManager.env"}},
		{From: "validator.vgpuDevices.env", conv: envToMap("sandboxValidator.vgpuDevices.env"), Targets: []string{"sandboxValidator.vgpuDevices.env"}},

		{From: "vgpuManager.driverManager", Action: Dropped, Why: "the vGPU manager's driver manager is this project's own (vgpuManager.manager.image defaults to global.stackImage)"},
		{From: "vgpuManager.kernelModuleConfig.name", Action: Decision, Same: "", Why: "the vGPU manager takes no kernel module parameters ConfigMap here"},
		{From: "vfioManager.driverManager", Action: Dropped, Why: "the VFIO manager's driver manager is this project's own (vfioManager.manager.image defaults to global.stackImage)"},
		{From: "vgpuDeviceManager.config.name", To: "vgpuDeviceManager.config.name"},
		{From: "vgpuDeviceManager.config.default", To: "vgpuDeviceManager.config.default"},
		{From: "ccManager.defaultMode", To: "ccManager.defaultMode"},

		{From: "draDriver.featureGates", To: "draDriver.featureGates"},
		{From: "draDriver.gpus.kubeletPlugin", Action: Decision, Same: map[string]any{}, Why: "the DRA kubelet plugin takes draDriver.gpus.* and the operand keys (resources, tolerations) here"},
		{From: "draDriver.computeDomains.enabled", To: "draDriver.computeDomains.enabled"},
		{From: "draDriver.computeDomains.controller", Action: Decision, Same: map[string]any{}, Why: "set draDriver.computeDomains.controller.{replicas,resources,env}"},
		{From: "draDriver.computeDomains.kubeletPlugin", Action: Decision, Same: map[string]any{}, Why: "the ComputeDomain kubelet plugin takes draDriver.computeDomains.* here"},
	}
	for _, op := range operands {
		rs = append(rs, operandRules(op)...)
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

// Rules returns the table for GPU Operator values and ClusterPolicy specs.
func Rules() []Rule { return rules }

// lookup finds the rule for an input path: an exact rule wins over one through `*`.
func lookup(rules []Rule, path string) *Rule {
	var best *Rule
	bestWild := 1 << 30
	segs := strings.Split(path, ".")
	for i := range rules {
		r := &rules[i]
		rs := strings.Split(r.From, ".")
		if len(rs) != len(segs) {
			continue
		}
		wild, ok := 0, true
		for j := range rs {
			if rs[j] == "*" {
				wild++
			} else if rs[j] != segs[j] {
				ok = false
				break
			}
		}
		if ok && wild < bestWild {
			best, bestWild = r, wild
		}
	}
	return best
}

// hasRuleBelow reports whether some rule sits under path, so a map there is walked key by key.
func hasRuleBelow(rules []Rule, path string) bool {
	for _, r := range rules {
		if strings.HasPrefix(r.From, path+".") {
			return true
		}
	}
	return false
}
