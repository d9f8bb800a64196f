{{/* vgpu-device-manager.active: "true" when the vm-vgpu role exists under global.sandboxWorkloads; else nothing renders */}}
{{- define "vgpu-device-manager.active" -}}
{{- include "gpu-stack-lib.active" (dict "ctx" . "roles" (list "vm-vgpu")) -}}
{{- end }}

{{/* vgpu-device-manager.configMapName: the ConfigMap with config.yaml: the user's, else the one rendered from config.data */}}
{{- define "vgpu-device-manager.configMapName" -}}
{{- .Values.config.name | default "default-vgpu-devices-config" -}}
{{- end }}
