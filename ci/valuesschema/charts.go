package valuesschema

import (
	"fmt"
	"path/filepath"

	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/gpumigrate"
)

// File is one generated values.schema.json: where it belongs and what it must hold.
type File struct {
	Path    string
	Content []byte
}

// All generates the values.schema.json of every chart in the repository at root that carries one: the umbrella
// (charts/kube-gpu-stack) and each operand chart (operands/*), whose schemas also accept the library's common
// operand values. Each schema refuses the GPU Operator's spelling of its keys naming the replacement
// (gpumigrate.SchemaHints), under the key the umbrella gives that chart.
func All(root string) ([]File, error) {
	umbrella := filepath.Join(root, "charts", "kube-gpu-stack")
	operands, err := filepath.Glob(filepath.Join(root, "operands", "*"))
	if err != nil {
		return nil, err
	}
	keys, err := SubchartKeys(umbrella)
	if err != nil {
		return nil, err
	}
	common := filepath.Join(root, "charts", "gpu-stack-lib", "operand-values.yaml")
	var out []File
	// the operands first: the umbrella holds each one's schema under its key
	subcharts := map[string]Schema{}
	for _, dir := range operands {
		key := keys[filepath.Base(dir)]
		s, err := Generate(dir, common, gpumigrate.SchemaHints(key), nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		if out, err = appendFile(out, dir, s); err != nil {
			return nil, err
		}
		subcharts[key] = s
	}
	s, err := Generate(umbrella, "", gpumigrate.SchemaHints(""), subcharts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", umbrella, err)
	}
	out, err = appendFile(out, umbrella, s)
	if err != nil {
		return nil, err
	}
	// the umbrella first, as before: the order the files are listed in
	return append(out[len(out)-1:], out[:len(out)-1]...), nil
}

func appendFile(out []File, dir string, s Schema) ([]File, error) {
	b, err := Encode(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return append(out, File{Path: filepath.Join(dir, "values.schema.json"), Content: b}), nil
}

// SubchartKeys maps each operand chart's directory name to its key in the umbrella's values (its alias); the
// umbrella itself is "".
func SubchartKeys(umbrella string) (map[string]string, error) {
	md, err := chartutil.LoadChartfile(filepath.Join(umbrella, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	keys := map[string]string{}
	for _, d := range md.Dependencies {
		keys[d.Name] = d.Name
		if d.Alias != "" {
			keys[d.Name] = d.Alias
		}
	}
	return keys, nil
}
