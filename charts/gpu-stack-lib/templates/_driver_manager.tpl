{{/*
Driver-class operands (driver, vgpu-manager, vfio-manager): the driver-manager init container they share, and the
per-OS fan-out of driver DaemonSets (one per OS tag, selected on NFD's os_release labels, never "the first node").
*/}}

{{/*
gpu-stack-lib.driverManagerContainer: the `driver-manager uninstall-driver` init container. Before the operand's
main container starts it stops what uses the GPUs on the node (as the caller's switches allow) and unloads the
loaded NVIDIA modules, keeping them when DRIVER_CONFIG_DIGEST matches the loaded driver's. dict:
  ctx           the operand chart's context
  image         optional image map (the operand's manager.image), resolved by gpu-stack-lib.driverManagerImage: its
                empty registry, repository and pullPolicy take global.stackImage's. A pinned tag there keeps
                chart-only releases from rolling driver pods. Without it: the project's image at the appVersion.
  env           the caller's switches, NAME -> value (ENABLE_GPU_POD_EVICTION, ENABLE_AUTO_DRAIN, DRAIN_*,
                DRIVER_CONFIG_DIGEST, ...); they win over the base env below
  volumeMounts  optional extra mounts (e.g. /run/mellanox/drivers to wait for MOFED)
It runs privileged as root: delete_module(2), umount2(2) and the sysfs writes need capabilities that the image's
user (65532) does not get, even in a privileged container. It mounts the pod's API token itself
(gpu-stack-lib.apiAccessMount): the pod does not automount it, so the operand's third-party container never holds
the driver manager's rights.
*/}}
{{- define "gpu-stack-lib.driverManagerContainer" -}}
{{- $image := include "gpu-stack-lib.driverManagerImage" . | fromJson -}}
{{- /* DRIVER_ROOT is where a containerized driver mounts its root: under /run/nvidia, which the driver images fix */ -}}
{{- /* POD_NAME names the holder of the node's driver-manager Lease */ -}}
{{- $env := dict
  "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
  "OPERATOR_NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))
  "POD_NAME" (dict "fieldRef" (dict "fieldPath" "metadata.name"))
  "HOST_ROOT" "/host"
  "DRIVER_ROOT" "/run/nvidia/driver"
  "NVIDIA_VISIBLE_DEVICES" "void"
-}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "driver-manager"
  "image" $image.ref
  "pullPolicy" $image.pullPolicy
  "command" (list "driver-manager" "uninstall-driver")
  "env" (mergeOverwrite $env (deepCopy (.env | default dict)))
  "volumeMounts" (concat (list
    (dict "name" "run-nvidia" "mountPath" "/run/nvidia" "mountPropagation" "Bidirectional")
    (dict "name" "host-root" "mountPath" "/host" "readOnly" true "mountPropagation" "HostToContainer")
    (dict "name" "host-sys" "mountPath" "/sys")
    (include "gpu-stack-lib.apiAccessMount" . | fromJson))
    (.volumeMounts | default list))
  "securityContext" (dict "privileged" true "runAsUser" 0)
) -}}
{{- end }}

{{/*
gpu-stack-lib.driverManagerImage: the driver manager's image as {"ref", "pullPolicy"}: the operand's manager.image,
its empty registry, repository and pullPolicy taken from global.stackImage, its tag pinned (without one: the
chart's appVersion); without an image, the project's image at the appVersion. The driver manager init container and
the driver-upgrade-gate sidecar of one pod run this same image. dict "ctx" . ["image" IMAGE]
*/}}
{{- define "gpu-stack-lib.driverManagerImage" -}}
{{- $stack := .ctx.Values.global.stackImage -}}
{{- $img := deepCopy (.image | default dict) -}}
{{- $ref := "" -}}
{{- if .image -}}
{{- $_ := set $img "registry" ($img.registry | default $stack.registry) -}}
{{- $_ = set $img "repository" ($img.repository | default $stack.repository) -}}
{{- $ref = include "gpu-stack-lib.image" (dict "ctx" .ctx "image" $img "defaultTag" .ctx.Chart.AppVersion) -}}
{{- else -}}
{{- $ref = include "gpu-stack-lib.stackImage" .ctx -}}
{{- end -}}
{{- toJson (dict "ref" $ref "pullPolicy" ($img.pullPolicy | default $stack.pullPolicy)) -}}
{{- end }}

