{{/*
Helm hooks: the Jobs (and the helm test Pod) that run the project's `kube-gpu-stack` binary around a release, and
their RBAC. Helm never deletes hook objects on uninstall, and it runs a hook event's objects in weight order, so
a hook's ServiceAccount and roles are hooks of the same event with a lower weight than its Job.
*/}}

{{/*
gpu-stack-lib.hookAnnotations: the Helm hook annotations, as a YAML map. dict:
  hook             the events, comma-separated (post-install,post-upgrade; pre-delete; test)
  weight           the hook weight (objects of one event are created in ascending weight, ties by name)
  deletePolicy     helm.sh/hook-delete-policy, comma-separated
  outputLogPolicy  optional helm.sh/hook-output-log-policy (hook-succeeded, hook-failed): Helm >= 3.22 copies the
                   hook pod's log into its own output then (Jobs: pods labelled job-name=<name>; Pods: by name)
*/}}
{{- define "gpu-stack-lib.hookAnnotations" -}}
helm.sh/hook: {{ .hook }}
helm.sh/hook-weight: {{ .weight | toString | quote }}
helm.sh/hook-delete-policy: {{ .deletePolicy }}
{{- with .outputLogPolicy }}
helm.sh/hook-output-log-policy: {{ . }}
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.hookRbac: gpu-stack-lib.rbac as hook objects (ServiceAccount, Role/RoleBinding, ClusterRole/
ClusterRoleBinding, all annotated alike). Takes gpu-stack-lib.rbac's dict plus gpu-stack-lib.hookAnnotations'.
*/}}
{{- define "gpu-stack-lib.hookRbac" -}}
{{- $args := omit . "hook" "weight" "deletePolicy" "outputLogPolicy" -}}
{{- $_ := set $args "annotations" (include "gpu-stack-lib.hookAnnotations" (omit . "outputLogPolicy") | fromYaml) -}}
{{- include "gpu-stack-lib.rbac" $args -}}
{{- end }}

