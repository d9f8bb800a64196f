// Package schemahint adds a did-you-mean to Helm's schema errors: for each "additional properties 'x' not allowed"
// at a path, the closest key the chart's schema allows there. Helm's own message names the unknown key only.
package schemahint

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// unknownKeys matches Helm's line for keys a schema does not allow: "- at '/dcgm': additional properties 'imagee'
// not allowed" (several keys quoted and comma-separated).
var unknownKeys = regexp.MustCompile(`(?m)^(- at '([^']*)': additional propert(?:y|ies) )((?:'[^']+'(?:, )?)+)( not allowed)$`)

var quoted = regexp.MustCompile(`'([^']+)'`)

// chartHeader is Helm's line naming the chart whose schema the lines below it break ("kube-gpu-stack:").
var chartHeader = regexp.MustCompile(`^([A-Za-z0-9._-]+):$`)

// Explain returns err with a suggestion after each unknown key that is close to a key the chart's schema allows at
// that path; schemas are the charts' values.schema.json by chart name (Helm checks a subchart's values against its
// own schema and names that chart above its lines). err itself when no line gains a hint.
func Explain(err error, schemas map[string][]byte) error {
	if err == nil || !unknownKeys.MatchString(err.Error()) {
		return err
	}
	lines := strings.Split(err.Error(), "\n")
	var root map[string]any
	changed := false
	for i, line := range lines {
		if m := chartHeader.FindStringSubmatch(line); m != nil {
			root = nil
			if json.Unmarshal(schemas[m[1]], &root) != nil {
				root = nil
			}
			continue
		}
		m := unknownKeys.FindStringSubmatch(line)
		if m == nil || root == nil {
			continue
		}
		known := propertiesAt(root, m[2])
		var hints []string
		for _, k := range quoted.FindAllStringSubmatch(m[3], -1) {
			if near := closest(k[1], known); near != "" {
				hints = append(hints, fmt.Sprintf("%q: did you mean %q?", k[1], near))
			}
		}
		if len(hints) > 0 {
			lines[i] = line + " (" + strings.Join(hints, "; ") + ")"
			changed = true
		}
	}
	if !changed {
		return err
	}
	return &hinted{msg: strings.Join(lines, "\n"), err: err}
}

type hinted struct {
	msg string
	err error
}

func (h *hinted) Error() string { return h.msg }
func (h *hinted) Unwrap() error { return h.err }

// propertiesAt follows a JSON pointer of value keys ("/dcgm/image") through the schema's properties and returns the
// keys allowed there.
func propertiesAt(s map[string]any, pointer string) []string {
	for _, key := range strings.Split(strings.Trim(pointer, "/"), "/") {
		if key == "" {
			continue
		}
		props, _ := s["properties"].(map[string]any)
		next, ok := props[strings.NewReplacer("~1", "/", "~0", "~").Replace(key)].(map[string]any)
		if !ok {
			return nil
		}
		s = next
	}
	props, _ := s["properties"].(map[string]any)
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// closest is the known key nearest to key by edit distance, case ignored, when it is near enough to be a typo (at
// most a third of the key's length, and at least 1); "" otherwise.
func closest(key string, known []string) string {
	best, bestD := "", max(1, len(key)/3)+1
	for _, k := range known {
		if d := distance(strings.ToLower(key), strings.ToLower(k)); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
