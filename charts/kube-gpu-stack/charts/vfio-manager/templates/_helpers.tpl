{{/* vfio-manager.active: "true" when the vm-passthrough role exists (global.sandboxWorkloads.enabled) */}}
{{- define "vfio-manager.active" -}}
{{- if (include "gpu-stack-lib.activeRoles" (dict "ctx" . "roles" (list "vm-passthrough")) | fromJson).roles }}true{{ end -}}
{{- end }}
