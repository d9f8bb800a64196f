package chartrender

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// Profile is one values file under values/: one cluster shape. MinKube is the oldest Kubernetes minor it supports
// ("1.34"), from a "Needs Kubernetes >= 1.NN" line in its header comment; empty when it runs on every supported one.
// Site is an example of the facts of a site that the profile cannot know and will not render without (the openshift
// profile's RHCOS builds), from a "Site values: <path under the repository>" line in its header; empty when the
// profile renders alone.
type Profile struct{ Name, File, MinKube, Site string }

// Files are the values files a render of the profile takes: the profile, then its site example if it needs one.
func (p Profile) Files() []string {
	if p.Site == "" {
		return []string{p.File}
	}
	return []string{p.File, p.Site}
}

// siteValues is how a profile's header names its site example.
var siteValues = regexp.MustCompile(`(?m)^# Site values: (\S+\.yaml)`)

// needsKube is how a profile's header says which Kubernetes it needs (the DRA profiles: resource.k8s.io/v1).
var needsKube = regexp.MustCompile(`(?m)^#.*Needs Kubernetes >= (1\.[0-9]+)`)

// KubeVersions are the supported Kubernetes versions the profile renders for: KubeVersions from its MinKube on.
func (p Profile) KubeVersions() []string {
	var out []string
	for _, kv := range KubeVersions {
		if p.MinKube == "" || version.MustParseGeneric(kv).AtLeast(version.MustParseGeneric(p.MinKube)) {
			out = append(out, kv)
		}
	}
	return out
}

// Profiles lists the profiles of the repository at root (values/*.yaml), by name.
func Profiles(root string) ([]Profile, error) {
	files, err := filepath.Glob(filepath.Join(root, "values", "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no values profiles under %s", filepath.Join(root, "values"))
	}
	var out []Profile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		p := Profile{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), File: f}
		if m := needsKube.FindSubmatch(b); m != nil {
			p.MinKube = string(m[1])
		}
		if m := siteValues.FindSubmatch(b); m != nil {
			p.Site = filepath.Join(root, string(m[1]))
			if _, err := os.Stat(p.Site); err != nil {
				return nil, fmt.Errorf("profile %s: its site values: %w", f, err)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// EveryOptionalOperand enables (as --set overrides) the operands and features that no profile turns on by
// default, so that renders with it cover their images and pod specs too.
var EveryOptionalOperand = []string{
	"dcgm.enabled=true", "dcgmExporter.remoteHostEngine=nvidia-dcgm:5555", "nodeStatusExporter.enabled=true",
	"driver.gds.enabled=true", "driver.gdrcopy.enabled=true", "monitoring.dashboards.enabled=true",
	"global.health.nodeCondition.enabled=true",
}
