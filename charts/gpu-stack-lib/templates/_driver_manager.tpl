{{/*
Driver-class operands (driver, vgpu-manager, vfio-manager): the driver-manager init container they share, and the
per-OS fan-out of driver DaemonSets (one per OS tag, selected on NFD's os_release labels, never "the first node").
*/}}

{{/*
gpu-stack-lib.driverManagerContainer: the `driver-manager uninstall-driver` init container. Before the operand's
main container starts it stops what uses the GPUs on the node (as the caller's switches allow) and unloads the
loaded NVIDIA modules, keeping them when DRIVER_CONFIG_DIGEST matches the loaded driver's. dict:
  ctx           the operand chart's context
  image         optional image map (the operand's manager.image); its empty registry, repository and pullPolicy
                take global.stackImage's. A pinned tag there keeps chart-only releases from rolling driver pods.
                Without it: the project's image at the chart's appVersion.
  env           the caller's switches, NAME -> value (ENABLE_GPU_POD_EVICTION, ENABLE_AUTO_DRAIN, DRAIN_*,
                DRIVER_CONFIG_DIGEST, ...); they win over the base env below
  volumeMounts  optional extra mounts (e.g. /run/mellanox/drivers to wait for MOFED)
*/}}
{{- define "gpu-stack-lib.driverManagerContainer" -}}
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
{{- /* DRIVER_ROOT is where a containerized driver mounts its root: under /run/nvidia, which the driver images fix */ -}}
{{- $env := dict
  "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
  "OPERATOR_NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))
  "HOST_ROOT" "/host"
  "DRIVER_ROOT" "/run/nvidia/driver"
  "NVIDIA_VISIBLE_DEVICES" "void"
-}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "driver-manager"
  "image" $ref
  "pullPolicy" ($img.pullPolicy | default $stack.pullPolicy)
  "command" (list "driver-manager" "uninstall-driver")
  "env" (mergeOverwrite $env (deepCopy (.env | default dict)))
  "volumeMounts" (concat (list
    (dict "name" "run-nvidia" "mountPath" "/run/nvidia" "mountPropagation" "Bidirectional")
    (dict "name" "host-root" "mountPath" "/host" "readOnly" true "mountPropagation" "HostToContainer")
    (dict "name" "host-sys" "mountPath" "/sys"))
    (.volumeMounts | default list))
  "securityContext" (dict "privileged" true)
) -}}
{{- end }}

{{/*
gpu-stack-lib.driverManagerRules: the ClusterRole rules of a pod running the driver manager: pause operands
through node labels and cordon (nodes), wait for operand pods, see DRA claims and, with `evict`, evict GPU pods
(PDB-aware) and drain. dict "evict" BOOL; renders a YAML list.
*/}}
{{- define "gpu-stack-lib.driverManagerRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: {{ ternary "[get, list, watch, delete]" "[get, list, watch]" (.evict | default false) }}
{{- if .evict }}
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch]
{{- end }}
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, list, watch]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [get, list]
{{- end }}

{{/*
gpu-stack-lib.osInfo: one OS tag (<ID><VERSION_ID> as NFD reports os_release, e.g. ubuntu22.04, rhel9) parsed into
{"tag", "id", "version", "suffix" (the tag without dots, for object names), "match" (node selector requirements
for gpu-stack-lib.daemonset's `match`)}, as JSON. Letters (and inner dashes) are the ID, the rest the version. A
version without a dot (rhel9, rocky9, ol9: the images drop the minor version) matches VERSION_ID.major, so every
9.x node takes it. dict "tag" TAG "key" VALUES_KEY (named in the error).
*/}}
{{- define "gpu-stack-lib.osInfo" -}}
{{- $tag := toString .tag -}}
{{- if not (regexMatch "^[a-z]+(-[a-z]+)*[0-9]+(\\.[0-9]+)*$" $tag) -}}
{{- fail (printf "%s: %q is not an OS tag: write <ID><VERSION_ID> as NFD's feature.node.kubernetes.io/system-os_release labels show them, e.g. ubuntu22.04, ubuntu24.04, rhel9" .key $tag) -}}
{{- end -}}
{{- $id := regexFind "^[a-z]+(-[a-z]+)*" $tag -}}
{{- $version := trimPrefix $id $tag -}}
{{- $prefix := "feature.node.kubernetes.io/system-os_release" -}}
{{- $versionKey := ternary (printf "%s.VERSION_ID" $prefix) (printf "%s.VERSION_ID.major" $prefix) (contains "." $version) -}}
{{- toJson (dict
  "tag" $tag
  "id" $id
  "version" $version
  "suffix" (replace "." "" $tag)
  "match" (list
    (dict "key" (printf "%s.ID" $prefix) "operator" "In" "values" (list $id))
    (dict "key" $versionKey "operator" "In" "values" (list $version)))
) -}}
{{- end }}

{{/*
gpu-stack-lib.osList: a list of OS tags parsed with gpu-stack-lib.osInfo, as {"items": [...]}. Fails on an empty
list and on two tags that would put two driver pods on one node (same tag, or rhel9 next to rhel9.4).
dict "tags" (list ...) "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.osList" -}}
{{- $key := .key -}}
{{- if not .tags }}{{ fail (printf "%s: list at least one OS tag of your GPU nodes (e.g. ubuntu22.04, ubuntu24.04, rhel9)" $key) }}{{ end -}}
{{- $items := list -}}
{{- range .tags -}}
{{- $os := include "gpu-stack-lib.osInfo" (dict "tag" . "key" $key) | fromJson -}}
{{- range $items -}}
{{- $oneMajorOnly := ne (contains "." .version) (contains "." $os.version) -}}
{{- if or (eq .suffix $os.suffix) (and (eq .id $os.id) $oneMajorOnly (eq (first (splitList "." .version)) (first (splitList "." $os.version)))) -}}
{{- fail (printf "%s: OS tags %q and %q select the same nodes; keep one" $key .tag $os.tag) -}}
{{- end -}}
{{- end -}}
{{- $items = append $items $os -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end }}

{{/*
gpu-stack-lib.osImage: an image whose tag gets the OS tag appended (<tag>-<os tag>, the NVIDIA driver image
scheme), resolved with gpu-stack-lib.image. A digest, when set, pins the image as given.
dict "ctx" . "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImage" -}}
{{- $img := deepCopy .image -}}
{{- with $img.tag }}{{ $_ := set $img "tag" (printf "%v-%s" . $.os.tag) }}{{ end -}}
{{- include "gpu-stack-lib.image" (dict "ctx" .ctx "image" $img) -}}
{{- end }}

{{/*
gpu-stack-lib.osImageID: repository[:<tag>-<os tag>][@digest] of an image, without its registry, for config digests:
moving to a mirror (global.imageRegistry) changes no digest. dict "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImageID" -}}
{{- $id := .image.repository -}}
{{- with .image.tag }}{{ $id = printf "%s:%v-%s" $id . $.os.tag }}{{ end -}}
{{- with .image.digest }}{{ $id = printf "%s@%s" $id . }}{{ end -}}
{{- $id -}}
{{- end }}
