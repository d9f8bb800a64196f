{{/*
GPU allocation, per driver pool: a GPU node hands its GPUs to pods either through the device plugin (nvidia.com/gpu
resources) or through the DRA driver (resource.k8s.io claims), never both. driver.gpuAllocation is the default
pool's choice and what every pool inherits; driver.pools[].gpuAllocation overrides it per pool. The device plugin
(and its MPS control daemon) and the DRA kubelet plugin take their node scope from here, built from the same pool
selectors the driver DaemonSets use, so a node is on one side only.
*/}}

{{/*
gpu-stack-lib.allocationScope: where the operands of one allocation mode run, as JSON {"nowhere": bool, "matchAny":
[[REQUIREMENT...]...]} for gpu-stack-lib.nodeAffinity's matchAny; no matchAny means every GPU node (every pool
has the mode). When the default pool has the mode, its nodes are those no pool of the other mode selects; else
they are the nodes of the pools that have it. dict "driver" DRIVER_VALUES "mode" (device-plugin | dra)
*/}}
{{- define "gpu-stack-lib.allocationScope" -}}
{{- /* only the pools' selectors and gpuAllocation matter here; the driver chart's other keys may be absent (off) */ -}}
{{- $default := .driver.gpuAllocation | default "device-plugin" -}}
{{- $slim := list -}}
{{- range .driver.pools | default list }}{{ $slim = append $slim (pick . "name" "nodeSelector" "source" "gpuAllocation") }}{{ end -}}
{{- $values := dict "gpuAllocation" $default "pools" $slim -}}
{{- $pools := (include "gpu-stack-lib.pools" (dict "values" $values "key" "driver.pools") | fromJson).items -}}
{{- $with := list -}}
{{- $without := list -}}
{{- range $pools -}}
{{- if ne .name "default" -}}
{{- if eq (.values.gpuAllocation | default "device-plugin") $.mode -}}
{{- $with = append $with .requirements -}}
{{- else -}}
{{- $without = append $without .requirements -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $default .mode -}}
{{- if $without -}}
{{- toJson (dict "nowhere" false "matchAny" (include "gpu-stack-lib.excludeSelectors" (dict "selectors" $without) | fromJson).items) -}}
{{- else -}}
{{- toJson (dict "nowhere" false) -}}
{{- end -}}
{{- else if $with -}}
{{- toJson (dict "nowhere" false "matchAny" $with) -}}
{{- else -}}
{{- toJson (dict "nowhere" true) -}}
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