{{/*
gpu-stack-lib.uncordonSidecar: the `driver-upgrade-gate` sidecar of a driver-class pod (driver, vGPU manager), as
{"container": CONTAINER, "volume": VOLUME} for the pod's containers and volumes. It runs `driver-manager
uncordon-when-valid --hold`: after a driver change (the node is validation-required) it waits for the node's
validator pod to turn Ready with the new driver, then lifts the driver manager's cordon and marks the node
upgrade-done; on an upgrade-failed node it waits, never Ready, until the node is retried; in any other state it has
nothing to wait for. Then it writes its ready file, which its readiness probe waits on: the pod, and with it the DaemonSet's rolling update, counts a node as available only once
it validated with the new driver, so no more than maxUnavailable nodes are ever in flight. It runs the driver
manager's image (gpu-stack-lib.driverManagerImage: pinned, so a chart-only release changes no pod template), with
the driver manager's RBAC (gpu-stack-lib.driverManagerRules: nodes get/patch, pods list/watch) and mounts the pod's
API token itself (gpu-stack-lib.apiAccessMount). dict:
  ctx                 the operand chart's context
  image               as gpu-stack-lib.driverManagerContainer (the operand's manager.image)
  validatorComponent  optional app.kubernetes.io/component of the node's validator pods (the binary's default is
                      operator-validator; the vGPU manager's nodes have sandbox-validator)
  timeoutSeconds      optional: how long it waits for the validator before marking the node upgrade-failed (the
                      binary's default is 600 s)
*/}}
{{- define "gpu-stack-lib.uncordonSidecar" -}}
{{- $image := include "gpu-stack-lib.driverManagerImage" . | fromJson -}}
{{- $dir := "/run/kube-gpu-stack" -}}
{{- $args := list "--hold" "--ready-file" (printf "%s/driver-validated" $dir) -}}
{{- with .validatorComponent }}{{ $args = concat $args (list "--validator-component" .) }}{{ end -}}
{{- with .timeoutSeconds }}{{ $args = concat $args (list "--timeout" (printf "%ds" (int .))) }}{{ end -}}
{{- $container := include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "driver-upgrade-gate"
  "image" $image.ref
  "pullPolicy" $image.pullPolicy
  "command" (list "driver-manager" "uncordon-when-valid")
  "args" $args
  "env" (dict
    "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
    "OPERATOR_NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace")))
  "volumeMounts" (list (dict "name" "driver-upgrade-gate" "mountPath" $dir) (include "gpu-stack-lib.apiAccessMount" . | fromJson))
  "securityContext" (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")))
  "spec" (dict
    "readinessProbe" (dict
      "exec" (dict "command" (list "validator" "wait" "--dir" $dir "--interval" "200ms" "--timeout" "2s" "driver-validated"))
      "periodSeconds" 10
      "timeoutSeconds" 5)
    "resources" (dict "requests" (dict "cpu" "5m" "memory" "32Mi") "limits" (dict "memory" "128Mi")))
) | fromYaml -}}
{{- toJson (dict "container" $container "volume" (dict "name" "driver-upgrade-gate" "emptyDir" (dict "sizeLimit" "1Mi"))) -}}
{{- end }}

{{/*
gpu-stack-lib.driverManagerRules: the ClusterRole rules of a pod running the driver manager, each what its code
calls and nothing more (tests/rbac_nodes_test.go runs it against the rendered rules): its node read, watched
(kwatch.Node) and patched (cordon, labels, annotations; never updated); operand and validator pods listed and
watched on the node; with `evict` (gpudrain): GPU pods evicted, PodDisruptionBudgets watched, DaemonSets read
(kubectl's drain checks a DaemonSet pod's owner) and DRA claims listed (gpupods). No pods delete:
gpudrain deletes only where the API server has no Eviction API, which every supported Kubernetes serves.
dict "evict" BOOL; renders a YAML list.
*/}}
{{- define "gpu-stack-lib.driverManagerRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
{{- if .evict }}
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaims]
  verbs: [list]
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.driverManagerLeaseRules: the Role rules (release namespace) of a pod running the driver manager: the
per-node Lease it holds while it runs (client-go's LeaseLock: get, create, update), nothing more.
*/}}
{{- define "gpu-stack-lib.driverManagerLeaseRules" -}}
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end }}

