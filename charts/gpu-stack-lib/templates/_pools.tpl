{{/*
Driver pools (driver.pools, and the same shape for vGPU manager pools): each pool selects nodes with a Kubernetes
label selector and overrides some of the operand's values; the operand's top-level values are the default pool,
which takes every node no other pool selects. The helpers below merge a pool's values, resolve and check the pools
(with the selector algebra of _selectors.tpl) and keep generated object names within 63 characters.
*/}}

{{/*
gpu-stack-lib.poolValues: the operand's values for one pool, as JSON: the pool's overrides laid over the top-level
values, maps merged key by key (unset keys inherit), scalars and lists replaced - including false and "", unlike
mergeOverwrite. A key the top-level values do not have fails, naming it. dict "base" MAP "over" MAP "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.poolValues" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .over -}}
{{- $path := printf "%s.%s" $.key $k -}}
{{- if not (hasKey $out $k) }}{{ fail (printf "%s: unknown key (a pool overrides only keys the operand's top-level values have)" $path) }}{{ end -}}
{{- $b := get $out $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $b) -}}
{{- $_ := set $out $k (include "gpu-stack-lib.poolValues" (dict "base" $b "over" $v "key" $path) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{/*
gpu-stack-lib.objectName: a name kept within 63 characters (label values and DNS labels): a longer one is cut to
54 characters plus "-" and the first 8 hex digits of the full name's sha256, so it stays unique and stable.
*/}}
{{- define "gpu-stack-lib.objectName" -}}
{{- if le (len .) 63 -}}
{{- . -}}
{{- else -}}
{{- printf "%s-%s" (trunc 54 . | trimSuffix "-" | trimSuffix "-") (sha256sum . | trunc 8) -}}
{{- end -}}
{{- end }}

{{/*
gpu-stack-lib.pools: an operand's `pools` checked and resolved, the default pool (the top-level values) first, as
{"items": [...]} of {"name", "source", "requirements" (its selector as node selector requirements), "values" (the
pool's values: its overrides over the top-level ones; absent for the default pool), "exclude" (default pool only:
matchAny alternatives keeping it off every other pool's nodes)}. Fails on bad or duplicate names and on pools that
can overlap. dict "values" .Values "key" VALUES_KEY (e.g. driver.pools)
*/}}
{{- define "gpu-stack-lib.pools" -}}
{{- $items := list -}}
{{- $names := list "default" -}}
{{- $selectors := list -}}
{{- range $i, $p := .values.pools -}}
{{- $key := printf "%s[%d]" $.key $i -}}
{{- $name := toString ($p.name | default "") -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$" $name) -}}
{{- fail (printf "%s.name: %q is not a pool name: lower-case letters, digits and '-', at most 20 characters (it is part of the DaemonSet names)" $key $name) -}}
{{- end -}}
{{- $key = printf "%s[%s]" $.key $name -}}
{{- if has $name $names }}{{ fail (printf "%s: the name %q is taken (the default pool is named default; pool names must be unique)" $key $name) }}{{ end -}}
{{- $names = append $names $name -}}
{{- $reqs := (include "gpu-stack-lib.selectorRequirements" (dict "selector" $p.nodeSelector "key" (printf "%s.nodeSelector" $key)) | fromJson).items -}}
{{- $selectors = append $selectors $reqs -}}
{{- $over := omit $p "name" "nodeSelector" "source" -}}
{{- $values := include "gpu-stack-lib.poolValues" (dict "base" (omit $.values "pools") "over" $over "key" $key) | fromJson -}}
{{- $items = append $items (dict "name" $name "source" ($p.source | default "container") "requirements" $reqs "values" $values) -}}
{{- end -}}
{{- include "gpu-stack-lib.checkPoolOverlap" (dict "pools" $items "key" .key) -}}
{{- $default := dict "name" "default" "source" "container" "requirements" list "exclude" (include "gpu-stack-lib.excludeSelectors" (dict "selectors" $selectors) | fromJson).items -}}
{{- toJson (dict "items" (prepend $items $default)) -}}
{{- end }}

{{/*
gpu-stack-lib.poolDaemonSetName: the DaemonSet name of one pool's OS (and kernel) variant, within 63 characters
(gpu-stack-lib.objectName): <prefix>-daemonset-<parts> for the default pool (the GPU Operator's names), else
<prefix>-<pool>-<parts>. dict "prefix" PREFIX "pool" POOL_NAME "parts" (list OS_SUFFIX [KERNEL ...])
*/}}
{{- define "gpu-stack-lib.poolDaemonSetName" -}}
{{- $pool := ternary "daemonset" .pool (eq .pool "default") -}}
{{- include "gpu-stack-lib.objectName" (printf "%s-%s-%s" .prefix $pool (join "-" .parts)) -}}
{{- end }}

