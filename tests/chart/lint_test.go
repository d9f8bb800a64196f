package chart

import (
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// TestHelmLintStrict runs `helm lint --strict --with-subcharts` through the SDK for every profile.
func TestHelmLintStrict(t *testing.T) {
	for _, p := range profiles(t) {
		t.Run(p.name, func(t *testing.T) {
			vals, err := chartrender.Values([]string{p.file}, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := action.NewLint()
			l.Strict = true
			l.WithSubcharts = true
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
