{{/*
Label-selector algebra for driver pools: a pool's selector as node selector requirements, the default pool's
exclusion of the other pools, and the exact overlap check between pools.
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

