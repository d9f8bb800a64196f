{{/*
Names and shared pieces of the hook objects (hooks-validation.yaml, tests/validation-test.yaml,
validation-test-rbac.yaml, hooks-pre-upgrade.yaml, hooks-cleanup.yaml). Names are fixed: one release per
namespace, like the operands.
*/}}

{{/* kube-gpu-stack.hookNames: the hook objects' names, as JSON {gate, test, preUpgrade, cleanup, report} */}}
{{- define "kube-gpu-stack.hookNames" -}}
{{- toJson (dict
  "gate" "kube-gpu-stack-validation-gate"
  "test" "kube-gpu-stack-validation-test"
  "preUpgrade" "kube-gpu-stack-pre-upgrade"
  "cleanup" "kube-gpu-stack-cleanup"
  "report" "kube-gpu-stack-validation-report") -}}
{{- end }}

{{/*
kube-gpu-stack.checkEnv: the env of `kube-gpu-stack check` and `kube-gpu-stack pre-upgrade`: DRIVER_POOLS, the
driver pools and their DaemonSets as the driver chart renders them (driver.hookPools, the driver subchart's contract
with the hooks; named templates are global, and it is called only when that subchart is enabled).
*/}}
{{- define "kube-gpu-stack.checkEnv" -}}
{{- $pools := "[]" -}}
{{- if .Values.driver.enabled -}}
{{- $pools = include "driver.hookPools" (dict "Values" .Values.driver) -}}
{{- end -}}
{{- toJson (dict "DRIVER_POOLS" $pools) -}}
{{- end }}

{{/*
kube-gpu-stack.preUpgradeEnv: the env of `kube-gpu-stack pre-upgrade`: kube-gpu-stack.checkEnv and
VGPU_MANAGER_POOLS, the vGPU manager pools and their DaemonSets in DRIVER_POOLS' shape (vgpu-manager.hookPools, the
vGPU manager subchart's contract with the hook, called only when that subchart is enabled), so a vGPU manager
change is planned on its vm-vgpu nodes as a driver change is on container nodes.
*/}}
{{- define "kube-gpu-stack.preUpgradeEnv" -}}
{{- $env := include "kube-gpu-stack.checkEnv" . | fromJson -}}
{{- $pools := "[]" -}}
{{- if .Values.vgpuManager.enabled -}}
{{- /* the subchart reads global (its vm-vgpu role, its update strategy) as its own .Values.global */ -}}
{{- $values := deepCopy .Values.vgpuManager -}}
{{- $_ := set $values "global" .Values.global -}}
{{- $pools = include "vgpu-manager.hookPools" (dict "Values" $values) -}}
{{- end -}}
{{- $_ := set $env "VGPU_MANAGER_POOLS" $pools -}}
{{- toJson $env -}}
{{- end }}

{{/*
kube-gpu-stack.checkArgs: the arguments of `kube-gpu-stack check` for this release (JSON list); with the DRA driver
it waits for each DRA node's ResourceSlices too (checkRules grants the read then).
*/}}
{{- define "kube-gpu-stack.checkArgs" -}}
{{- $args := list "check" "--namespace" .Release.Namespace "--release" .Release.Name -}}
{{- if .Values.draDriver.enabled -}}
{{- $args = append $args "--resource-slices" -}}
{{- end -}}
{{- toJson $args -}}
{{- end }}

{{/*
kube-gpu-stack.checkRules: what `kube-gpu-stack check` reads, as JSON {"cluster": [RULE...], "namespace": [RULE...]}:
the nodes (labels, validation annotations), and in the release namespace the operand DaemonSets, their revisions
and pods, and the events that say why a pod is missing (FailedCreate with the admission reason). With the DRA
driver, also the ResourceSlices (cluster-scoped), to hold DRA nodes until theirs are published; only then: the API
(resource.k8s.io/v1) may be missing on a cluster without DRA, and the gate gets no right it does not use.
*/}}
{{- define "kube-gpu-stack.checkRules" -}}
{{- $read := list "get" "list" "watch" -}}
{{- $cluster := list (dict "apiGroups" (list "") "resources" (list "nodes") "verbs" $read) -}}
{{- if .Values.draDriver.enabled -}}
{{- $cluster = append $cluster (dict "apiGroups" (list "resource.k8s.io") "resources" (list "resourceslices") "verbs" $read) -}}
{{- end -}}
{{- toJson (dict
  "cluster" $cluster
  "namespace" (list
    (dict "apiGroups" (list "") "resources" (list "pods" "events") "verbs" $read)
    (dict "apiGroups" (list "apps") "resources" (list "daemonsets" "controllerrevisions") "verbs" $read)
    (dict "apiGroups" (list "events.k8s.io") "resources" (list "events") "verbs" $read))) -}}
{{- end }}

