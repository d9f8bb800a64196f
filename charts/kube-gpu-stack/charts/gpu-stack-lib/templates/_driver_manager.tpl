{{/*
Driver-class operands (driver, vgpu-manager, vfio-manager): the driver-manager init container they share, its image,
the driver-upgrade-gate sidecar and the driver manager's RBAC. OS tags are in _os.tpl, pools in _pools.tpl.
*/}}

{{/*
gpu-stack-lib.driverManagerContainer: the `driver-manager uninstall-driver` init container. Before the operand's
main container starts it stops what uses the GPUs on the node (as the caller's switches allow) and unloads the
loaded NVIDIA modules, keeping them when DRIVER_CONFIG_DIGEST matches the loaded driver's. dict:
  ctx           the operand chart's context
  image         optional image map (the operand's manager.image), resolved by gpu-stack-lib.driverManagerImage: its
                empty registry, repository and pullPolicy take global.stackImage's. A pinned tag there keeps
                chart-only releases from rolling driver pods. Without it: the project's image at the appVersion.
  env           the caller's switches, NAME -> value (ENABLE_GPU_POD_EVICTION, ENABLE_AUTO_DRAIN, DRAIN_*,
                DRIVER_CONFIG_DIGEST, ...); they win over the base env below
  volumeMounts  optional extra mounts (e.g. /run/mellanox/drivers to wait for MOFED)
It runs privileged as root: delete_module(2), umount2(2) and the sysfs writes need capabilities that the image's
user (65532) does not get, even in a privileged container. It mounts the pod's API token itself
(gpu-stack-lib.apiAccessMount): the pod does not automount it, so the operand's third-party container never holds
the driver manager's rights.
*/}}
{{- define "gpu-stack-lib.driverManagerContainer" -}}
{{- $image := include "gpu-stack-lib.driverManagerImage" . | fromJson -}}
{{- /* DRIVER_ROOT is where a containerized driver mounts its root: under /run/nvidia, which the driver images fix */ -}}
{{- /* POD_NAME names the holder of the node's driver-manager Lease */ -}}
{{- $env := dict
  "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
  "OPERATOR_NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))
  "POD_NAME" (dict "fieldRef" (dict "fieldPath" "metadata.name"))
  "HOST_ROOT" "/host"
  "DRIVER_ROOT" "/run/nvidia/driver"
  "NVIDIA_VISIBLE_DEVICES" "void"
-}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "driver-manager"
  "image" $image.ref
  "pullPolicy" $image.pullPolicy
  "command" (list "driver-manager" "uninstall-driver")
  "env" (mergeOverwrite $env (deepCopy (.env | default dict)))
  "volumeMounts" (concat (list
    (dict "name" "run-nvidia" "mountPath" "/run/nvidia" "mountPropagation" "Bidirectional")
    (dict "name" "host-root" "mountPath" "/host" "readOnly" true "mountPropagation" "HostToContainer")
    (dict "name" "host-sys" "mountPath" "/sys")
    (include "gpu-stack-lib.apiAccessMount" . | fromJson))
    (.volumeMounts | default list))
  "securityContext" (dict "privileged" true "runAsUser" 0 "readOnlyRootFilesystem" true)
) -}}
{{- end }}

{{/*
gpu-stack-lib.driverManagerImage: the driver manager's image as {"ref", "pullPolicy"}: the operand's manager.image,
its empty registry, repository and pullPolicy taken from global.stackImage, its tag pinned (without one: the
chart's appVersion); without an image, the project's image at the appVersion. The driver manager init container and
the driver-upgrade-gate sidecar of one pod run this same image. dict "ctx" . ["image" IMAGE]
*/}}
{{- define "gpu-stack-lib.driverManagerImage" -}}
{{- $stack := .ctx.Values.global.stackImage -}}
{{- $img := deepCopy (.image | default dict) -}}
{{- $ref := "" -}}
{{- if .image -}}
{{- $_ := set $img "registry" ($img.registry | default $stack.registry) -}}
{{- $_ = set $img "repository" ($img.repository | default $stack.repository) -}}
{{- $ref = include "gpu-stack-lib.image" (dict "ctx" .ctx "image" $img "defaultTag" .ctx.Chart.AppVersion) -}}
{{- else -}}
{{- $ref = include "gpu-stack-lib.stackImage" .ctx -}}
{{- end -}}
{{- toJson (dict "ref" $ref "pullPolicy" ($img.pullPolicy | default $stack.pullPolicy)) -}}
{{- end }}

