{{/* sandbox-validator.roles: the node roles it serves, as a JSON list */}}
{{- define "sandbox-validator.roles" -}}
["vm-passthrough", "vm-vgpu"]
{{- end }}

{{/* sandbox-validator.active: "true" when one of its roles exists under global.sandboxWorkloads; else nothing renders */}}
{{- define "sandbox-validator.active" -}}
{{- include "gpu-stack-lib.active" (dict "ctx" . "roles" (include "sandbox-validator.roles" . | fromJsonArray)) -}}
{{- end }}
