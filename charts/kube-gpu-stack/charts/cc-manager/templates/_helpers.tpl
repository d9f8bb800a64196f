{{/* cc-manager.roles: the node roles it serves, as a JSON list: both VM roles in kata mode, none in kubevirt mode */}}
{{- define "cc-manager.roles" -}}
{{- if eq .Values.global.sandboxWorkloads.mode "kata" -}}
["vm-passthrough", "vm-vgpu"]
{{- else -}}
[]
{{- end -}}
{{- end }}

{{/* cc-manager.active: "true" when one of its roles exists under global.sandboxWorkloads; else nothing renders */}}
{{- define "cc-manager.active" -}}
{{- include "gpu-stack-lib.active" (dict "ctx" . "roles" (include "cc-manager.roles" . | fromJsonArray)) -}}
{{- end }}