{{/*
gpu-stack-lib.uncordonSidecar: the `driver-upgrade-gate` sidecar of a driver-class pod (driver, vGPU manager), as
{"container": CONTAINER, "volume": VOLUME} for the pod's containers and volumes. It runs `driver-manager
uncordon-when-valid --hold`: after a driver change (the node is validation-required) it waits for the node's
validator pod to turn Ready with the new driver, then lifts the driver manager's cordon and marks the node
upgrade-done; on an upgrade-failed node it waits, never Ready, until the node is retried; in any other state it has
nothing to wait for. Then it writes its ready file, which its startup probe waits on: the pod, and with it the
DaemonSet's rolling update, counts a node as available only once it validated with the new driver, so no more than
maxUnavailable nodes are ever in flight. A startup probe, not a readiness probe: it checks every second, so the
rolling update moves on within a second of the validation, and it stops once it passed (the file is never taken
back), so a node in service runs no probe at all. Its failure threshold outlasts the gate's own timeout: only a
gate that holds an upgrade-failed node un-Ready for over an hour is restarted, and holds again. It runs the driver
manager's image (gpu-stack-lib.driverManagerImage: pinned, so a chart-only release changes no pod template), with
the driver manager's RBAC (gpu-stack-lib.driverManagerRules: nodes get/patch, pods list/watch) and mounts the pod's
API token itself (gpu-stack-lib.apiAccessMount). dict:
  ctx                 the operand chart's context
  image               as gpu-stack-lib.driverManagerContainer (the operand's manager.image)
  validatorComponent  optional app.kubernetes.io/component of the node's validator pods (the binary's default is
                      operator-validator; the vGPU manager's nodes have sandbox-validator)
  timeoutSeconds      optional: how long it waits for the validator before marking the node upgrade-failed (the
                      binary's default is 600 s)
  replace             optional: an OnDelete DaemonSet's pod (the driver's). The gate then stays as the node's agent:
                      when the DaemonSet's template installs another driver it takes the node's turn (canary, slot),
                      cordons, evicts the GPU pods, pauses the GPU operands, and only then evicts its own pod, so
                      the old driver container stops on an emptied node
  onRequest           optional, with replace (autoUpgrade=false): the agent waits for the node's
                      nvidia.com/gpu-driver-upgrade-requested=true annotation
  driverStartupSeconds optional, with replace: the driver container's startup budget (its startup probe). The
                      validation timeout then counts from the driver container's start, within that budget
  env                 optional: more environment, NAME: value (the driver's maintenance mark, which a node failed
                      by the gate's timeout ends)
With replace the result also has "stopFile" and "stopMount": when the pod is deleted outside the agent's own
replacement (`kubectl delete pod`, a node moved to another pool, a pool renamed), the gate empties the node for the
DaemonSet's next pod and then writes stopFile; the driver container mounts stopMount and its preStop waits for
that file, so the driver's stop finds no GPU pod. With no driver DaemonSet left for the node (an uninstall) the gate
writes it at once.
*/}}
{{- define "gpu-stack-lib.uncordonSidecar" -}}
{{- $image := include "gpu-stack-lib.driverManagerImage" . | fromJson -}}
{{- $dir := "/run/kube-gpu-stack" -}}
{{- /* 600: the binary's default timeout (drivermanager.DefaultValidationTimeout) */ -}}
{{- $probeSeconds := max 3600 (add (.timeoutSeconds | default 600 | int) (ternary (.driverStartupSeconds | default 0 | int) 0 (not (empty .replace))) 300) -}}
{{- $args := list "--hold" "--ready-file" (printf "%s/driver-validated" $dir) -}}
{{- with .validatorComponent }}{{ $args = concat $args (list "--validator-component" .) }}{{ end -}}
{{- with .timeoutSeconds }}{{ $args = concat $args (list "--timeout" (printf "%ds" (int .))) }}{{ end -}}
{{- if .replace }}{{ $args = concat $args (list "--replace-outdated") }}{{ end -}}
{{- if .replace }}{{ $args = concat $args (list "--stop-file" (printf "%s/driver-may-stop" $dir)) }}{{ end -}}
{{- if and .replace .onRequest }}{{ $args = concat $args (list "--on-request") }}{{ end -}}
{{- if and .replace .driverStartupSeconds }}{{ $args = concat $args (list "--driver-startup-timeout" (printf "%ds" (int .driverStartupSeconds))) }}{{ end -}}
{{- $env := dict "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName")) "OPERATOR_NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace")) -}}
{{- /* the agent compares its own pod with its DaemonSet */ -}}
{{- if .replace }}{{ $_ := set $env "POD_NAME" (dict "fieldRef" (dict "fieldPath" "metadata.name")) }}{{ end -}}
{{- range $k, $val := .env | default dict }}{{ $_ := set $env $k $val }}{{ end -}}
{{- $container := include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "driver-upgrade-gate"
  "image" $image.ref
  "pullPolicy" $image.pullPolicy
  "command" (list "driver-manager" "uncordon-when-valid")
  "args" $args
  "env" $env
  "volumeMounts" (list (dict "name" "driver-upgrade-gate" "mountPath" $dir) (include "gpu-stack-lib.apiAccessMount" . | fromJson))
  "securityContext" (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")))
  "spec" (dict
    "startupProbe" (dict
      "exec" (dict "command" (list "validator" "wait" "--dir" $dir "--interval" "100ms" "--timeout" "500ms" "driver-validated"))
      "periodSeconds" 1
      "timeoutSeconds" 3
      "failureThreshold" $probeSeconds)
    "resources" (dict "requests" (dict "cpu" "5m" "memory" "32Mi") "limits" (dict "memory" "128Mi")))
) | fromYaml -}}
{{- $out := dict "container" $container "volume" (dict "name" "driver-upgrade-gate" "emptyDir" (dict "sizeLimit" "1Mi")) -}}
{{- if .replace }}
{{- $_ := set $out "stopFile" (printf "%s/driver-may-stop" $dir) -}}
{{- $_ = set $out "stopMount" (dict "name" "driver-upgrade-gate" "mountPath" $dir "readOnly" true) -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
gpu-stack-lib.driverManagerRules: the ClusterRole rules of a pod running the driver manager, each what its code
calls and nothing more (tests/chart/rbac_nodes_test.go runs it against the rendered rules): its node read, watched
(kwatch.Node) and patched (cordon, labels, annotations; never updated); operand and validator pods listed and
watched on the node; with `evict` (gpudrain: GPU pod eviction or auto-drain on): GPU pods evicted,
PodDisruptionBudgets watched and DaemonSets read (kubectl's drain checks a DaemonSet pod's owner); with `claims`
DRA claims listed (gpupods: the GPU pods an eviction moves, and the claim holders that keep the DRA kubelet plugin
from being paused). No pods delete: gpudrain deletes only where the API server has no Eviction API, which every
supported Kubernetes serves; with `nodeStatus` its node's GPU health condition written (Maintenance, held to that by the
admission policy). dict "evict" BOOL "claims" BOOL "nodeStatus" BOOL; renders a YAML list.
*/}}
{{- define "gpu-stack-lib.driverManagerRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
{{- if .nodeStatus }}
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch]
{{- end }}
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
{{- if .evict }}
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get]
{{- end }}
{{- if or .evict .claims }}
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [list]
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.driverManagerLeaseRules: the Role rules (release namespace) of a pod running the driver manager: the
per-node Lease it holds while it runs (client-go's LeaseLock: get, create, update) and its pool's slots Lease, which
it takes a slot of before it cordons and watches while the pool is full (list, watch); with "replace", its own
DaemonSet read, the driver DaemonSets listed and its ControllerRevisions watched; nothing more.
*/}}
{{- define "gpu-stack-lib.driverManagerLeaseRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update]
{{- if .replace }}
{{- /* the upgrade gate's agent follows its own driver DaemonSet's template (templatewatch.go), in the release
namespace only: it watches the DaemonSet's ControllerRevisions, which change with the template alone, and reads
the DaemonSet when one does; a driver pod being deleted lists the driver DaemonSets to find the one that takes its
node over (stopguard.go) */}}
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, list]
- apiGroups: [apps]
  resources: [controllerrevisions]
  verbs: [list, watch]
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.driverManagerRbac: the ServiceAccount of a pod running the driver manager (driver, vGPU manager, VFIO
manager), its ClusterRole (gpu-stack-lib.driverManagerRules) and its Role for the node Lease
(gpu-stack-lib.driverManagerLeaseRules, with "replace" its own DaemonSet read and its ControllerRevisions watched too); its pods run privileged with
host access (the privileged SCC on OpenShift). dict "ctx" . "name" SERVICE_ACCOUNT "evict" BOOL "claims" BOOL
"replace" BOOL "nodeStatus" BOOL
*/}}
{{- define "gpu-stack-lib.driverManagerRbac" -}}
{{- include "gpu-stack-lib.rbac" (dict "ctx" .ctx "name" .name "scc" "privileged"
  "clusterRules" (include "gpu-stack-lib.driverManagerRules" (dict "evict" .evict "claims" .claims "nodeStatus" .nodeStatus) | fromYamlArray)
  "rules" (include "gpu-stack-lib.driverManagerLeaseRules" (dict "replace" .replace) | fromYamlArray)) -}}
{{- end }}
