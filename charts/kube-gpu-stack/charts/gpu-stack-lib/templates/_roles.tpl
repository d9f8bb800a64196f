{{/*
Node roles: selectors, not a labeller. A DaemonSet selects a node when all three facts hold:
  1. GPU present: nvidia.com/gpu.present=true;
  2. role: nvidia.com/gpu.workload.config is one of the operand's roles (a node without the label, or with a value
     that is no role, has global.sandboxWorkloads.defaultWorkload); with sandbox workloads off every GPU node is
     `container`;
  3. switch: nvidia.com/gpu.deploy.<operand> absent, `true` or empty (any other value - false,
     paused-for-driver-upgrade, paused-for-mig-change, pre-installed - keeps it off), and
     nvidia.com/gpu.deploy.operands is not `false`. Empty counts as absent, as in the GPU Operator: the CC manager
     pauses a node's sandbox operands by rewriting their switches and writes "" to the ones that were absent, so
     "" must mean "run" or its pause would remove them for good.
*/}}

{{/* gpu-stack-lib.allRoles: the three node roles, as a YAML list */}}
{{- define "gpu-stack-lib.allRoles" -}}
- container
- vm-passthrough
- vm-vgpu
{{- end }}

{{/*
gpu-stack-lib.activeRoles: the operand's roles that exist under global.sandboxWorkloads, as {"roles": [...]}.
Call with dict "ctx" . "roles" (list ...). An empty list means the operand renders nothing.
*/}}
{{- define "gpu-stack-lib.activeRoles" -}}
{{- $roles := .roles -}}
{{- if not .ctx.Values.global.sandboxWorkloads.enabled -}}
{{- $roles = has "container" .roles | ternary (list "container") list -}}
{{- end -}}
{{- toJson (dict "roles" $roles) -}}
{{- end }}

{{/*
gpu-stack-lib.roleRequirement: the node selector requirement for a role set, as a YAML list with zero or one item.
When the default role is in the set the requirement is `NotIn <the other roles>`, which also matches nodes without
the label and nodes whose label is no known role - exactly "falls back to the default role".
*/}}
{{- define "gpu-stack-lib.roleRequirement" -}}
{{- $sw := .ctx.Values.global.sandboxWorkloads -}}
{{- if $sw.enabled -}}
{{- $others := list -}}
{{- range (include "gpu-stack-lib.allRoles" . | fromYamlArray) -}}
{{- if not (has . $.roles) }}{{ $others = append $others . }}{{ end -}}
{{- end -}}
{{- if has $sw.defaultWorkload .roles -}}
{{- if $others }}
- key: nvidia.com/gpu.workload.config
  operator: NotIn
  values: {{ toJson $others }}
{{- end }}
{{- else }}
- key: nvidia.com/gpu.workload.config
  operator: In
  values: {{ toJson .roles }}
{{- end }}
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.nodeAffinity: an operand's node affinity, set as .out.nodeAffinity.
dict "ctx" . "operand" DEPLOY_LABEL_SUFFIX "roles" (list ...) ["match" (list REQUIREMENT ...)]
["matchAny" (list (list REQUIREMENT ...) ...)] "out" DICT
"Absent or true" is two OR'ed terms (DoesNotExist | In [true, ""]), never a NotIn list a new value would slip through.
matchAny is a disjunction of alternatives (each a requirement list ANDed with the common ones), for conditions a
single term cannot say, such as "selected by none of these selectors": one term per alternative x switch term.
*/}}
{{- define "gpu-stack-lib.nodeAffinity" -}}
{{- $common := list (dict "key" "nvidia.com/gpu.present" "operator" "In" "values" (list "true")) -}}
{{- $common = concat $common (include "gpu-stack-lib.roleRequirement" . | fromYamlArray) -}}
{{- $common = append $common (dict "key" "nvidia.com/gpu.deploy.operands" "operator" "NotIn" "values" (list "false")) -}}
{{- $common = concat $common (.match | default list) -}}
{{- $switch := printf "nvidia.com/gpu.deploy.%s" .operand -}}
{{- $terms := list -}}
{{- range $alt := .matchAny | default (list list) -}}
{{- $reqs := concat $common $alt -}}
{{- $terms = append $terms (dict "matchExpressions" (append $reqs (dict "key" $switch "operator" "DoesNotExist"))) -}}
{{- $terms = append $terms (dict "matchExpressions" (append $reqs (dict "key" $switch "operator" "In" "values" (list "true" "")))) -}}
{{- end -}}
{{- $_ := set .out "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) -}}
{{- end }}

{{/*
gpu-stack-lib.active: "true" when any of the operand's roles exists under global.sandboxWorkloads, else empty.
Operands use it to skip their ServiceAccount, RBAC and ConfigMaps along with the DaemonSet.
dict "ctx" . "roles" (list ...)
*/}}
{{- define "gpu-stack-lib.active" -}}
{{- if (include "gpu-stack-lib.activeRoles" . | fromJson).roles }}true{{ end -}}
{{- end }}
