{{/*
kata-sandbox-device-plugin.roles: the node roles it serves, as a JSON list: vm-passthrough in kata mode, none in
kubevirt mode (where the KubeVirt sandbox device plugin serves those nodes).
*/}}
{{- define "kata-sandbox-device-plugin.roles" -}}
{{- if eq .Values.global.sandboxWorkloads.mode "kata" -}}
["vm-passthrough"]
{{- else -}}
[]
{{- end -}}
{{- end }}

{{/* kata-sandbox-device-plugin.active: "true" when one of its roles exists under global.sandboxWorkloads; else nothing renders */}}
{{- define "kata-sandbox-device-plugin.active" -}}
{{- include "gpu-stack-lib.active" (dict "ctx" . "roles" (include "kata-sandbox-device-plugin.roles" . | fromJsonArray)) -}}
{{- end }}
