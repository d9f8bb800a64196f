package gpumigrate

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"
)

// Input is what a conversion reads: the operator's values (or a ClusterPolicy's spec) and NVIDIADriver objects.
type Input struct {
	Values  map[string]any
	Drivers []map[string]any
}

// ParseFile reads a GPU Operator values file, or YAML documents holding a ClusterPolicy and NVIDIADriver objects
// (as `kubectl get clusterpolicy,nvidiadriver -o yaml` prints them, a List or one document each). Several value
// documents merge, later ones winning.
func ParseFile(data []byte) (Input, error) {
	var in Input
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return in, err
		}
		var doc map[string]any
		if err := decodeJSONish(&node, &doc); err != nil {
			return in, err
		}
		if doc == nil {
			continue
		}
		if err := in.addDoc(doc); err != nil {
			return in, err
		}
	}
	return in, nil
}

// decodeJSONish decodes through JSON so numbers, maps and lists have the types Helm and the dynamic client use.
func decodeJSONish(node *yaml.Node, out *map[string]any) error {
	raw, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	return sigsyaml.Unmarshal(raw, out)
}

func (in *Input) addDoc(doc map[string]any) error {
	kind, _ := doc["kind"].(string)
	_, hasAPI := doc["apiVersion"].(string)
	if !hasAPI {
		kind = "" // a values file may well have a key named kind
	}
	switch kind {
	case "":
		if in.Values == nil {
			in.Values = map[string]any{}
		}
		mergeMaps(in.Values, doc)
	case "List", "ClusterPolicyList", "NVIDIADriverList":
		items, _ := doc["items"].([]any)
		for _, it := range items {
			m, ok := it.(map[string]any)
			if !ok {
				continue
			}
			if err := in.addDoc(m); err != nil {
				return err
			}
		}
	case "ClusterPolicy":
		spec, _ := doc["spec"].(map[string]any)
		if in.Values == nil {
			in.Values = map[string]any{}
		}
		mergeMaps(in.Values, spec)
	case "NVIDIADriver":
		in.Drivers = append(in.Drivers, doc)
	default:
		return fmt.Errorf("a %s is not GPU Operator input: give its values file, a ClusterPolicy or NVIDIADriver objects", kind)
	}
	return nil
}

func mergeMaps(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeMaps(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}