{{/*
gpu-stack-lib.osInfo: one OS tag (<ID><VERSION_ID> as NFD reports os_release, e.g. ubuntu22.04, rhel9) parsed into
{"tag", "id", "version", "suffix" (the tag without dots, for object names), "match" (node selector requirements
for gpu-stack-lib.daemonset's `match`)}, as JSON. Letters (and inner dashes) are the ID, the rest the version. A
version without a dot (rhel9, rocky9, ol9: the images drop the minor version) matches VERSION_ID.major, so every
9.x node takes it. dict "tag" TAG "key" VALUES_KEY (named in the error).
*/}}
{{- define "gpu-stack-lib.osInfo" -}}
{{- $tag := toString .tag -}}
{{- if not (regexMatch "^[a-z]+(-[a-z]+)*[0-9]+(\\.[0-9]+)*$" $tag) -}}
{{- fail (printf "%s: %q is not an OS tag: write <ID><VERSION_ID> as NFD's feature.node.kubernetes.io/system-os_release labels show them, e.g. ubuntu22.04, ubuntu24.04, rhel9" .key $tag) -}}
{{- end -}}
{{- $id := regexFind "^[a-z]+(-[a-z]+)*" $tag -}}
{{- $version := trimPrefix $id $tag -}}
{{- $prefix := "feature.node.kubernetes.io/system-os_release" -}}
{{- $versionKey := ternary (printf "%s.VERSION_ID" $prefix) (printf "%s.VERSION_ID.major" $prefix) (contains "." $version) -}}
{{- toJson (dict
  "tag" $tag
  "id" $id
  "version" $version
  "suffix" (replace "." "" $tag)
  "match" (list
    (dict "key" (printf "%s.ID" $prefix) "operator" "In" "values" (list $id))
    (dict "key" $versionKey "operator" "In" "values" (list $version)))
) -}}
{{- end }}

{{/*
gpu-stack-lib.osList: a list of OS tags parsed with gpu-stack-lib.osInfo, as {"items": [...]}. Fails on an empty
list and on two tags that would put two driver pods on one node (same tag, or rhel9 next to rhel9.4).
dict "tags" (list ...) "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.osList" -}}
{{- $key := .key -}}
{{- if not .tags }}{{ fail (printf "%s: list at least one OS tag of your GPU nodes (e.g. ubuntu22.04, ubuntu24.04, rhel9)" $key) }}{{ end -}}
{{- $items := list -}}
{{- range .tags -}}
{{- $os := include "gpu-stack-lib.osInfo" (dict "tag" . "key" $key) | fromJson -}}
{{- range $items -}}
{{- $oneMajorOnly := ne (contains "." .version) (contains "." $os.version) -}}
{{- if or (eq .suffix $os.suffix) (and (eq .id $os.id) $oneMajorOnly (eq (first (splitList "." .version)) (first (splitList "." $os.version)))) -}}
{{- fail (printf "%s: OS tags %q and %q select the same nodes; keep one" $key .tag $os.tag) -}}
{{- end -}}
{{- end -}}
{{- $items = append $items $os -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end }}

{{/*
gpu-stack-lib.osImage: an image whose tag gets the OS tag appended (<tag>-<os tag>, the NVIDIA driver image
scheme), resolved with gpu-stack-lib.image. A digest, when set, pins the image as given.
dict "ctx" . "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImage" -}}
{{- $img := deepCopy .image -}}
{{- with $img.tag }}{{ $_ := set $img "tag" (printf "%v-%s" . $.os.tag) }}{{ end -}}
{{- include "gpu-stack-lib.image" (dict "ctx" .ctx "image" $img) -}}
{{- end }}

{{/*
gpu-stack-lib.osImageID: repository[:<tag>-<os tag>][@digest] of an image, without its registry, for config digests:
moving to a mirror (global.imageRegistry) changes no digest. dict "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImageID" -}}
{{- $id := .image.repository -}}
{{- with .image.tag }}{{ $id = printf "%s:%v-%s" $id . $.os.tag }}{{ end -}}
{{- with .image.digest }}{{ $id = printf "%s@%s" $id . }}{{ end -}}
{{- $id -}}
{{- end }}

{{/*
Driver pools (driver.pools, and the same shape for vGPU manager pools): each pool selects nodes with a Kubernetes
label selector and overrides some of the operand's values; the operand's top-level values are the default pool,
which takes every node no other pool selects. The helpers below turn selectors into node selector requirements,
build the default pool's exclusion, refuse overlapping pools and keep generated object names within 63 characters.
*/}}

