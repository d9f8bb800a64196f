{{/* driver.checks: value combinations the driver cannot run with, refused at render */}}
{{- define "driver.checks" -}}
{{- if and .Values.gds.enabled (eq .Values.kernelModuleType "proprietary") -}}
{{- fail "driver.gds.enabled: nvidia-fs (GPUDirect Storage) 2.17.5 and later builds only against the open kernel modules; set driver.kernelModuleType to open or auto" -}}
{{- end -}}
{{- if .Values.updateStrategy -}}
{{- fail "driver.updateStrategy is not used by the driver DaemonSets: set driver.upgradePolicy.autoUpgrade and driver.upgradePolicy.maxUnavailable" -}}
{{- end -}}
{{- end }}

{{/*
driver.checkMaxUnavailable: a maxUnavailable the driver DaemonSets' rolling update cannot run with fails the render,
naming the key, rather than reaching the API server or the upgrade plan: a whole number of nodes of at least 1 (the
driver DaemonSets do not surge, so 0 never starts), or a percentage from 1% to 100%. A pool's upgradePolicy is not
checked by the schema. dict "value" VALUE "key" KEY
*/}}
{{- define "driver.checkMaxUnavailable" -}}
{{- $v := .value -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $number := or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $ok := or (and $number (ge (float64 $v) 1.0) (eq (float64 $v) (float64 (int64 $v)))) (and (kindIs "string" $v) (regexMatch "^(100|[1-9][0-9]?)%$" $v)) -}}
{{- if not $ok -}}
{{- fail (printf "%s.upgradePolicy.maxUnavailable %v: want a number of nodes of at least 1, or a percentage from 1%% to 100%% such as \"25%%\"" .key (toJson $v)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* driver.kernelModuleType: the module type to install; nvidia-fs needs the open modules, so auto is open with GDS */}}
{{- define "driver.kernelModuleType" -}}
{{- if and .Values.gds.enabled (eq .Values.kernelModuleType "auto") }}open{{ else }}{{ .Values.kernelModuleType }}{{ end -}}
{{- end }}

{{/*
driver.updateStrategy: always OnDelete. The DaemonSet controller would stop an old driver pod before its node is
emptied; the old pod's upgrade gate empties the node and then evicts its own pod, paced by the pool's canary and
slots (upgradePolicy.maxUnavailable), or, with autoUpgrade=false, once the admin requests it
*/}}
{{- define "driver.updateStrategy" -}}
{{- toYaml (dict "type" "OnDelete") -}}
{{- end }}

{{/* driver.image: the driver image reference for one OS; dict "ctx" . "os" OSINFO ["image" IMAGE] */}}
{{- define "driver.image" -}}
{{- include "gpu-stack-lib.osImage" (dict "ctx" .ctx "image" (.image | default .ctx.Values.image) "os" .os) -}}
{{- end }}

{{/*
driver.poolChecks: what one container pool's values cannot run with, refused before its DaemonSets are built
(gpu-stack-lib.poolVariants' check): its maxUnavailable, precompiled drivers without kernels or with what they
cannot carry, the Driver Toolkit with precompiled drivers, and driver.checks. dict "values" POOL_VALUES "key" POOL_KEY
*/}}
{{- define "driver.poolChecks" -}}
{{- $v := .values -}}
{{- $key := .key -}}
{{- include "driver.checkMaxUnavailable" (dict "value" ($v.upgradePolicy | default dict).maxUnavailable "key" $key) -}}
{{- if $v.usePrecompiled -}}
{{- if not $v.kernels }}{{ fail (printf "%s.kernels: usePrecompiled needs the kernels of the pool's nodes (their feature.node.kubernetes.io/kernel-version.full), one DaemonSet each" $key) }}{{ end -}}
{{- if $v.image.digest }}{{ fail (printf "%s.image.digest: a digest pins one image, but precompiled drivers use one image per kernel and OS; set image.tag to the driver branch instead" $key) }}{{ end -}}
{{- /* the nvidia-fs and gdrdrv sidecars build against the driver sources a precompiled image does not have (they would wait forever); the GPU Operator refuses the same */ -}}
{{- range $feature := list "gds" "gdrcopy" -}}
{{- if (get $v $feature).enabled }}{{ fail (printf "%s.%s.enabled=true with %s.usePrecompiled=true: precompiled driver images carry no driver sources to build the %s module against; set %s.usePrecompiled=false, or %s.%s.enabled=false" $key $feature $key (ternary "nvidia-fs (GPUDirect Storage)" "gdrdrv (GDRCopy)" (eq $feature "gds")) $key $key $feature) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- include "driver.checks" (dict "Values" $v) -}}
{{- if and ($v.driverToolkit | default dict).enabled $v.usePrecompiled }}{{ fail (printf "%s.driverToolkit.enabled=true with %s.usePrecompiled=true: precompiled drivers are built already; turn one off" $key $key) }}{{ end -}}
{{- end }}

{{/*
driver.variants: every driver DaemonSet the chart renders (gpu-stack-lib.poolVariants: one per container pool x OS
tag, x kernel with usePrecompiled, x RHCOS build with driverToolkit), as {"pools", "items"} in render order, each
item as poolVariants gives it, plus: "values" with the pod labels of its kind (nvidia.com/precompiled,
openshift.driver-toolkit), "dtkImage" (with the OpenShift Driver Toolkit: the RHCOS build's DTK image, else "") and
"digest" (DRIVER_CONFIG_DIGEST). The one source of these facts: daemonset.yaml renders the DaemonSets from it and
driver.hookPools hands it to the umbrella's hooks (DRIVER_POOLS), so the pre-upgrade plan compares the digests the
DaemonSets carry. Needs only .Values (the driver chart's, or the umbrella's .Values.driver).
*/}}
{{- define "driver.variants" -}}
{{- include "driver.checks" . -}}
{{- /* a pool without nodeSelector selects nvidia.com/driver.pool=<its name> */ -}}
{{- $all := include "gpu-stack-lib.poolVariants" (dict "values" .Values "key" "driver" "prefix" "nvidia-driver" "poolLabel" "nvidia.com/driver.pool" "check" "driver.poolChecks") | fromJson -}}
{{- $items := list -}}
{{- range $d := $all.items -}}
{{- $v := $d.values -}}
{{- $dtkImage := "" -}}
{{- if $d.kernel -}}
{{- $v = deepCopy $v -}}
{{- $_ := set $v "podLabels" (merge (dict "nvidia.com/precompiled" "true") (deepCopy ($v.podLabels | default dict))) -}}
{{- end -}}
{{- with $d.rhcosVersion -}}
{{- $dtk := $v.driverToolkit -}}
{{- $dtkImage = get ($dtk.images | default dict) . | default (printf "%s/%s:%s" $dtk.image.registry $dtk.image.repository .) -}}
{{- /* the GPU Operator's DTK driver pods carry this label */ -}}
{{- $v = deepCopy $v -}}
{{- $_ := set $v "podLabels" (merge (dict "openshift.driver-toolkit" "true") (deepCopy ($v.podLabels | default dict))) -}}
{{- end -}}
{{- $_ := set $d "values" $v -}}
{{- $_ = set $d "dtkImage" $dtkImage -}}
{{- $_ = set $d "digest" (include "driver.configDigest" (dict "ctx" (dict "Values" $v) "os" $d.os "imageOS" $d.imageOS "dtkImage" $dtkImage)) -}}
{{- $items = append $items $d -}}
{{- end -}}
{{- toJson (dict "pools" $all.pools "items" $items) -}}
{{- end }}

{{/*
driver.hookPools: the driver chart's contract with the umbrella's hooks, DRIVER_POOLS (gpu-stack-lib.driverPools over
driver.variants), as JSON. dict "Values" DRIVER_VALUES (the driver chart's .Values, or the umbrella's .Values.driver)
*/}}
{{- define "driver.hookPools" -}}
{{- $variants := include "driver.variants" . | fromJson -}}
{{- include "gpu-stack-lib.driverPools" (dict "values" .Values "pools" $variants.pools "variants" $variants.items) -}}
{{- end }}

{{/*
driver.configDigest: DRIVER_CONFIG_DIGEST of one OS's DaemonSet: a sha256 over only what changes the installed
driver (images without their registry, so moving to a mirror reinstalls nothing; module type; RDMA, GDS, GDRCopy;
the licensing, repository, certificate and module-parameter sources; the Driver Toolkit image). With an unchanged
digest the driver manager keeps the loaded driver and its workloads. dict "ctx" . "os" OSINFO ["imageOS" OSINFO: the
tag suffix of the driver image, <kernel>-<os tag> for precompiled drivers] ["dtkImage" REF]
*/}}
{{- define "driver.configDigest" -}}
{{- $v := .ctx.Values -}}
{{- /* switches that are off contribute nothing, so toggling their unused sub-keys reinstalls nothing */ -}}
{{- $fields := dict
  "image" (include "gpu-stack-lib.osImageID" (dict "image" $v.image "os" (.imageOS | default .os)))
  "kernelModuleType" (include "driver.kernelModuleType" .ctx)
  "rdma" ($v.rdma.enabled | ternary $v.rdma (dict "enabled" false))
  "gds" (dict "enabled" $v.gds.enabled "image" ($v.gds.enabled | ternary (include "gpu-stack-lib.osImageID" (dict "image" $v.gds.image "os" .os)) ""))
  "gdrcopy" (dict "enabled" $v.gdrcopy.enabled "image" ($v.gdrcopy.enabled | ternary (include "gpu-stack-lib.osImageID" (dict "image" $v.gdrcopy.image "os" .os)) ""))
  "licensingConfig" (ternary $v.licensingConfig (dict) (not (empty (or $v.licensingConfig.secretName $v.licensingConfig.configMapName))))
  "repoConfig" $v.repoConfig.configMapName
  "certConfig" $v.certConfig.name
  "kernelModuleConfig" $v.kernelModuleConfig.name
-}}
{{- /* the DTK image is the kernel the driver is built for; only DTK DaemonSets carry the field, so others keep their digest */ -}}
{{- with .dtkImage }}{{ $_ := set $fields "driverToolkit" (regexReplaceAll "^[^/]+/" . "") }}{{ end -}}
{{- toJson $fields | sha256sum -}}
{{- end }}

{{/* driver.mofedUsrSrc: the host directory with the MOFED sources (ofa_kernel) nvidia-peermem is built against */}}
{{- define "driver.mofedUsrSrc" -}}
{{- if and .Values.rdma.enabled .Values.rdma.useHostMofed }}/usr/src{{ else }}/run/mellanox/drivers/usr/src{{ end -}}
{{- end }}

{{/* driver.managerEnv: the driver manager's switches from driver.manager (timeouts as Go durations), the pool's allocation mode and the DRA plugin it pauses */}}
{{- define "driver.managerEnv" -}}
{{- $m := .Values.manager -}}
ENABLE_GPU_POD_EVICTION: {{ $m.gpuPodDeletion.enabled | quote }}
EVICTION_USE_FORCE: {{ $m.gpuPodDeletion.force | quote }}
EVICTION_TIMEOUT_SECONDS: {{ printf "%ds" (int $m.gpuPodDeletion.timeoutSeconds) | quote }}
EVICTION_DELETE_EMPTYDIR_DATA: {{ $m.gpuPodDeletion.deleteEmptyDir | quote }}
ENABLE_AUTO_DRAIN: {{ $m.drain.enabled | quote }}
DRAIN_USE_FORCE: {{ $m.drain.force | quote }}
DRAIN_POD_SELECTOR_LABEL: {{ $m.drain.podSelector | quote }}
DRAIN_TIMEOUT_SECONDS: {{ printf "%ds" (int $m.drain.timeoutSeconds) | quote }}
DRAIN_DELETE_EMPTYDIR_DATA: {{ $m.drain.deleteEmptyDir | quote }}
{{- if .Values.rdma.enabled }}
GPU_DIRECT_RDMA_ENABLED: "true"
USE_HOST_MOFED: {{ .Values.rdma.useHostMofed | quote }}
{{- end }}
{{- /* the pool's allocation mode, which the manager labels the node with (nvidia.com/gpu.allocation) */}}
GPU_ALLOCATION: {{ .Values.gpuAllocation | default "device-plugin" }}
{{- /* where the DRA kubelet plugin runs (a DRA node, or one leaving DRA), the manager pauses it last, once no pod
holds a claim: on every pool, so a pool moving off DRA still pauses it */}}
DRA_PLUGIN_OPERAND: dra-driver
{{- /* a driver change marks its node for remediation controllers (global.health.maintenance) */}}
{{- $h := .Values.global.health | default dict -}}
{{- $mt := $h.maintenance | default dict -}}
{{- if include "driver.maintenanceCondition" . }}
HEALTH_CONDITION_TYPE: {{ $h.nodeCondition.type | quote }}
{{- end }}
{{- with $mt.label }}
MAINTENANCE_LABEL: {{ . | quote }}
{{- end }}
{{- end }}

{{/* driver.maintenanceCondition: non-empty when the driver manager writes the GPU health condition's Maintenance */}}
{{- define "driver.maintenanceCondition" -}}
{{- $h := .Values.global.health | default dict -}}
{{- if and ($h.nodeCondition | default dict).enabled ($h.maintenance | default dict).condition }}true{{ end -}}
{{- end }}

{{/*
driver.env: the driver container's environment (also what the startup probe writes to .driver-ctr-ready). Only what
nvidia-driver reads (tests/contracts): no NODE_NAME, NODE_IP or OPEN_KERNEL_MODULES_ENABLED (KERNEL_MODULE_TYPE
replaced it). DRIVER_CONFIG_DIGEST stays on every driver container, precompiled ones too, whose script ignores it:
the rollout plan and the driver pod's status read the digest from the driver container.
*/}}
{{- define "driver.env" -}}
{{- $v := .ctx.Values -}}
NVIDIA_VISIBLE_DEVICES: void
KERNEL_MODULE_TYPE: {{ include "driver.kernelModuleType" .ctx }}
GPU_DIRECT_RDMA_ENABLED: {{ $v.rdma.enabled | quote }}
{{- if $v.rdma.enabled }}
USE_HOST_MOFED: {{ $v.rdma.useHostMofed | quote }}
{{- end }}
GDS_ENABLED: {{ $v.gds.enabled | quote }}
GDRCOPY_ENABLED: {{ $v.gdrcopy.enabled | quote }}
DRIVER_CONFIG_DIGEST: {{ .digest }}
{{- end }}

{{/*
driver.configSources: volumes and driver-container mounts for the optional config sources (licensing, repository
files, CA certificates, module parameters, host subscription) of one OS, as {"volumes": [...], "mounts": [...]}.
Repository and CA directories depend on the OS family. dict "ctx" . "os" OSINFO
*/}}
{{- define "driver.configSources" -}}
{{- $v := .ctx.Values -}}
{{- $id := .os.id -}}
{{- $volumes := list -}}
{{- $mounts := list -}}
{{- $repoDirs := dict "ubuntu" "/etc/apt/sources.list.d" "debian" "/etc/apt/sources.list.d" "rhel" "/etc/yum.repos.d" "rocky" "/etc/yum.repos.d" "centos" "/etc/yum.repos.d" "ol" "/etc/yum.repos.d" "rhcos" "/etc/yum.repos.d" "sles" "/etc/zypp/repos.d" "sl-micro" "/etc/zypp/repos.d" -}}
{{- $certDirs := dict "ubuntu" "/usr/local/share/ca-certificates" "debian" "/usr/local/share/ca-certificates" "rhel" "/etc/pki/ca-trust/extracted/pem" "rocky" "/etc/pki/ca-trust/extracted/pem" "centos" "/etc/pki/ca-trust/extracted/pem" "ol" "/etc/pki/ca-trust/extracted/pem" "rhcos" "/etc/pki/ca-trust/extracted/pem" "sles" "/etc/pki/trust/anchors" "sl-micro" "/etc/pki/trust/anchors" -}}
{{- with $v.licensingConfig -}}
{{- if or .secretName .configMapName -}}
{{- $items := list (dict "key" "gridd.conf" "path" "gridd.conf") -}}
{{- $mounts = append $mounts (dict "name" "licensing-config" "mountPath" "/drivers/gridd.conf" "subPath" "gridd.conf" "readOnly" true) -}}
{{- if .nlsEnabled -}}
{{- $items = append $items (dict "key" "client_configuration_token.tok" "path" "client_configuration_token.tok") -}}
{{- $mounts = append $mounts (dict "name" "licensing-config" "mountPath" "/drivers/ClientConfigToken/client_configuration_token.tok" "subPath" "client_configuration_token.tok" "readOnly" true) -}}
{{- end -}}
{{- if .secretName -}}
{{- $volumes = append $volumes (dict "name" "licensing-config" "secret" (dict "secretName" .secretName "items" $items)) -}}
{{- else -}}
{{- $volumes = append $volumes (dict "name" "licensing-config" "configMap" (dict "name" .configMapName "items" $items)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $v.repoConfig.configMapName -}}
{{- $dir := get $repoDirs $id | required (printf "driver.repoConfig: no known repository directory for OS %q (known: %s)" $.os.tag (keys $repoDirs | sortAlpha | join ", ")) -}}
{{- $volumes = append $volumes (dict "name" "repo-config" "configMap" (dict "name" .)) -}}
{{- $mounts = append $mounts (dict "name" "repo-config" "mountPath" $dir "readOnly" true) -}}
{{- end -}}
{{- with $v.certConfig.name -}}
{{- /* one file per key, by subPath: a mount over the whole directory would hide the image's own CA bundle there */ -}}
{{- $dir := get $certDirs $id | required (printf "driver.certConfig: no known CA directory for OS %q (known: %s)" $.os.tag (keys $certDirs | sortAlpha | join ", ")) -}}
{{- $certKeys := $v.certConfig.keys | default list -}}
{{- if not $certKeys }}{{ fail (printf "driver.certConfig.keys: list the keys of ConfigMap %s (one PEM file each); each is mounted as a file in the OS's CA directory" .) }}{{ end -}}
{{- $items := list -}}
{{- range $certKeys -}}
{{- if or (contains "/" .) (hasPrefix "." .) }}{{ fail (printf "driver.certConfig.keys: %q is not a file name (it becomes %s/<key>)" . $dir) }}{{ end -}}
{{- $items = append $items (dict "key" . "path" .) -}}
{{- $mounts = append $mounts (dict "name" "cert-config" "mountPath" (printf "%s/%s" $dir .) "subPath" . "readOnly" true) -}}
{{- end -}}
{{- $volumes = append $volumes (dict "name" "cert-config" "configMap" (dict "name" . "items" $items)) -}}
{{- end -}}
{{- with $v.kernelModuleConfig.name -}}
{{- /* optional: a missing key leaves its file out (the driver reads only the files that exist) */ -}}
{{- $files := list "nvidia.conf" "nvidia-uvm.conf" "nvidia-modeset.conf" "nvidia-peermem.conf" -}}
{{- $items := list -}}
{{- range $files -}}
{{- $items = append $items (dict "key" . "path" .) -}}
{{- $mounts = append $mounts (dict "name" "kernel-module-config" "mountPath" (printf "/drivers/%s" .) "subPath" . "readOnly" true) -}}
{{- end -}}
{{- $volumes = append $volumes (dict "name" "kernel-module-config" "configMap" (dict "name" . "items" $items "optional" true)) -}}
{{- end -}}
{{- if $v.hostSubscription -}}
{{- $paths := dict -}}
{{- if and (eq $id "rhel") (not $v.repoConfig.configMapName) -}}
{{- $paths = dict
  "/run/secrets/etc-pki-entitlement" (dict "path" "/etc/pki/entitlement" "type" "Directory")
  "/run/secrets/redhat.repo" (dict "path" "/etc/yum.repos.d/redhat.repo" "type" "File")
  "/run/secrets/rhsm" (dict "path" "/etc/rhsm" "type" "Directory") -}}
{{- else if has $id (list "sles" "sl-micro") -}}
{{- $paths = dict
  "/etc/zypp/credentials.d" (dict "path" "/etc/zypp/credentials.d" "type" "Directory")
  "/etc/SUSEConnect" (dict "path" "/etc/SUSEConnect" "type" "FileOrCreate") -}}
{{- end -}}
{{- range $i, $mountPath := keys $paths | sortAlpha -}}
{{- $name := printf "subscription-config-%d" $i -}}
{{- $volumes = append $volumes (dict "name" $name "hostPath" (get $paths $mountPath)) -}}
{{- $mounts = append $mounts (dict "name" $name "mountPath" $mountPath "readOnly" true) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "volumes" $volumes "mounts" $mounts) -}}
{{- end }}

{{/*
driver.moduleSidecar: a sidecar that builds and loads an extra kernel module (nvidia-fs, gdrdrv) once the driver
container has installed the driver, and reports started once the module is loaded; an item of the pod's containers.
dict "name" NAME "image" REF "install" INSTALL_COMMAND "module" MODULE
*/}}
{{- define "driver.moduleSidecar" -}}
- name: {{ .name }}
  image: {{ .image | quote }}
  command:
  - sh
  - -c
  - until [ -d /run/nvidia/driver/usr/src ] && grep -q '^nvidia ' /proc/modules; do echo waiting for the NVIDIA driver; sleep 10; done; exec {{ .install }}
  env:
  - {name: NVIDIA_VISIBLE_DEVICES, value: void}
  securityContext:
    privileged: true
    seLinuxOptions:
      level: s0
  startupProbe:
    exec:
      command: [sh, -c, "grep -q '^{{ .module }} ' /proc/modules"]
    initialDelaySeconds: 10
    periodSeconds: 10
    timeoutSeconds: 10
    failureThreshold: 120
  volumeMounts:
  - {name: run-nvidia, mountPath: /run/nvidia, mountPropagation: HostToContainer}
  - {name: var-log, mountPath: /var/log}
  - {name: dev-log, mountPath: /dev/log, readOnly: true}
{{- end }}

{{/*
driver.openshift: what OpenShift adds to one driver DaemonSet, as {"env", "mounts", "volumes", "containers"} (empty
elsewhere). The cluster proxy (global.proxy) as the driver container's HTTP_PROXY, HTTPS_PROXY, NO_PROXY and their
lower-case forms, for the package downloads of its build. The cluster trust bundle (global.proxy.trustedCA) as
/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem, the file the GPU Operator mounts (key ca-bundle.crt of the
injected ConfigMap); one file, so the image's other bundles and driver.certConfig's files in that directory stay.
With the Driver Toolkit (a variant with an rhcosVersion): the emptyDir /mnt/shared-nvidia-driver-toolkit the driver
container fills with its installer and the side container openshift-driver-toolkit-ctr builds in, RHCOS_VERSION
in both (the GPU Operator's state-driver DaemonSet and its DTK transform). dict "ctx" POOL_CONTEXT "root" . "variant" VARIANT
*/}}
{{- define "driver.openshift" -}}
{{- $g := .root.Values.global | default dict -}}
{{- $proxy := $g.proxy | default dict -}}
{{- $d := .variant -}}
{{- $env := dict -}}
{{- $mounts := list -}}
{{- $volumes := list -}}
{{- $containers := list -}}
{{- range $name, $key := dict "HTTP_PROXY" "httpProxy" "HTTPS_PROXY" "httpsProxy" "NO_PROXY" "noProxy" -}}
{{- with get $proxy $key -}}
{{- $_ := set $env $name . -}}
{{- $_ := set $env (lower $name) . -}}
{{- end -}}
{{- end -}}
{{- if ($proxy.trustedCA | default dict).enabled -}}
{{- $mounts = append $mounts (dict "name" "trusted-ca" "mountPath" "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem" "subPath" "tls-ca-bundle.pem" "readOnly" true) -}}
{{- $volumes = append $volumes (dict "name" "trusted-ca" "configMap" (dict "name" $proxy.trustedCA.configMapName "items" (list (dict "key" "ca-bundle.crt" "path" "tls-ca-bundle.pem")))) -}}
{{- end -}}
{{- if $d.rhcosVersion -}}
{{- $shared := dict "name" "shared-nvidia-driver-toolkit" "mountPath" "/mnt/shared-nvidia-driver-toolkit" -}}
{{- $_ := set $env "RHCOS_VERSION" $d.rhcosVersion -}}
{{- $mounts = append $mounts $shared -}}
{{- $volumes = append $volumes (dict "name" "shared-nvidia-driver-toolkit" "emptyDir" dict) -}}
{{- /* waits for the driver container's dir_prepared, then builds with the DTK's kernel headers; the driver container loads the result */ -}}
{{- $containers = append $containers (include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" "openshift-driver-toolkit-ctr"
  "image" $d.dtkImage
  "command" (list "bash" "-xc")
  "args" (list "until [ -f /mnt/shared-nvidia-driver-toolkit/dir_prepared ]; do echo Waiting for nvidia-driver-ctr to prepare the shared directory; sleep 10; done; exec /mnt/shared-nvidia-driver-toolkit/ocp_dtk_entrypoint dtk-build-driver")
  "env" (dict "RHCOS_VERSION" $d.rhcosVersion "NVIDIA_VISIBLE_DEVICES" "void")
  "volumeMounts" (list
    $shared
    (dict "name" "var-log" "mountPath" "/var/log")
    (dict "name" "mlnx-ofed-usr-src" "mountPath" "/run/mellanox/drivers/usr/src" "mountPropagation" "HostToContainer")
    (dict "name" "host-os-release" "mountPath" "/host-etc/os-release" "readOnly" true))
  "securityContext" (dict "privileged" true "seLinuxOptions" (dict "level" "s0"))
) | fromYaml) -}}
{{- end -}}
{{- toJson (dict "env" $env "mounts" $mounts "volumes" $volumes "containers" $containers) -}}
{{- end }}

{{/*
driver.stopTimeoutSeconds: the driver pod's grace period, the pool's upgradePolicy.stopTimeoutSeconds, checked here
for a pool (the schema checks the top-level value only). dict "ctx" POOL_CONTEXT "key" VALUES_PATH_OF_THE_POOL
*/}}
{{- define "driver.stopTimeoutSeconds" -}}
{{- $t := .ctx.Values.upgradePolicy.stopTimeoutSeconds -}}
{{- if not (and (or (kindIs "int" $t) (kindIs "int64" $t) (kindIs "float64" $t)) (ge (float64 $t) 30.0) (eq (float64 $t) (float64 (int $t)))) -}}
{{- fail (printf "%s.upgradePolicy.stopTimeoutSeconds: %v is not a whole number of seconds of at least 30" .key $t) -}}
{{- end -}}
{{- int $t -}}
{{- end }}
