//go:build !cgo

package validation

// staticBuildProbe stands in for go-nvml in a CGO_ENABLED=0 build, which cannot load libnvidia-ml.
type staticBuildProbe struct{}

func (staticBuildProbe) Probe(string) (int, string, error) { return 0, "", ErrNVMLNotBuiltIn }

func defaultNVMLProbe() NVMLProbe { return staticBuildProbe{} }
