{{/*
Well-known host volumes. A pod only names the volumes its containers mount; gpu-stack-lib.podTemplate adds the
definition of every well-known volume a container mounts, so no operand repeats these blocks and the host paths
come from global.hostPaths in one place.
*/}}
{{- define "gpu-stack-lib.hostVolumes" -}}
{{- $hp := .Values.global.hostPaths -}}
{{- $kubelet := include "gpu-stack-lib.kubeletRootDir" . -}}
run-nvidia-validations: {path: {{ $hp.validationsDir | quote }}, type: DirectoryOrCreate}
run-nvidia: {path: /run/nvidia, type: DirectoryOrCreate}
driver-install-dir: {path: {{ $hp.driverInstallDir | quote }}, type: DirectoryOrCreate}
host-root: {path: {{ $hp.rootFS | quote }}}
host-sys: {path: /sys, type: Directory}
host-dev-char: {path: {{ printf "%s/dev/char" (trimSuffix "/" $hp.rootFS) | quote }}}
host-os-release: {path: /etc/os-release}
lib-modules: {path: /lib/modules}
var-log: {path: /var/log}
dev-log: {path: /dev/log}
{{- /* the kubelet serves device plugins at this path whatever its root directory (the device plugin API's
DevicePluginPath; Kubernetes documents it as hard-coded): under a k0s or microk8s root no plugin could register */}}
device-plugins: {path: /var/lib/kubelet/device-plugins}
pod-resources: {path: {{ printf "%s/pod-resources" $kubelet | quote }}}
kubelet-plugins: {path: {{ printf "%s/plugins" $kubelet | quote }}, type: DirectoryOrCreate}
kubelet-plugins-registry: {path: {{ printf "%s/plugins_registry" $kubelet | quote }}, type: DirectoryOrCreate}
cdi-root: {path: /var/run/cdi, type: DirectoryOrCreate}
dev-vfio: {path: /dev/vfio}
run-nvidia-mps: {path: /run/nvidia/mps, type: DirectoryOrCreate}
run-nvidia-toolkit: {path: /run/nvidia/toolkit, type: DirectoryOrCreate}
toolkit-install-dir: {path: {{ $hp.toolkitInstallDir | quote }}, type: DirectoryOrCreate}
nfd-features-d: {path: /etc/kubernetes/node-feature-discovery/features.d, type: DirectoryOrCreate}
{{- end }}

{{/*
gpu-stack-lib.apiAccessMount: the mount of the pod's service-account token, CA and namespace at the standard path
(client-go's in-cluster config reads them there), for the containers of a pod that must not hand its token to every
container: a pod whose third-party container runs next to our own with the pod's service account (driver, vGPU
manager, VFIO manager). gpu-stack-lib.volumes adds the volume (gpu-stack-lib.apiAccessVolume) and
gpu-stack-lib.podTemplate sets automountServiceAccountToken: false on any pod a container of which mounts it, so
only the containers that mount it get the token.
*/}}
{{- define "gpu-stack-lib.apiAccessMount" -}}
{{- toJson (dict "name" "kube-api-access" "mountPath" "/var/run/secrets/kubernetes.io/serviceaccount" "readOnly" true) -}}
{{- end }}

{{/*
gpu-stack-lib.apiAccessVolume: the projected volume gpu-stack-lib.apiAccessMount mounts: what the kubelet projects
for an automounted token (a token bound to the pod, so it carries the pod's node name, which the admission policy
checks; the cluster CA; the namespace).
*/}}
{{- define "gpu-stack-lib.apiAccessVolume" -}}
{{- toJson (dict "name" "kube-api-access" "projected" (dict
  "defaultMode" 420
  "sources" (list
    (dict "serviceAccountToken" (dict "path" "token" "expirationSeconds" 3607))
    (dict "configMap" (dict "name" "kube-root-ca.crt" "items" (list (dict "key" "ca.crt" "path" "ca.crt"))))
    (dict "downwardAPI" (dict "items" (list (dict "path" "namespace" "fieldRef" (dict "apiVersion" "v1" "fieldPath" "metadata.namespace")))))))) -}}
{{- end }}

{{/* gpu-stack-lib.volumes: the pod's own volumes, the well-known host volumes its containers mount, the API access
volume when a container mounts it (gpu-stack-lib.apiAccessMount), and extraVolumes, set as .out.list */}}
{{- define "gpu-stack-lib.volumes" -}}
{{- $known := include "gpu-stack-lib.hostVolumes" .ctx | fromYaml -}}
{{- $volumes := .volumes | default list -}}
{{- $declared := list -}}
{{- range $volumes }}{{ $declared = append $declared .name }}{{ end -}}
{{- $used := list -}}
{{- range concat .containers (.initContainers | default list) -}}
{{- range .volumeMounts | default list }}{{ $used = append $used .name }}{{ end -}}
{{- end -}}
{{- range $name := $used | uniq | sortAlpha -}}
{{- if and (hasKey $known $name) (not (has $name $declared)) -}}
{{- $volumes = append $volumes (dict "name" $name "hostPath" (get $known $name)) -}}
{{- end -}}
{{- end -}}
{{- if and (has "kube-api-access" $used) (not (has "kube-api-access" $declared)) -}}
{{- $volumes = append $volumes (include "gpu-stack-lib.apiAccessVolume" . | fromJson) -}}
{{- end -}}
{{- $_ := set .out "list" (concat $volumes (.ctx.Values.extraVolumes | default list)) -}}
{{- end }}

{{/*
gpu-stack-lib.kubeletRootDir: global.hostPaths.kubeletRootDir, or where empty the kubelet root of global.platform
(microk8s and k0s move it; every other platform keeps /var/lib/kubelet). Call with the chart's context.
*/}}
{{- define "gpu-stack-lib.kubeletRootDir" -}}
{{- $defaults := dict "microk8s" "/var/snap/microk8s/common/var/lib/kubelet" "k0s" "/var/lib/k0s/kubelet" -}}
{{- $g := .Values.global -}}
{{- $g.hostPaths.kubeletRootDir | default (get $defaults ($g.platform | default "generic")) | default "/var/lib/kubelet" | trimSuffix "/" -}}
{{- end }}