{{/*
gpu-stack-lib.selectorRequirements: a label selector {matchLabels, matchExpressions} as node selector requirements,
as {"items": [...]}: matchLabels k=v become `k In [v]` (sorted by key), then the expressions as written.
dict "selector" SELECTOR "key" VALUES_KEY (named in errors)
*/}}
{{- define "gpu-stack-lib.selectorRequirements" -}}
{{- $key := .key -}}
{{- $sel := .selector | default dict -}}
{{- $reqs := list -}}
{{- $labels := $sel.matchLabels | default dict -}}
{{- range $k := keys $labels | sortAlpha -}}
{{- $reqs = append $reqs (dict "key" $k "operator" "In" "values" (list (get $labels $k | toString))) -}}
{{- end -}}
{{- range $sel.matchExpressions | default list -}}
{{- $op := .operator | toString -}}
{{- if not .key }}{{ fail (printf "%s.matchExpressions: every expression needs a key" $key) }}{{ end -}}
{{- if has $op (list "In" "NotIn") -}}
{{- if not .values }}{{ fail (printf "%s.matchExpressions: %s %s needs values" $key .key $op) }}{{ end -}}
{{- $values := list -}}
{{- range .values }}{{ $values = append $values (toString .) }}{{ end -}}
{{- $reqs = append $reqs (dict "key" .key "operator" $op "values" $values) -}}
{{- else if has $op (list "Exists" "DoesNotExist") -}}
{{- if .values }}{{ fail (printf "%s.matchExpressions: %s %s takes no values" $key .key $op) }}{{ end -}}
{{- $reqs = append $reqs (dict "key" .key "operator" $op) -}}
{{- else if has $op (list "Gt" "Lt") -}}
{{- fail (printf "%s.matchExpressions: %s %s cannot be used in a pool selector: the default pool must exclude the pool's nodes, and %s has no exact negation for nodes without the label; use In, NotIn, Exists or DoesNotExist" $key .key $op $op) -}}
{{- else -}}
{{- fail (printf "%s.matchExpressions: %s: unknown operator %q (In, NotIn, Exists, DoesNotExist)" $key .key $op) -}}
{{- end -}}
{{- end -}}
{{- if not $reqs }}{{ fail (printf "%s: an empty selector selects every GPU node; select the pool's nodes with matchLabels or matchExpressions" $key) }}{{ end -}}
{{- toJson (dict "items" $reqs) -}}
{{- end }}

{{/*
gpu-stack-lib.excludeSelectors: "selected by none of these selectors" as alternatives for gpu-stack-lib.nodeAffinity's
matchAny, as {"items": [[REQUIREMENT...]...]} (empty without selectors). A node escapes a selector when one of
its requirements fails, so each alternative picks one negated requirement per selector (In<->NotIn,
Exists<->DoesNotExist): the product of the selectors' sizes; NotIn requirements on one key are merged. dict "selectors" (list (list REQUIREMENT ...) ...)
*/}}
{{- define "gpu-stack-lib.excludeSelectors" -}}
{{- $negate := dict "In" "NotIn" "NotIn" "In" "Exists" "DoesNotExist" "DoesNotExist" "Exists" -}}
{{- $alts := list -}}
{{- if .selectors }}{{ $alts = list list }}{{ end -}}
{{- range $reqs := .selectors -}}
{{- $next := list -}}
{{- range $alt := $alts -}}
{{- range $r := $reqs -}}
{{- $n := dict "key" $r.key "operator" (get $negate $r.operator) -}}
{{- with $r.values }}{{ $_ := set $n "values" . }}{{ end -}}
{{- /* NotIn on a key the alternative already excludes values of: one requirement with both value lists */ -}}
{{- $merged := list -}}
{{- range $alt -}}
{{- if and (eq .key $n.key) (eq .operator "NotIn") (eq $n.operator "NotIn") -}}
{{- $merged = append $merged (dict "key" .key "operator" "NotIn" "values" (concat .values $n.values | uniq)) -}}
{{- $n = dict -}}
{{- else -}}
{{- $merged = append $merged . -}}
{{- end -}}
{{- end -}}
{{- if $n }}{{ $merged = append $merged $n }}{{ end -}}
{{- $next = append $next $merged -}}
{{- end -}}
{{- end -}}
{{- $alts = $next -}}
{{- end -}}
{{- toJson (dict "items" $alts) -}}
{{- end }}

