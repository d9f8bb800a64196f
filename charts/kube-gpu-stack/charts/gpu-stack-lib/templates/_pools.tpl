{{/*
Driver pools (driver.pools, and the same shape for vGPU manager pools): each pool selects nodes with a Kubernetes
label selector and overrides some of the operand's values; the operand's top-level values are the default pool,
which takes every node no other pool selects. The helpers below merge a pool's values, resolve and check the pools
(with the selector algebra of _selectors.tpl) and keep generated object names within 63 characters.
*/}}

{{/*
gpu-stack-lib.poolValues: the operand's values for one pool, as JSON: the pool's overrides laid over the top-level
values, maps merged key by key (unset keys inherit), scalars and lists replaced - including false and "", unlike
mergeOverwrite. A key the top-level values do not have fails, naming it; a map the top-level values leave empty
({}, such as updateStrategy) has no keys to inherit or check, so the pool's map replaces it whole.
dict "base" MAP "over" MAP "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.poolValues" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .over -}}
{{- $path := printf "%s.%s" $.key $k -}}
{{- if not (hasKey $out $k) }}{{ fail (printf "%s: unknown key (a pool overrides only keys the operand's top-level values have)" $path) }}{{ end -}}
{{- $b := get $out $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $b) (not (empty $b)) -}}
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
can overlap. With poolLabel, a pool that gives no nodeSelector selects the nodes labelled <poolLabel>=<its name>:
exactly the requirement matchLabels {<poolLabel>: <name>} gives, so the overlap check and the default pool's
exclusion treat it as that selector. dict "values" .Values "key" VALUES_KEY (e.g. driver.pools) ["poolLabel" KEY]
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
{{- $sel := $p.nodeSelector -}}
{{- if $.poolLabel -}}
{{- if kindIs "invalid" $sel -}}
{{- $sel = dict "matchLabels" (dict $.poolLabel $name) -}}
{{- else if and (kindIs "map" $sel) (not $sel.matchLabels) (not $sel.matchExpressions) -}}
{{- fail (printf "%s.nodeSelector: an empty selector selects every GPU node; leave nodeSelector out to select the nodes labelled %s=%s, or select them with matchLabels or matchExpressions" $key $.poolLabel $name) -}}
{{- end -}}
{{- end -}}
{{- $reqs := (include "gpu-stack-lib.selectorRequirements" (dict "selector" $sel "key" (printf "%s.nodeSelector" $key)) | fromJson).items -}}
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

{{/*
gpu-stack-lib.poolVariants: every DaemonSet of a driver-class operand (driver, vGPU manager), one per container pool
x OS tag (x RHCOS build with driverToolkit.enabled on rhcos tags, x kernel with usePrecompiled), as {"pools": [...]
(gpu-stack-lib.pools' items), "items": [...]} in render order. Each item: {"pool", "key" (the pool's values key, for
errors), "values" (the pool's merged values), "os" (OSINFO), "imageOS" (OSINFO whose tag is the image's suffix:
<kernel>-<os tag> for precompiled drivers), "kernel", "rhcosVersion" ("" when not used), "name" (its DaemonSet's,
gpu-stack-lib.poolDaemonSetName), "match" (the OS, build and kernel requirements and the pool's selector), "matchAny"
(the default pool's exclusion of the other pools), "nodeSelectorTerms" (match ANDed with each matchAny alternative,
as gpu-stack-lib.nodeAffinity writes them)}. host and none pools have no variant. dict:
  values  the operand's .Values (the top-level values are the default pool; pools under .pools)
  key     the operand's values key (driver, vgpuManager): pools are <key>.pools, a pool's key <key>.pools[NAME]
  prefix  the DaemonSet name prefix (nvidia-driver)
  poolLabel  optional: the label a pool without nodeSelector selects on, with its name (gpu-stack-lib.pools)
  check   optional: a template called with dict "values" POOL_VALUES "key" POOL_KEY for each container pool, before
          its variants, to refuse values the operand cannot run with
*/}}
{{- define "gpu-stack-lib.poolVariants" -}}
{{- $names := list -}}
{{- $items := list -}}
{{- $pools := (include "gpu-stack-lib.pools" (dict "values" .values "key" (printf "%s.pools" .key) "poolLabel" .poolLabel) | fromJson).items -}}
{{- range $pool := $pools -}}
{{- if eq $pool.source "container" -}}
{{- $v := $pool.values | default $.values -}}
{{- $key := ternary $.key (printf "%s.pools[%s]" $.key $pool.name) (eq $pool.name "default") -}}
{{- with $.check }}{{ $_ := include . (dict "values" $v "key" $key) }}{{ end -}}
{{- $kernels := list "" -}}
{{- if $v.usePrecompiled }}{{ $kernels = $v.kernels }}{{ end -}}
{{- $dtk := $v.driverToolkit | default dict -}}
{{- $osList := (include "gpu-stack-lib.osList" (dict "tags" $v.os "key" (printf "%s.os" $key)) | fromJson).items -}}
{{- if $dtk.enabled -}}
{{- range $build := $dtk.rhcosVersions | default list -}}
{{- $found := false -}}
{{- range $osList }}{{ if and (eq .id "rhcos") (hasPrefix (printf "%s." (replace "." "" .version)) $build) }}{{ $found = true }}{{ end }}{{ end -}}
{{- if not $found }}{{ fail (printf "%s.driverToolkit.rhcosVersions: RHCOS build %s belongs to no rhcos OS tag of %s.os (build 418.94.x is rhcos4.18)" $.key $build $key) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- range $os := $osList -}}
{{- /* on RHCOS with the Driver Toolkit, one DaemonSet per RHCOS build of the OS tag (its DTK image has that build's kernel) */ -}}
{{- $builds := list "" -}}
{{- if and $dtk.enabled (eq $os.id "rhcos") -}}
{{- $builds = list -}}
{{- range $dtk.rhcosVersions | default list }}{{ if hasPrefix (printf "%s." (replace "." "" $os.version)) . }}{{ $builds = append $builds . }}{{ end }}{{ end -}}
{{- if not $builds }}{{ fail (printf "%s.os: %s with %s.driverToolkit.enabled needs the RHCOS builds of its nodes in %s.driverToolkit.rhcosVersions (their feature.node.kubernetes.io/system-os_release.OSTREE_VERSION, %s.<rhel>.<build>-<n>)" $key $os.tag $.key $.key (replace "." "" $os.version)) }}{{ end -}}
{{- end -}}
{{- range $build := $builds -}}
{{- range $kernel := $kernels -}}
{{- /* precompiled images are tagged <version>-<kernel>-<os tag> */ -}}
{{- $imageOS := $os -}}
{{- $match := concat $os.match $pool.requirements -}}
{{- $parts := list $os.suffix -}}
{{- if $kernel -}}
{{- $imageOS = merge (dict "tag" (printf "%s-%s" $kernel $os.tag)) $os -}}
{{- $match = append $match (dict "key" "feature.node.kubernetes.io/kernel-version.full" "operator" "In" "values" (list $kernel)) -}}
{{- $parts = append $parts (regexReplaceAll "[^a-z0-9]+" (lower $kernel) "-" | trimAll "-") -}}
{{- end -}}
{{- if $build -}}
{{- $match = append $match (dict "key" "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION" "operator" "In" "values" (list $build)) -}}
{{- $parts = append $parts (regexReplaceAll "[^a-z0-9]+" $build "-" | trimAll "-") -}}
{{- end -}}
{{- $name := include "gpu-stack-lib.poolDaemonSetName" (dict "prefix" $.prefix "pool" $pool.name "parts" $parts) -}}
{{- if has $name $names }}{{ fail (printf "%s: DaemonSet name %s is generated twice; rename the pool or drop the duplicate OS tag or kernel" $key $name) }}{{ end -}}
{{- $names = append $names $name -}}
{{- $terms := list -}}
{{- range $alt := $pool.exclude | default (list list) }}{{ $terms = append $terms (dict "matchExpressions" (concat $match $alt)) }}{{ end -}}
{{- $items = append $items (dict
  "pool" $pool.name
  "key" $key
  "values" $v
  "os" $os
  "imageOS" $imageOS
  "kernel" $kernel
  "rhcosVersion" $build
  "name" $name
  "match" $match
  "matchAny" $pool.exclude
  "nodeSelectorTerms" $terms) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "pools" $pools "items" $items) -}}
{{- end }}

