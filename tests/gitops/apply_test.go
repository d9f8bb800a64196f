package gitops

import (
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// parseObjects decodes every object of a manifest stream as `helm template` prints it, each with the template it
// came from.
func parseObjects(t *testing.T, stream string) []renderedObject {
	t.Helper()
	var out []renderedObject
	for _, doc := range strings.Split(stream, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		source := ""
		if m := sourceLine.FindStringSubmatch(doc); m != nil {
			source = m[1]
		}
		body, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if string(body) == "null" {
			continue // a template that rendered nothing but comments
		}
		o := renderedObject{source: source, body: body, fields: decodeJSON(t, body)}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(body); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		o.gvk, o.name, o.ns = u.GroupVersionKind(), u.GetName(), u.GetNamespace()
		out = append(out, o)
	}
	return out
}

var sourceLine = regexp.MustCompile(`(?m)^# Source: (.+)$`)
