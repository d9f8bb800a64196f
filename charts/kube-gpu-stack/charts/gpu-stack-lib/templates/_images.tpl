{{/*
One image scheme for every image: [global.imageRegistry | image.registry]/repository[:tag][@digest].
global.imageRegistry replaces the registry of every image, so one mirror serves an air-gapped cluster;
global.imageDigests pins repository:tag to a digest where the image sets none.
*/}}

{{/* gpu-stack-lib.image: dict "ctx" . "image" IMAGE ["defaultTag" TAG] */}}
{{- define "gpu-stack-lib.image" -}}
{{- $img := .image -}}
{{- $registry := .ctx.Values.global.imageRegistry | default $img.registry -}}
{{- $ref := required "every image needs a repository" $img.repository -}}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $img.repository }}{{ end -}}
{{- $tag := $img.tag | default .defaultTag | toString -}}
{{- if and (not $tag) (not $img.digest) }}{{ fail (printf "image %s has neither a tag nor a digest: set its tag or digest" $img.repository) }}{{ end -}}
{{- $digest := $img.digest -}}
{{- /* global.imageDigests pins a tag the values name (airgap bundle writes it for the images it holds) */ -}}
{{- if and $tag (not $digest) }}{{ $digest = get (.ctx.Values.global.imageDigests | default dict) (printf "%s:%s" $img.repository $tag) }}{{ end -}}
{{- if $tag }}{{ $ref = printf "%s:%s" $ref $tag }}{{ end -}}
{{- if $digest }}{{ $ref = printf "%s@%s" $ref $digest }}{{ end -}}
{{- $ref -}}
{{- end }}

{{/* gpu-stack-lib.stackImage: the project's own image (validator, driver manager, hooks); tag defaults to appVersion */}}
{{- define "gpu-stack-lib.stackImage" -}}
{{- include "gpu-stack-lib.image" (dict "ctx" . "image" .Values.global.stackImage "defaultTag" .Chart.AppVersion) -}}
{{- end }}

{{/* gpu-stack-lib.pullSecrets: global.imagePullSecrets plus the operand's, as [{name}], de-duplicated */}}
{{- define "gpu-stack-lib.pullSecrets" -}}
{{- $names := list -}}
{{- range concat (.Values.global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- if kindIs "map" . }}{{ $names = append $names .name }}{{ else }}{{ $names = append $names . }}{{ end -}}
{{- end -}}
{{- range $names | uniq }}
- name: {{ . }}
{{- end }}
{{- end }}