{{/*
kube-gpu-stack.clusterObjects: every cluster-scoped object of the release that Helm deletes on uninstall (not the
hooks, not the CRDs it keeps), for any values of this chart version, as JSON [[group, resource, kind, name], ...].
`helm uninstall` deletes the last revision's manifest only, and a refused upgrade's revision is the last: objects
of the revision before that it would not render (an operand switched off in the refused values) stay behind. So
the pre-delete cleanup deletes all of these by name, whatever the current values. tests/chart checks that every
profile's cluster-scoped objects are in it (TestCleanupNamesEveryClusterObject).
*/}}
{{- define "kube-gpu-stack.clusterObjects" -}}
{{- $nfd := include "gpu-stack-lib.nfdFullname" . -}}
{{- $rbac := list
  "compute-domain-daemon-service-account" "kube-gpu-stack-validation-test" "nvidia-cc-manager" "nvidia-dcgm-exporter"
  "nvidia-device-plugin" "nvidia-dra-driver-controller" "nvidia-dra-driver-kubelet-plugin" "nvidia-driver"
  "nvidia-gpu-feature-discovery" "nvidia-kata-sandbox-device-plugin" "nvidia-mig-manager" "nvidia-node-status-exporter"
  "nvidia-operator-validator" "nvidia-operator-validator-dra" "nvidia-sandbox-validator" "nvidia-vfio-manager"
  "nvidia-vgpu-device-manager" "nvidia-vgpu-manager" (printf "%s-master" $nfd) (printf "%s-gc" $nfd) -}}
{{- $out := list -}}
{{- range $rbac -}}
{{- $n := include "gpu-stack-lib.rbacClusterName" (dict "ctx" $ "name" .) -}}
{{- $out = append $out (list "rbac.authorization.k8s.io" "clusterroles" "clusterrole" $n) -}}
{{- $out = append $out (list "rbac.authorization.k8s.io" "clusterrolebindings" "clusterrolebinding" $n) -}}
{{- end -}}
{{- range list "gpu.nvidia.com" "mig.nvidia.com" "vfio.gpu.nvidia.com" "compute-domain-daemon.nvidia.com" "compute-domain-default-channel.nvidia.com" -}}
{{- $out = append $out (list "resource.k8s.io" "deviceclasses" "deviceclass" .) -}}
{{- end -}}
{{- range uniq (list .Values.global.runtimeClassName "nvidia" "nvidia-cdi" "nvidia-legacy") -}}
{{- $out = append $out (list "node.k8s.io" "runtimeclasses" "runtimeclass" .) -}}
{{- end -}}
{{- range list "node-scope" "hook-scope" -}}
{{- $policy := include "gpu-stack-lib.objectName" (printf "kube-gpu-stack-%s-%s" . $.Release.Namespace) -}}
{{- $out = append $out (list "admissionregistration.k8s.io" "validatingadmissionpolicies" "validatingadmissionpolicy" $policy) -}}
{{- $out = append $out (list "admissionregistration.k8s.io" "validatingadmissionpolicybindings" "validatingadmissionpolicybinding" $policy) -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
kube-gpu-stack.deleteByName: the RBAC rules that let the cleanup delete exactly the named objects: one rule per
group and resource, naming each of its objects, in the order first met. Takes [[group, resource, kind, name], ...];
renders JSON rules.
*/}}
{{- define "kube-gpu-stack.deleteByName" -}}
{{- $names := dict -}}
{{- $kinds := list -}}
{{- range . -}}
{{- $key := printf "%s/%s" (index . 0) (index . 1) -}}
{{- if not (hasKey $names $key) -}}
{{- $kinds = append $kinds (list (index . 0) (index . 1)) -}}
{{- $_ := set $names $key list -}}
{{- end -}}
{{- $_ := set $names $key (append (get $names $key) (index . 3) | uniq) -}}
{{- end -}}
{{- $rules := list -}}
{{- range $kinds -}}
{{- $rules = append $rules (dict "apiGroups" (list (index . 0)) "resources" (list (index . 1))
  "resourceNames" (get $names (printf "%s/%s" (index . 0) (index . 1))) "verbs" (list "delete")) -}}
{{- end -}}
{{- toJson $rules -}}
{{- end }}
