package gpumigrate

import (
	"slices"
	"strings"
)

// hintSuffix ends every schema hint, so a user who meets one learns about the converter.
const hintSuffix = " (kube-gpu-stack migrate converts GPU Operator values)"

// SchemaHints returns, for the chart whose values live under chartKey in the umbrella chart ("" for the umbrella
// itself), the GPU Operator keys that chart spells differently, each with the sentence its values schema accepts
// as the key's only value, so a render that uses the operator's spelling fails naming the replacement. has tells
// whether a key path exists in the chart's schema; a hint goes on the first key of an operator path that is missing.
func SchemaHints(chartKey string) func(has func(path string) bool) map[string]string {
	return func(has func(string) bool) map[string]string {
		groups := map[string][]Rule{}
		for _, r := range rules {
			rel := r.From
			if chartKey != "" {
				var ok bool
				if rel, ok = strings.CutPrefix(r.From, chartKey+"."); !ok {
					continue
				}
			}
			segs := strings.Split(rel, ".")
			for i := range segs {
				if p := strings.Join(segs[:i+1], "."); !has(p) {
					groups[p] = append(groups[p], r)
					break
				}
			}
		}
		out := map[string]string{}
		for p, rs := range groups {
			// Helm prints the sentence in single quotes, escaping any inside it
			out[p] = strings.ReplaceAll(hintText(strings.TrimPrefix(chartKey+"."+p, "."), rs), "'", "’")
		}
		return out
	}
}

// hintOverrides word the hints whose rules write to many keys.
var hintOverrides = map[string]string{
	"daemonsets":  "use global.tolerations, global.priorityClassName, global.podLabels, global.podAnnotations and global.updateStrategy",
	"toolkit.env": "use toolkit.extraEnv, a NAME: value map; CONTAINERD_CONFIG and CONTAINERD_SOCKET become global.platform or toolkit.runtimeConfig",
	// psa.enabled's rule writes nothing: the labels need the chart to render the namespace
	"psa": "use namespace.create=true (install without --create-namespace) with namespace.podSecurityLabels, or label the namespace privileged yourself",
}

// hintText names where the operator key at src goes: one target prefix when the rules under it agree on one (e.g.
// sandboxWorkloads -> global.sandboxWorkloads), else their targets; or why it has no place.
func hintText(src string, rs []Rule) string {
	if h, ok := hintOverrides[src]; ok {
		return h + hintSuffix
	}
	var prefixes, targets, whys []string
	for _, r := range rs {
		rest := strings.TrimPrefix(strings.TrimPrefix(r.From, src), ".")
		for _, t := range r.Targets {
			targets = append(targets, t)
			switch {
			case rest == "":
				prefixes = append(prefixes, t)
			case strings.HasSuffix(t, "."+rest):
				prefixes = append(prefixes, strings.TrimSuffix(t, "."+rest))
			}
		}
		if len(r.Targets) == 0 && r.Why != "" {
			whys = append(whys, r.Why)
		}
	}
	slices.Sort(prefixes)
	prefixes = slices.Compact(prefixes)
	targets = uniq(targets)
	switch {
	case len(prefixes) == 1 && len(whys) == 0:
		return "use " + prefixes[0] + hintSuffix
	case len(targets) > 0 && len(whys) > 0:
		// some keys under src have a place and the rest none (operator: only its defaultRuntime has one): name
		// each key that moves, then why the others do not, rather than one target as if it took them all
		var moves []string
		for _, r := range rs {
			if len(r.Targets) > 0 {
				moves = append(moves, r.From+": use "+strings.Join(uniq(r.Targets), ", "))
			}
		}
		return strings.Join(moves, "; ") + "; the rest of " + src + " is not a kube-gpu-stack key: " + whys[0] + hintSuffix
	case len(targets) > 0:
		return "use " + strings.Join(targets, ", ") + hintSuffix
	case len(whys) > 0:
		return "not a kube-gpu-stack key: " + whys[0] + hintSuffix
	}
	return "not a kube-gpu-stack key" + hintSuffix
}

// uniq drops repeated strings, keeping the first of each in order.
func uniq(ss []string) []string {
	var out []string
	for _, s := range ss {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
