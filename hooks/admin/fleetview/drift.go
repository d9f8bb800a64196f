package fleetview

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Drift is one value where the release differs from the values file: a key set on one side only has the other
// empty (Absent).
type Drift struct {
	Key  string `json:"key"`
	Want string `json:"want"`
	Have string `json:"have"`
}

// Absent marks the side of a Drift that does not set the key.
const Absent = "(unset)"

// Diff compares the values a cluster should run (a values file) with the values its release was given, key by
// key down to the leaves; a list is one value. Both are read as JSON reads them, so 2 and 2.0 are one number.
func Diff(want, have map[string]any) []Drift {
	w, h := flatten(normalize(want)), flatten(normalize(have))
	var out []Drift
	for _, k := range slices.Sorted(maps.Keys(union(w, h))) {
		wv, inW := w[k]
		hv, inH := h[k]
		if inW && inH && reflect.DeepEqual(wv, hv) {
			continue
		}
		out = append(out, Drift{Key: k, Want: show(wv, inW), Have: show(hv, inH)})
	}
	return out
}

func normalize(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return m
	}
	var out map[string]any
	if json.Unmarshal(raw, &out) != nil {
		return m
	}
	return out
}

// flatten maps each leaf to its dotted key; an empty map is a leaf of its own (it may clear a default).
func flatten(m map[string]any) map[string]any {
	out := map[string]any{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		mm, ok := v.(map[string]any)
		if !ok || len(mm) == 0 {
			out[prefix] = v
			return
		}
		for k, sub := range mm {
			walk(strings.TrimPrefix(prefix+"."+k, "."), sub)
		}
	}
	for k, v := range m {
		walk(k, v)
	}
	return out
}

func union(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

func show(v any, set bool) string {
	if !set {
		return Absent
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return string(raw)
}
