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

{{/*
vgpu-manager.hookPolicy: how the pre-upgrade plan paces one vGPU manager pool, as JSON (gpu-stack-lib.driverPools'
policy). The vGPU manager has no upgrade policy of its own: its DaemonSets' updateStrategy (the pool's, else
global.updateStrategy, as gpu-stack-lib.updateStrategy picks it) paces it, so the plan batches by that maxUnavailable
(left out when it is not a whole number of at least 1 or a percentage from 1% to 100%: the plan then counts 1) and
reads OnDelete as autoUpgrade false. canary and maxFailures are 0: its driver manager never evicts, so it could not
hand a waiting canary its turn. dict "values" POOL_VALUES
*/}}
{{- define "vgpu-manager.hookPolicy" -}}
{{- $v := .values -}}
{{- $strategy := $v.updateStrategy | default ($v.global | default dict).updateStrategy | default dict -}}
{{- $out := dict "autoUpgrade" (ne ($strategy.type | default "RollingUpdate") "OnDelete") "canary" 0 "maxFailures" 0 -}}
{{- $m := ($strategy.rollingUpdate | default dict).maxUnavailable -}}
{{- $number := or (kindIs "float64" $m) (kindIs "int" $m) (kindIs "int64" $m) -}}
{{- if or (and $number (ge (float64 $m) 1.0) (eq (float64 $m) (float64 (int64 $m)))) (and (kindIs "string" $m) (regexMatch "^(100|[1-9][0-9]?)%$" $m)) -}}
{{- $_ := set $out "maxUnavailable" (ternary (int64 $m) $m $number) -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
vgpu-manager.variants: the vGPU manager's pools and DaemonSets (gpu-stack-lib.poolVariants), as JSON; a pool with no
nodeSelector selects the nodes labelled nvidia.com/vgpu-manager.pool=<its name>. dict "Values" VALUES
*/}}
{{- define "vgpu-manager.variants" -}}
{{- include "gpu-stack-lib.poolVariants" (dict "values" .Values "key" "vgpuManager" "prefix" "nvidia-vgpu-manager" "poolLabel" "nvidia.com/vgpu-manager.pool" "check" "vgpu-manager.checks") -}}
{{- end }}

{{/*
vgpu-manager.hookPools: the vGPU manager chart's contract with the umbrella's pre-upgrade hook, VGPU_MANAGER_POOLS:
its pools and DaemonSets in DRIVER_POOLS' shape (gpu-stack-lib.driverPools over the same gpu-stack-lib.poolVariants
daemonset.yaml renders from, each DaemonSet with the DRIVER_CONFIG_DIGEST its pods carry, paced by
vgpu-manager.hookPolicy), as JSON; [] when the vm-vgpu role does not exist (nothing renders). dict "Values"
VGPU_MANAGER_VALUES (the chart's .Values, or the umbrella's .Values.vgpuManager with "global" set)
*/}}
{{- define "vgpu-manager.hookPools" -}}
{{- if include "vgpu-manager.active" . -}}
{{- $all := include "vgpu-manager.variants" . | fromJson -}}
{{- $items := list -}}
{{- range $d := $all.items -}}
{{- $_ := set $d "digest" (include "vgpu-manager.configDigest" (dict "ctx" (dict "Values" $d.values) "os" $d.os)) -}}
{{- $items = append $items $d -}}
{{- end -}}
{{- include "gpu-stack-lib.driverPools" (dict "values" .Values "pools" $all.pools "variants" $items "policy" "vgpu-manager.hookPolicy") -}}
{{- else -}}
[]
{{- end -}}
{{- end }}
