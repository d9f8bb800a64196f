{{/* device-plugin.env: environment of the plugin and the MPS control daemon */}}
{{- define "device-plugin.env" -}}
{{- $cdi := .Values.global.cdi.enabled -}}
PASS_DEVICE_SPECS: "true"
FAIL_ON_INIT_ERROR: "true"
DEVICE_ID_STRATEGY: uuid
DEVICE_LIST_STRATEGY: {{ $cdi | ternary "cdi-annotations,cdi-cri" "envvar" }}
MIG_STRATEGY: {{ .Values.global.mig.strategy }}
NVIDIA_MIG_MONITOR_DEVICES: all
MPS_ROOT: {{ .Values.mps.root }}
NODE_NAME: {fieldRef: {fieldPath: spec.nodeName}}
{{- if $cdi }}
CDI_ANNOTATION_PREFIX: cdi.k8s.io/
NVIDIA_CDI_HOOK_PATH: {{ include "gpu-stack-lib.cdiHookPath" . }}
{{- end }}
{{- if .Values.config.name }}
CONFIG_FILE: /config/config.yaml
DEFAULT_CONFIG: {{ .Values.config.default | quote }}
FALLBACK_STRATEGIES: empty
{{- end }}
{{- end }}

{{/* device-plugin.volumes: MPS shared memory, and the config manager's volumes when a config is named */}}
{{- define "device-plugin.volumes" -}}
- name: mps-shm
  hostPath:
    path: {{ printf "%s/shm" .Values.mps.root }}
    type: DirectoryOrCreate
{{- if .Values.config.name }}
{{ include "gpu-stack-lib.configManagerVolumes" . }}
{{- end }}
{{- end }}

{{/* device-plugin.mounts: mounts shared by the plugin and the MPS control daemon */}}
{{- define "device-plugin.mounts" -}}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations}
- {name: run-nvidia-mps, mountPath: /mps}
- {name: mps-shm, mountPath: /dev/shm}
{{- if .Values.config.name }}
- {name: config, mountPath: /config}
{{- end }}
{{- end }}