{{/*
gpu-stack-lib.hookJob: a hook Job running the project's image (`kube-gpu-stack ARGS...`), or with `pod` a bare Pod
(the helm test hook: `helm test --logs` reads the log of the Pod named like the hook). One try (backoffLimit 0,
restartPolicy Never): a failed check is a result, not a crash to retry. A pod killed by a disruption (its node
drained, deleted or shut down; the pod condition DisruptionTarget) is replaced instead: every hook starts over as it
does on the next sync, and a drain must not fail the Helm operation. activeDeadlineSeconds is timeoutSeconds
+ 30, so the pod is stopped shortly after the binary's own deadline and before Helm's (5m by default). The pod
runs under the Pod Security `restricted` profile (on OpenShift the nonroot-v2 SCC: restricted-v2 refuses its fixed UID,
so callers pass "scc" "nonroot-v2" to its RBAC), as the ServiceAccount named like the hook. dict:
  ctx              the umbrella chart's context (global.stackImage, global scheduling, pull secrets)
  name             object and ServiceAccount name
  component        app.kubernetes.io/component and the container's name
  hook, weight, deletePolicy, outputLogPolicy   as gpu-stack-lib.hookAnnotations
  args             the binary's arguments (list)
  env              optional map NAME -> value
  timeoutSeconds   the binary's own deadline
  values           the hooks values: resources, nodeSelector (over global.nodeSelector), tolerations (added to
                   global.tolerations), affinity (by default away from GPU nodes: the plan's and the cleanup's
                   accounts may write every Node), priorityClassName (global.priorityClassName is not used: it is
                   meant for node-critical operands, and quotas on it would block the hook)
  pod              optional: true renders a Pod instead of a Job
*/}}
{{- define "gpu-stack-lib.hookJob" -}}
{{- $ctx := .ctx -}}
{{- $g := $ctx.Values.global -}}
{{- $h := .values | default dict -}}
{{- $deadline := add (int .timeoutSeconds) 30 -}}
{{- $container := include "gpu-stack-lib.container" (dict
  "ctx" $ctx
  "name" .component
  "image" (include "gpu-stack-lib.stackImage" $ctx)
  "pullPolicy" $g.stackImage.pullPolicy
  "command" (list "kube-gpu-stack")
  "args" .args
  "env" .env
  "securityContext" (dict
    "runAsNonRoot" true
    "allowPrivilegeEscalation" false
    "readOnlyRootFilesystem" true
    "capabilities" (dict "drop" (list "ALL")))
  "spec" (ternary (dict "resources" $h.resources) dict (not (empty $h.resources)))
) | fromYaml -}}
{{- $pod := dict
  "serviceAccountName" .name
  "automountServiceAccountToken" true
  "restartPolicy" "Never"
  "securityContext" (dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "seccompProfile" (dict "type" "RuntimeDefault"))
  "containers" (list $container)
-}}
{{- if .pod }}{{ $_ := set $pod "activeDeadlineSeconds" $deadline }}{{ end -}}
{{- /* scheduling merged as gpu-stack-lib.podTemplate merges it for operands */ -}}
{{- $tolerations := concat ($g.tolerations | default list) ($h.tolerations | default list) | uniq -}}
{{- if .pod -}}
{{- /* A bare Pod gets the API server's default NoExecute tolerations (DefaultTolerationSeconds admission, 300 s)
unless it already tolerates those taints; rendered here as admission would add them, a live read shows no diff. */ -}}
{{- range $key := list "node.kubernetes.io/not-ready" "node.kubernetes.io/unreachable" -}}
{{- $tolerated := false -}}
{{- range $tolerations -}}
{{- if and (or (not .key) (eq .key $key)) (or (not .effect) (eq .effect "NoExecute")) }}{{ $tolerated = true }}{{ end -}}
{{- end -}}
{{- if not $tolerated }}{{ $tolerations = append $tolerations (dict "key" $key "operator" "Exists" "effect" "NoExecute" "tolerationSeconds" 300) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- with $tolerations }}{{ $_ := set $pod "tolerations" . }}{{ end -}}
{{- with mergeOverwrite (deepCopy ($g.nodeSelector | default dict)) (deepCopy ($h.nodeSelector | default dict)) }}{{ $_ := set $pod "nodeSelector" . }}{{ end -}}
{{- with $h.affinity }}{{ $_ := set $pod "affinity" . }}{{ end -}}
{{- with $h.priorityClassName }}{{ $_ := set $pod "priorityClassName" . }}{{ end -}}
{{- with include "gpu-stack-lib.pullSecrets" $ctx | fromYamlArray }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end -}}
{{- $meta := dict "ctx" $ctx "name" .name "component" .component -}}
{{- $annotations := include "gpu-stack-lib.hookAnnotations" . -}}
{{- if .pod -}}
apiVersion: v1
kind: Pod
metadata:
  {{- include "gpu-stack-lib.metadata" $meta | nindent 2 }}
  annotations:
    {{- $annotations | nindent 4 }}
spec:
  {{- toYaml $pod | nindent 2 }}
{{- else -}}
apiVersion: batch/v1
kind: Job
metadata:
  {{- include "gpu-stack-lib.metadata" $meta | nindent 2 }}
  annotations:
    {{- $annotations | nindent 4 }}
spec:
  backoffLimit: 0
  podFailurePolicy:
    rules:
      - action: Ignore
        onPodConditions:
          - type: DisruptionTarget
  activeDeadlineSeconds: {{ $deadline }}
  template:
    metadata:
      labels:
        {{- include "gpu-stack-lib.selectorLabels" $meta | nindent 8 }}
        app.kubernetes.io/component: {{ .component }}
    spec:
      {{- toYaml $pod | nindent 6 }}
{{- end }}
{{- end }}
