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

{{/*
cc-manager.switches: per node role, as a JSON object, the gpu.deploy.* switches (suffixes) of the sandbox operands
that run there in kata mode and that k8s-cc-manager v0.4.3 pauses around a CC mode change (gpu_operator_eviction.py
COMPONENT_LABELS). It pauses only a switch that has a value, and this chart runs an operand where its switch is
absent, so the CC manager's init containers seed them (true) first: else a mode change runs under those operands.
*/}}
{{- define "cc-manager.switches" -}}
{"vm-passthrough": ["vfio-manager", "sandbox-validator"], "vm-vgpu": ["vgpu-manager", "vgpu-device-manager", "sandbox-validator", "sandbox-device-plugin"]}
{{- end }}
