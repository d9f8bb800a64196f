{{/*
gpu-stack-lib.validatorContainer: the project's validator running one check (`validator <component>`), as used by
the validator DaemonSets, the toolkit's driver validation and the node status exporter. It writes the check's
status file under the validations dir, which other operands wait on. dict:
  ctx        the operand chart's context
  name       container name
  component  validator subcommand (driver, toolkit, cuda, plugin, vfio-pci, vgpu-manager, vgpu-devices, cc-manager,
             metrics, ready)
  env        optional extra env map (e.g. WITH_WAIT)
  main       optional: true when it is the pod's main container
  spec       optional further container fields (ports, probes)
  preStopRemove  optional status files the container removes when it stops (`validator cleanup FILE...`), so a
             stopped validator never leaves a stale "ready" behind
  unrecorded optional: true for a copy of a check that another pod's validator also runs (the toolkit's driver
             validation): it writes the status file but leaves recording the outcome on the Node to the validator
             DaemonSet, so its pod needs no API access (no NODE_NAME)
  statusOnly optional: true for a component that only reads the status files (metrics): it mounts the validations
             dir read-only and nothing of the host, and runs unprivileged as the image's non-root user
A check runs privileged and as root: the image's user (65532) would get no effective capabilities, even privileged,
so it could neither write the validations dir, chroot nor create the /dev/char links. Only the driver check creates
those links: every other check mounts the host's /dev/char read-only.
*/}}
{{- define "gpu-stack-lib.validatorContainer" -}}
{{- $env := dict
  "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
  "OUTPUT_DIR" "/run/nvidia/validations"
  "HOST_ROOT" "/host"
  "DRIVER_INSTALL_DIR" "/run/nvidia/driver"
-}}
{{- if .unrecorded }}{{ $_ := unset $env "NODE_NAME" }}{{ end -}}
{{- $spec := deepCopy (.spec | default dict) -}}
{{- $mounts := list
  (dict "name" "run-nvidia-validations" "mountPath" "/run/nvidia/validations" "mountPropagation" "Bidirectional")
  (dict "name" "host-root" "mountPath" "/host" "readOnly" true "mountPropagation" "HostToContainer")
  (dict "name" "driver-install-dir" "mountPath" "/run/nvidia/driver" "readOnly" true "mountPropagation" "HostToContainer")
  (dict "name" "host-dev-char" "mountPath" "/host-dev-char") -}}
{{- if ne .component "driver" }}{{ $_ := set (last $mounts) "readOnly" true }}{{ end -}}
{{- $sc := dict "privileged" true "runAsUser" 0 "readOnlyRootFilesystem" true -}}
{{- if .statusOnly -}}
{{- $mounts = list (dict "name" "run-nvidia-validations" "mountPath" "/run/nvidia/validations" "readOnly" true "mountPropagation" "HostToContainer") -}}
{{- $sc = dict "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "runAsUser" 65532 "capabilities" (dict "drop" (list "ALL")) -}}
{{- end -}}
{{- with .preStopRemove }}{{ $_ := set $spec "lifecycle" (dict "preStop" (dict "exec" (dict "command" (concat (list "validator" "cleanup") .)))) }}{{ end -}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" .name
  "image" (include "gpu-stack-lib.stackImage" .ctx)
  "pullPolicy" .ctx.Values.global.stackImage.pullPolicy
  "command" (list "validator" .component)
  "env" (mergeOverwrite $env (.env | default dict))
  "main" .main
  "spec" $spec
  "volumeMounts" $mounts
  "securityContext" $sc
) -}}
{{- end }}
