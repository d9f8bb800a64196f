// Package valuesschema generates a chart's values.schema.json from its values.yaml, so the schema can never drift
// from the documented defaults: each key's type comes from its default, its description from the comment above
// it, and a `# @schema {json}` comment line adds what a default cannot say (enums, nullable or free-form maps).
//
// Objects are closed (additionalProperties: false) so a typo'd key fails at render; `global` stays open. The value
// key of each subchart holds the subchart's own schema, closed too: Helm checks a subchart's values against its
// schema only while the subchart is enabled, so a typo under a disabled operand passed silently. An undocumented key
// is an error.
package valuesschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chartutil"
)

const schemaDraft = "http://json-schema.org/draft-07/schema#"

// Schema is one JSON schema node.
type Schema = map[string]any

// Hints gives, for a chart's schema, keys that are not the chart's (another product's spelling) and the sentence
// each one accepts as its only value: a values file using such a key fails validation printing the sentence. has
// tells whether a key path is in the schema.
type Hints func(has func(path string) bool) map[string]string

// Generate returns the schema for the chart in chartDir. common, when not empty, is a values file whose keys every
// operand accepts (the library's operand-values.yaml); they are merged into the chart's schema. hints, when not
// nil, adds its keys to closed objects of the schema. subcharts are the schemas of the chart's subcharts by their
// values key (alias): each goes under its key, merged with what the chart itself documents there (`enabled`); a
// subchart without one (the library chart) gets an open object.
func Generate(chartDir, common string, hints Hints, subcharts map[string]Schema) (Schema, error) {
	root, err := fromFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	if common != "" {
		base, err := fromFile(common)
		if err != nil {
			return nil, err
		}
		root = merge(base, root)
	}
	if err := checkDocumented(root, ""); err != nil {
		return nil, err
	}
	md, err := chartutil.LoadChartfile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	props := root["properties"].(Schema)
	open := func(key, why string) {
		s, ok := props[key].(Schema)
		if !ok {
			s = Schema{"type": "object", "description": why}
			props[key] = s
		}
		delete(s, "additionalProperties")
	}
	open("global", "Values shared with every subchart.")
	for _, d := range md.Dependencies {
		key := d.Name
		if d.Alias != "" {
			key = d.Alias
		}
		sub, ok := subcharts[key]
		if !ok {
			open(key, fmt.Sprintf("Values of the %s subchart, checked by its own schema.", d.Name))
			continue
		}
		own, _ := props[key].(Schema)
		embedded, err := deepCopy(sub)
		if err != nil {
			return nil, fmt.Errorf("the %s subchart's schema: %w", d.Name, err)
		}
		delete(embedded, "$schema")
		if own == nil {
			own = Schema{"description": fmt.Sprintf("Values of the %s subchart.", d.Name)}
		}
		props[key] = merge(embedded, own)
	}
	if hints != nil {
		addHints(root, hints(func(path string) bool { return lookup(root, path) != nil }))
	}
	root["$schema"] = schemaDraft
	return root, nil
}

// Encode is a schema as its values.schema.json holds it.
func Encode(s Schema) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// deepCopy copies a schema through JSON, so that changing the copy (hints added) leaves the original alone.
func deepCopy(s Schema) (Schema, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var out Schema
	return out, json.Unmarshal(b, &out)
}