{{/*
gpu-stack-lib.requirementsDisjoint: "true" when no node can meet both requirements (same key: In sets without a
common value; Exists vs DoesNotExist; In vs DoesNotExist; In whose values NotIn all excludes). dict "a" REQ "b" REQ
*/}}
{{- define "gpu-stack-lib.requirementsDisjoint" -}}
{{- $a := .a -}}{{- $b := .b -}}
{{- if eq $a.key $b.key -}}
{{- $ops := list $a.operator $b.operator | sortAlpha | join "/" -}}
{{- if or (eq $ops "DoesNotExist/Exists") (eq $ops "DoesNotExist/In") -}}
true
{{- else if eq $ops "In/In" -}}
{{- $common := false -}}
{{- range $a.values }}{{ if has . $b.values }}{{ $common = true }}{{ end }}{{ end -}}
{{- if not $common }}true{{ end -}}
{{- else if eq $ops "In/NotIn" -}}
{{- $in := ternary $a $b (eq $a.operator "In") -}}
{{- $notIn := ternary $b $a (eq $a.operator "In") -}}
{{- $left := false -}}
{{- range $in.values }}{{ if not (has . $notIn.values) }}{{ $left = true }}{{ end }}{{ end -}}
{{- if not $left }}true{{ end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
gpu-stack-lib.checkPoolOverlap: fails when two pools' selectors can select the same node. Two pools are apart only
when some label key proves it (a requirement of one contradicts a requirement of the other, see
gpu-stack-lib.requirementsDisjoint); anything else could meet on a node carrying both pools' labels. Requirements
are compared pairwise, so a contradiction that needs two requirements of one pool together is not seen (the pools
are then reported as overlapping). dict "pools" (list (dict "name" NAME "requirements" (list REQ ...))) "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.checkPoolOverlap" -}}
{{- $key := .key -}}
{{- range $i, $p := .pools -}}
{{- range $j, $q := $.pools -}}
{{- if lt $i $j -}}
{{- $apart := false -}}
{{- $shared := list -}}
{{- range $a := $p.requirements -}}
{{- range $b := $q.requirements -}}
{{- if include "gpu-stack-lib.requirementsDisjoint" (dict "a" $a "b" $b) }}{{ $apart = true }}{{ end -}}
{{- if eq $a.key $b.key }}{{ $shared = append $shared $a.key }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if not $apart -}}
{{- if $shared -}}
{{- fail (printf "%s: pools %q and %q can select the same node: label %s does not separate them; give it values in one pool that the other excludes (e.g. In [a] and In [b])" $key $p.name $q.name (first (uniq $shared))) -}}
{{- else -}}
{{- fail (printf "%s: pools %q and %q can select the same node: they select on different labels, so a node carrying both pools' labels matches both; select both on one label, e.g. %s, with different values" $key $p.name $q.name (first $p.requirements).key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

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

{{/*
gpu-stack-lib.driverManagerRbac: the ServiceAccount of a pod running the driver manager (driver, vGPU manager, VFIO
manager), its ClusterRole (gpu-stack-lib.driverManagerRules) and its Role for the node Lease
(gpu-stack-lib.driverManagerLeaseRules); its pods run privileged with host access (the privileged SCC on OpenShift).
dict "ctx" . "name" SERVICE_ACCOUNT "evict" BOOL
*/}}
{{- define "gpu-stack-lib.driverManagerRbac" -}}
{{- include "gpu-stack-lib.rbac" (dict "ctx" .ctx "name" .name "scc" "privileged"
  "clusterRules" (include "gpu-stack-lib.driverManagerRules" (dict "evict" .evict) | fromYamlArray)
  "rules" (include "gpu-stack-lib.driverManagerLeaseRules" . | fromYamlArray)) -}}
{{- end }}
