package chartrender

import (
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
)

// The demo installs the chart as `helm install charts/kube-gpu-stack` from a clone would (LoadReleased): the
// versions of the chart and of each subchart are their Chart.yaml's, which the operand pods' labels carry, so a
// user's first `helm upgrade` from the clone changes no pod template. It installed the tests' pinned version
// (Load), and that first upgrade restarted every operand pod but the drivers.
func TestLoadReleasedKeepsEveryChartsOwnVersion(t *testing.T) {
	released, err := LoadReleased(ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := Load(ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	var walk func(c *chart.Chart, dir string)
	walk = func(c *chart.Chart, dir string) {
		md, err := chartutil.LoadChartfile(dir + "/Chart.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if c.Metadata.Version != md.Version || c.Metadata.AppVersion != md.AppVersion {
			t.Errorf("chart %s loaded as %s (app %s), want its Chart.yaml's %s (app %s)", c.Name(), c.Metadata.Version, c.Metadata.AppVersion, md.Version, md.AppVersion)
		}
		for _, d := range c.Dependencies() {
			walk(d, dir+"/charts/"+d.Name())
		}
	}
	walk(released, ChartDir())
	if pinned.Metadata.Version != ChartVersion || released.Metadata.Version == ChartVersion {
		t.Errorf("pinned %s, released %s: want the tests' %s only in the pinned chart", pinned.Metadata.Version, released.Metadata.Version, ChartVersion)
	}
}
