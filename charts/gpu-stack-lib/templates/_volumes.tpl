{{/*
Well-known host volumes. A pod only names the volumes its containers mount; gpu-stack-lib.daemonset adds the
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
device-plugins: {path: {{ printf "%s/device-plugins" $kubelet | quote }}}
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

{{/* gpu-stack-lib.volumes: the pod's own volumes, the well-known host volumes its containers mount, and extraVolumes */}}
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
{{- toYaml (concat $volumes (.ctx.Values.extraVolumes | default list)) -}}
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
