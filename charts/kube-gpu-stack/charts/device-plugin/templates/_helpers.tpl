{{/*
device-plugin.gpuDirectExports: the plugin's GDS_ENABLED, GDRCOPY_ENABLED and MOFED_ENABLED (k8s-device-plugin
v0.20.0 reads them: /dev/nvidia-fs*, /dev/gdrdrv and /dev/infiniband for every GPU container) from this node's
driver settings: the driver pod's startup probe writes its driver.gds/gdrcopy/rdma.enabled to .driver-ctr-ready,
so each driver pool's own settings apply on its nodes. MOFED_ENABLED follows GDS alone, as the GPU Operator sets it
(with nvidia_fs loaded): GPUDirect RDMA alone must not hand every /dev/infiniband node to every GPU container past
the RDMA device plugin's accounting. The file is read, not sourced: a GPU Operator driver (a takeover) writes it as
`KEY: value` lines, this chart's as KEY=VALUE; only the three switches are taken, each only when "true". Never on by
default: a node without the file (host driver) gets all three off.
*/}}
{{- define "device-plugin.gpuDirectExports" -}}
GDS_ENABLED=false; GDRCOPY_ENABLED=false; GPU_DIRECT_RDMA_ENABLED=false; if [ -f /run/nvidia/validations/.driver-ctr-ready ]; then while IFS= read -r l || [ -n "$l" ]; do l=${l#export }; for v in =true "=\"true\"" "='true'" ": true" ": \"true\"" ": 'true'"; do [ "$l" = "GDS_ENABLED$v" ] && GDS_ENABLED=true; [ "$l" = "GDRCOPY_ENABLED$v" ] && GDRCOPY_ENABLED=true; [ "$l" = "GPU_DIRECT_RDMA_ENABLED$v" ] && GPU_DIRECT_RDMA_ENABLED=true; done; done < /run/nvidia/validations/.driver-ctr-ready; fi; MOFED_ENABLED=$GDS_ENABLED; {{ "" }}
{{- end }}

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
CDI_ANNOTATION_PREFIX: {{ include "gpu-stack-lib.cdiAnnotationPrefix" . }}
NVIDIA_CDI_HOOK_PATH: {{ include "gpu-stack-lib.cdiHookPath" . }}
{{- end }}
{{- /* global.health: the plugin's Xid check is a deny list (internal/rm/health.go at v0.20.0): DISABLE adds to
the Xids it ignores, ENABLE takes Xids back out of that list (even its six built-in ones). "all" disables it. */ -}}
{{- with (.Values.global.health | default dict) }}
{{- if not (dig "devicePlugin" "healthChecks" true .) }}
DP_DISABLE_HEALTHCHECKS: all
{{- else }}
{{- with dig "xids" "application" list . }}
DP_DISABLE_HEALTHCHECKS: {{ join "," . | quote }}
{{- end }}
{{- with dig "xids" "fatal" list . }}
DP_ENABLE_HEALTHCHECKS: {{ join "," . | quote }}
{{- end }}
{{- end }}
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
{{- /* the start scripts only read driver-ready and .driver-ctr-ready there */}}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations, readOnly: true}
- {name: run-nvidia-mps, mountPath: /mps}
- {name: mps-shm, mountPath: /dev/shm}
{{- if .Values.config.name }}
- {name: config, mountPath: /config}
{{- end }}
{{- end }}
