{{/*
GPU allocation, per driver pool: a GPU node hands its GPUs to pods either through the device plugin (nvidia.com/gpu
resources) or through the DRA driver (resource.k8s.io claims), never both. driver.gpuAllocation is the default
pool's choice and what every pool inherits; driver.pools[].gpuAllocation overrides it per pool. The device plugin
(and its MPS control daemon) and the DRA kubelet plugin take their node scope from here: from the allocation mode
label each node's driver manager writes (gpu-stack-lib.allocationScope), so a node is on one side only.
*/}}

{{/*
gpu-stack-lib.allocationScope: where the operands of one allocation mode run, as JSON {"nowhere": bool, "matchAny":
[[REQUIREMENT...]]} for gpu-stack-lib.nodeAffinity's matchAny. A node's mode is its nvidia.com/gpu.allocation label,
which its pool's driver manager writes (GPU_ALLOCATION) once no pod holds its GPUs the other way; a node without
it (new, or with no driver manager: host drivers, driver off) has the default pool's mode. So the scope depends
only on driver.gpuAllocation and on whether some pool has the mode - never on the pools' selectors - and moving a
pool changes its driver DaemonSet alone: no plugin DaemonSet rolls on the other pools. Nowhere when no pool has
the mode, unless "keep": the DRA kubelet plugin stays while draDriver.enabled, for nodes still labelled dra as the
last pool leaves DRA (it unprepares their claims as their pods go). dict "driver" DRIVER_VALUES "mode"
(device-plugin | dra) ["keep" bool]
*/}}
{{- define "gpu-stack-lib.allocationScope" -}}
{{- $default := .driver.gpuAllocation | default "device-plugin" -}}
{{- $other := ternary "dra" "device-plugin" (eq .mode "device-plugin") -}}
{{- $has := eq $default .mode -}}
{{- range .driver.pools | default list }}{{ if eq (.gpuAllocation | default $default) $.mode }}{{ $has = true }}{{ end }}{{ end -}}
{{- $label := "nvidia.com/gpu.allocation" -}}
{{- if not (or $has .keep) -}}
{{- toJson (dict "nowhere" true) -}}
{{- else if eq $default .mode -}}
{{- toJson (dict "nowhere" false "matchAny" (list (list (dict "key" $label "operator" "NotIn" "values" (list $other))))) -}}
{{- else -}}
{{- toJson (dict "nowhere" false "matchAny" (list (list (dict "key" $label "operator" "In" "values" (list .mode))))) -}}
{{- end -}}
{{- end }}

{{/*
gpu-stack-lib.allocationNodeSelector: an allocationScope as a node selector, JSON {"nodeSelectorTerms": [...]} (one
term per alternative, each with nvidia.com/gpu.present), for binaries that decide per node (the validator's plugin
check skips DRA nodes); empty when the scope is nowhere. dict "scope" SCOPE
*/}}
{{- define "gpu-stack-lib.allocationNodeSelector" -}}
{{- if not .scope.nowhere -}}
{{- $terms := list -}}
{{- range .scope.matchAny | default (list list) -}}
{{- $terms = append $terms (dict "matchExpressions" (prepend . (dict "key" "nvidia.com/gpu.present" "operator" "In" "values" (list "true")))) -}}
{{- end -}}
{{- toJson (dict "nodeSelectorTerms" $terms) -}}
{{- end -}}
{{- end }}