{{/*
gpu-stack-lib.driverPools: the driver pools as the hooks read them (env DRIVER_POOLS: the post-install check and
the pre-upgrade plan), as a JSON list in pool order (the default pool first, then driver.pools as listed):
[{"name", "source" (container | host | none), "nodeSelectorTerms", "maxUnavailable", "autoUpgrade", "canary",
"maxFailures", "gpuAllocation", "daemonSets"}]. nodeSelectorTerms is the pool's own node selection exactly as its
driver DaemonSets use it, OR'ed terms, without the GPU, role, gpu.deploy.* and per-OS/kernel requirements the
DaemonSets add: a named pool's selector as one term; the default pool's exclusion of the other pools, one term per
alternative. The default pool alone selects every GPU node; as an empty term selects no node in the Kubernetes API,
that is written as the one term nvidia.com/gpu.present In [true]. maxUnavailable, autoUpgrade, canary,
maxFailures and hold (only when it names nodes) are the pool's upgradePolicy. daemonSets (container pools) are its driver DaemonSets, [{"name",
"nodeSelectorTerms", "digest"}]: each one's own node selection (gpu-stack-lib.poolVariants' nodeSelectorTerms) and
its DRIVER_CONFIG_DIGEST. Built from the same pools and variants the driver chart renders its DaemonSets from, so
the two cannot disagree. The vGPU manager's pools (VGPU_MANAGER_POOLS) take the same shape, with a policy of their
own. dict:
  values    the driver's values (the top-level ones: the default pool's)
  pools     gpu-stack-lib.poolVariants' pools
  variants  its items, each with its "digest" (driver.variants)
  policy    optional: a template called with dict "values" POOL_VALUES that gives a pool's maxUnavailable,
            autoUpgrade, canary, maxFailures (and gpuAllocation) as JSON, in place of the driver's upgradePolicy
*/}}
{{- define "gpu-stack-lib.driverPools" -}}
{{- $out := list -}}
{{- range $pool := .pools -}}
{{- $terms := list -}}
{{- if eq $pool.name "default" -}}
{{- range $pool.exclude }}{{ $terms = append $terms (dict "matchExpressions" .) }}{{ end -}}
{{- if not $terms }}{{ $terms = list (dict "matchExpressions" (list (dict "key" "nvidia.com/gpu.present" "operator" "In" "values" (list "true")))) }}{{ end -}}
{{- else -}}
{{- $terms = list (dict "matchExpressions" $pool.requirements) -}}
{{- end -}}
{{- $v := $pool.values | default $.values -}}
{{- $entry := dict "name" $pool.name "source" $pool.source "nodeSelectorTerms" $terms -}}
{{- $fields := dict -}}
{{- if $.policy -}}
{{- $fields = include $.policy (dict "values" $v) | fromJson -}}
{{- else -}}
{{- $policy := $v.upgradePolicy -}}
{{- $fields = dict "maxUnavailable" $policy.maxUnavailable "autoUpgrade" $policy.autoUpgrade "canary" $policy.canary "maxFailures" $policy.maxFailures "gpuAllocation" ($v.gpuAllocation | default "device-plugin") -}}
{{- with $policy.hold }}{{ $_ := set $fields "hold" . }}{{ end -}}
{{- if eq $policy.revert false }}{{ $_ := set $fields "revert" false }}{{ end -}}
{{- end -}}
{{- range $k, $x := $fields }}{{ $_ := set $entry $k $x }}{{ end -}}
{{- $dss := list -}}
{{- range $ds := $.variants -}}
{{- if eq $ds.pool $pool.name }}{{ $dss = append $dss (dict "name" $ds.name "nodeSelectorTerms" $ds.nodeSelectorTerms "digest" $ds.digest) }}{{ end -}}
{{- end -}}
{{- with $dss }}{{ $_ := set $entry "daemonSets" . }}{{ end -}}
{{- $out = append $out $entry -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}
