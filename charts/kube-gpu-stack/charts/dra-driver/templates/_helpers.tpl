{{/* dra-driver.featureGates: featureGates as the binaries' --feature-gates value (FEATURE_GATES), Name=bool sorted */}}
{{- define "dra-driver.featureGates" -}}
{{- $gates := list -}}
{{- range $name := keys .Values.featureGates | sortAlpha -}}
{{- $gates = append $gates (printf "%s=%t" $name (get $.Values.featureGates $name)) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end }}

{{/* dra-driver.image: the DRA driver image, for every component */}}
{{- define "dra-driver.image" -}}
{{- include "gpu-stack-lib.image" (dict "ctx" . "image" .Values.image) -}}
{{- end }}

{{/*
dra-driver.pluginEnv: environment both kubelet plugins share. NVIDIA_VISIBLE_DEVICES=void because the image
defaults to all and the plugins reach the driver through the driver root, not the runtime; the kubelet's plugin
directories follow global.hostPaths.kubeletRootDir (the plugins default to /var/lib/kubelet). The driver root
(NVIDIA_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH) comes from driver-ready, sourced before the plugin starts.
dict "ctx" . "metricsPort" PORT "healthcheckPort" PORT
*/}}
{{- define "dra-driver.pluginEnv" -}}
{{- $v := .ctx.Values -}}
{{- $kubelet := include "gpu-stack-lib.kubeletRootDir" .ctx -}}
NVIDIA_VISIBLE_DEVICES: void
NVIDIA_MIG_CONFIG_DEVICES: all
CDI_ROOT: /var/run/cdi
NODE_NAME: {fieldRef: {fieldPath: spec.nodeName}}
NAMESPACE: {fieldRef: {fieldPath: metadata.namespace}}
KUBELET_REGISTRAR_DIRECTORY_PATH: {{ printf "%s/plugins_registry" $kubelet }}
KUBELET_PLUGINS_DIRECTORY_PATH: {{ printf "%s/plugins" $kubelet }}
{{- if $v.metrics }}
HTTP_ENDPOINT: {{ printf ":%d" (int .metricsPort) | quote }}
METRICS_PATH: /metrics
{{- end }}
{{- if .healthcheckPort }}
HEALTHCHECK_PORT: {{ .healthcheckPort | toString | quote }}
{{- end }}
{{- with include "dra-driver.featureGates" .ctx }}
FEATURE_GATES: {{ . | quote }}
{{- end }}
{{- end }}

{{/* dra-driver.probes: the plugin's gRPC startup and liveness probes on its health port; dict "port" PORT "period" SECONDS */}}
{{- define "dra-driver.probes" -}}
{{- if .port }}
startupProbe:
  grpc: {port: {{ int .port }}, service: liveness}
  failureThreshold: 600
  periodSeconds: 1
  timeoutSeconds: 10
livenessProbe:
  grpc: {port: {{ int .port }}, service: liveness}
  failureThreshold: 3
  periodSeconds: {{ .period }}
  timeoutSeconds: 10
{{- end }}
{{- end }}

{{/*
dra-driver.pluginMounts: mounts both kubelet plugins share. The kubelet's plugin directories are mounted at their
host paths, because the plugins register their sockets with the kubelet by those paths; CDI specs go to the host's
/var/run/cdi; the driver root is at /driver-root (containerized driver) or /host (host driver), as driver-ready
says, read-only for both: v0.4.1 (commit 764900e) writes nothing under it (the GPU plugin runs nvidia-smi there through
chroot, which opens device nodes only, and reads the persistence daemon's socket). dict "ctx" .
*/}}
{{- define "dra-driver.pluginMounts" -}}
{{- $kubelet := include "gpu-stack-lib.kubeletRootDir" .ctx -}}
- {name: kubelet-plugins-registry, mountPath: {{ printf "%s/plugins_registry" $kubelet }}}
- {name: kubelet-plugins, mountPath: {{ printf "%s/plugins" $kubelet }}, mountPropagation: Bidirectional}
- {name: cdi-root, mountPath: /var/run/cdi}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations, readOnly: true, mountPropagation: HostToContainer}
- {name: driver-install-dir, mountPath: /driver-root, readOnly: true, mountPropagation: HostToContainer}
- {name: host-root, mountPath: /host, readOnly: true, mountPropagation: HostToContainer}
{{- end }}