func fromFile(path string) (Schema, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return Schema{"type": "object", "additionalProperties": false, "properties": Schema{}}, nil
	}
	s, err := nodeSchema(doc.Content[0], "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func nodeSchema(n *yaml.Node, path string) (Schema, error) {
	switch n.Kind {
	case yaml.MappingNode:
		s := Schema{"type": "object"}
		if len(n.Content) == 0 {
			return s, nil // an empty map is free-form (resources, securityContext, ...) unless @schema narrows it
		}
		props := Schema{}
		for i := 0; i < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			keyPath := strings.TrimPrefix(path+"."+k.Value, ".")
			child, err := nodeSchema(v, keyPath)
			if err != nil {
				return nil, err
			}
			desc, extra, err := parseComment(k.HeadComment, keyPath)
			if err != nil {
				return nil, err
			}
			if desc != "" {
				child["description"] = desc
			}
			maps.Copy(child, extra)
			props[k.Value] = child
		}
		s["properties"] = props
		s["additionalProperties"] = false
		return s, nil
	case yaml.SequenceNode:
		return Schema{"type": "array"}, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return Schema{"type": "string"}, nil
		case "!!bool":
			return Schema{"type": "boolean"}, nil
		case "!!int":
			return Schema{"type": "integer"}, nil
		case "!!float":
			return Schema{"type": "number"}, nil
		case "!!null":
			return Schema{}, nil // its type must come from @schema; checkDocumented reports it otherwise
		}
	case yaml.AliasNode:
		return nodeSchema(n.Alias, path)
	}
	return nil, fmt.Errorf("%s: unsupported YAML node", path)
}

// parseComment splits a key's head comment into its description and the @schema additions.
func parseComment(comment, path string) (string, Schema, error) {
	var desc []string
	extra := Schema{}
	for _, line := range strings.Split(comment, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if rest, ok := strings.CutPrefix(line, "@schema "); ok {
			if err := json.Unmarshal([]byte(rest), &extra); err != nil {
				return "", nil, fmt.Errorf("%s: bad @schema annotation %q: %w", path, rest, err)
			}
			continue
		}
		if line != "" {
			desc = append(desc, line)
		}
	}
	return strings.Join(desc, " "), extra, nil
}

// merge overlays chart on base: chart's defaults and descriptions win, base fills in keys and docs chart omits.
func merge(base, chart Schema) Schema {
	out := maps.Clone(base)
	for k, v := range chart {
		out[k] = v
	}
	if _, ok := chart["description"]; !ok {
		if d, ok := base["description"]; ok {
			out["description"] = d
		}
	}
	bp, _ := base["properties"].(Schema)
	cp, _ := chart["properties"].(Schema)
	if bp != nil || cp != nil {
		props := Schema{}
		maps.Copy(props, bp)
		for k, v := range cp {
			if b, ok := bp[k].(Schema); ok {
				props[k] = merge(b, v.(Schema))
			} else {
				props[k] = v
			}
		}
		out["properties"] = props
	}
	return out
}

func checkDocumented(s Schema, path string) error {
	props, _ := s["properties"].(Schema)
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(props)) {
		child := props[k].(Schema)
		p := strings.TrimPrefix(path+"."+k, ".")
		if d, _ := child["description"].(string); d == "" {
			errs = append(errs, fmt.Errorf("%s: no comment above the key says what it does", p))
		}
		if _, ok := child["type"]; !ok && child["anyOf"] == nil && child["enum"] == nil {
			errs = append(errs, fmt.Errorf("%s: null default needs a `# @schema {\"type\": ...}` line", p))
		}
		if err := checkDocumented(child, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// lookup is the schema node of a dotted key path, or nil.
func lookup(s Schema, path string) Schema {
	for _, k := range strings.Split(path, ".") {
		props, _ := s["properties"].(Schema)
		child, ok := props[k].(Schema)
		if !ok {
			return nil
		}
		s = child
	}
	return s
}

// addHints adds each hinted key whose parent is a closed object as a property that accepts only its sentence (a
// const): Helm's validator then names the key and prints the sentence, and the key still fails. Keys under open
// objects are left to the schema that checks them (a subchart's).
func addHints(root Schema, hints map[string]string) {
	for _, path := range slices.Sorted(maps.Keys(hints)) {
		parent := root
		if i := strings.LastIndex(path, "."); i >= 0 {
			parent = lookup(root, path[:i])
		}
		if parent == nil || parent["additionalProperties"] != false {
			continue
		}
		props, _ := parent["properties"].(Schema)
		key := path[strings.LastIndex(path, ".")+1:]
		if _, ok := props[key]; ok {
			continue
		}
		props[key] = Schema{"description": hints[path], "const": hints[path]}
	}
}
