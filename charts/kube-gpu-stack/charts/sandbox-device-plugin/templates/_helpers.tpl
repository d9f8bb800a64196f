{{/*
sandbox-device-plugin.roles: the node roles it serves, as a JSON list. In kata mode vm-passthrough GPUs belong to
the Kata sandbox device plugin, so this plugin keeps only vm-vgpu.
*/}}
{{- define "sandbox-device-plugin.roles" -}}
{{- if eq .Values.global.sandboxWorkloads.mode "kata" -}}
["vm-vgpu"]
{{- else -}}
["vm-passthrough", "vm-vgpu"]
{{- end -}}
{{- end }}

{{/* sandbox-device-plugin.active: "true" when one of its roles exists under global.sandboxWorkloads; else nothing renders */}}
{{- define "sandbox-device-plugin.active" -}}
{{- include "gpu-stack-lib.active" (dict "ctx" . "roles" (include "sandbox-device-plugin.roles" . | fromJsonArray)) -}}
{{- end }}
