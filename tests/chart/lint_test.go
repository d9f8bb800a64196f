package chart

import (
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestHelmLintStrict runs `helm lint --strict` through the SDK for every profile. Its render covers every operand
// chart as the umbrella renders it; an operand does not lint alone (`--with-subcharts`, which only the CLI honours),
// since it calls the library through the umbrella's dependency and reads global values only the umbrella sets.
func TestHelmLintStrict(t *testing.T) {
	t.Parallel()
	for _, p := range profiles(t) {
		t.Run(p.name, func(t *testing.T) {
			vals, err := chartrender.Values(p.files, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := action.NewLint()
			l.Strict = true
			l.Namespace = chartrender.Namespace
			res := l.Run([]string{chartrender.ChartDir()}, vals)
			for _, m := range res.Messages {
				if m.Severity >= support.InfoSev {
					t.Errorf("%s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("%v", err)
			}
		})
	}
}
