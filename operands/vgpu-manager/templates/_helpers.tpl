{{/*
vgpu-manager.active: "true" when the vm-vgpu role exists (global.sandboxWorkloads.enabled); nothing renders
otherwise, so the licensed image is only required where it is used.
*/}}
{{- define "vgpu-manager.active" -}}
{{- if (include "gpu-stack-lib.activeRoles" (dict "ctx" . "roles" (list "vm-vgpu")) | fromJson).roles }}true{{ end -}}
{{- end }}

{{/*
vgpu-manager.checks: the licensed image has no default; say which keys to set. dict "values" VALUES "key" KEY
(vgpuManager for the top-level values, vgpuManager.pools[NAME] for a pool's)
*/}}
{{- define "vgpu-manager.checks" -}}
{{- if not .values.image.repository -}}
{{- fail (printf "%s.image.repository is required: the vGPU manager image is licensed and has no default; set %s.image.registry, .repository and .tag to your copy (or set vgpuManager.enabled=false)" .key .key) -}}
{{- end -}}
{{- if not (or .values.image.tag .values.image.digest) -}}
{{- fail (printf "%s.image.tag is required: the vGPU manager version (the chart appends -<os tag>), or pin %s.image.digest" .key .key) -}}
{{- end -}}
{{- end }}

{{/*
vgpu-manager.configDigest: DRIVER_CONFIG_DIGEST of one OS's DaemonSet, over what changes the installed vGPU
manager only (its image, without the registry); with an unchanged digest the driver manager keeps it loaded.
dict "ctx" . "os" OSINFO
*/}}
{{- define "vgpu-manager.configDigest" -}}
{{- toJson (dict "image" (include "gpu-stack-lib.osImageID" (dict "image" .ctx.Values.image "os" .os))) | sha256sum -}}
{{- end }}
