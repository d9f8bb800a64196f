package gpumigrate

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/version"
)

// A site on an older GPU Operator often hands in a full copy of its release's values.yaml. The defaults in it are not
// the site's settings: converted, they would pin that release's images and tags over this chart's tested ones (the
// 24.x and 25.x default vfioManager image is a CUDA base image, without vfio-manage). So migrate reads an input
// against the defaults of the release it came from and drops what equals them.

// vendoredDefaults are the GPU Operator chart's values.yaml of each release migrate knows, one folder per tag.
//
//go:embed testdata/gpu-operator-*/values.yaml
var vendoredDefaults embed.FS

// releaseDefaults parses each vendored release's values once: tag -> values.
var releaseDefaults = sync.OnceValue(func() map[string]map[string]any {
	out := map[string]map[string]any{}
	dirs, _ := fs.Glob(vendoredDefaults, "testdata/gpu-operator-*")
	for _, dir := range dirs {
		data, err := vendoredDefaults.ReadFile(dir + "/values.yaml")
		if err != nil {
			panic(err)
		}
		in, err := ParseFile(data)
		if err != nil {
			panic(fmt.Sprintf("%s: %v", dir, err)) // vendored files: TestKnownReleasesAreVendored parses each first
		}
		out[strings.TrimPrefix(path.Base(dir), "gpu-operator-")] = in.Values
	}
	return out
})

// KnownVersions are the GPU Operator releases whose defaults migrate knows, oldest first.
func KnownVersions() []string {
	return slices.SortedFunc(maps.Keys(releaseDefaults()), func(a, b string) int {
		n, _ := version.MustParseGeneric(a).Compare(b)
		return n
	})
}

// CheckVersion returns the known release a --from-version names (with or without the leading v).
func CheckVersion(v string) (string, error) {
	tag := "v" + strings.TrimPrefix(strings.TrimSpace(v), "v")
	if _, ok := releaseDefaults()[tag]; ok {
		return tag, nil
	}
	return "", fmt.Errorf("--from-version %s: migrate knows the defaults of the GPU Operator %s; name the nearest one, "+
		"or leave --from-version out to have them recognised", v, strings.Join(KnownVersions(), ", "))
}

// Source is the GPU Operator release an input's values are read against.
type Source struct {
	// Version is the release whose defaults are dropped; "" when none was given or recognised: then every value is
	// taken as the site's.
	Version string
	// How says how migrate knows the release, or that it does not.
	How string
	// Doubt, when set, is why the reader must check the release: the report lists it as a decision.
	Doubt string
}

// defaults are the values of the release the input came from, or of OperatorTag, whose keys the table follows, when
// it is not known.
func (s Source) defaults() map[string]any {
	if d, ok := releaseDefaults()[s.Version]; ok {
		return d
	}
	return releaseDefaults()[OperatorTag]
}

// FromVersion is the Source a --from-version names; it says so when the values look like another release's.
func FromVersion(tag string, values map[string]any) Source {
	s := Source{Version: tag, How: "given with --from-version"}
	if seen := Recognise(values); seen.Version != "" && seen.Version != tag {
		s.How += "; mind that its operand image versions look like " + seen.Version + "'s (" + seen.How + ")"
		s.Doubt = "the file looks like a copy of the GPU Operator " + seen.Version + "'s values.yaml, not " + tag + "'s: " +
			"the " + seen.Version + " defaults in it are kept as the site's settings and pin that release's images; check --from-version"
	}
	return s
}

// minRecognised is how many default image versions of one release an input must carry to be read as its copy.
const minRecognised = 3

// Recognise names the release whose default operand image versions (driver.version, toolkit.version, ...) the
// values carry: the one matching the most, if it matches at least minRecognised and more than half of the image
// versions the values set. A file of the site's own settings sets few versions, each the site's choice: it is not
// recognised, and nothing in it is dropped.
func Recognise(values map[string]any) Source {
	set := setImageVersions(values)
	best, bestMatch := "", -1
	for _, tag := range KnownVersions() {
		// on a tie, the later release wins: its defaults are nearer this chart's
		if n := matchingImageVersions(values, releaseDefaults()[tag]); n >= bestMatch {
			best, bestMatch = tag, n
		}
	}
	counted := fmt.Sprintf("%d of the %d operand image versions it sets are %s's defaults", bestMatch, set, best)
	if bestMatch == 0 {
		counted = fmt.Sprintf("none of the %d operand image versions it sets is a known release's default", set)
	}
	if bestMatch < minRecognised || 2*bestMatch <= set {
		return unrecognised(values, counted)
	}
	return Source{Version: best, How: "recognised: " + counted}
}

// unrecognised is the Source of values no known release's defaults match: v26.7.0's keys, nothing dropped. A full
// copy of a release migrate does not vendor is a decision: its defaults would pin that release's images.
func unrecognised(values map[string]any, counted string) Source {
	known := strings.Join(KnownVersions(), ", ")
	s := Source{How: "no known release's defaults recognised (" + counted + "; migrate knows " + known +
		"): the keys are read as GPU Operator " + OperatorTag + "'s and every value is kept as the site's; " +
		"if the file is a full copy of a release's values.yaml, name it with --from-version"}
	if looksLikeFullCopy(values) {
		s.Doubt = "the file holds most keys of a GPU Operator values.yaml, as a full copy does, but the defaults of no release " +
			"migrate knows (" + counted + "): every default in it is kept as a site setting and pins that release's images; " +
			"name the nearest release with --from-version (" + known + "), or delete the keys the site did not change"
	}
	return s
}

// looksLikeFullCopy: values holding most keys of a known release's values.yaml are a copy of one, whatever its
// release; a site's own file holds the few keys it changes.
func looksLikeFullCopy(values map[string]any) bool {
	for _, d := range releaseDefaults() {
		held, all := 0, 0
		for _, p := range leafPaths("", d) {
			all++
			if _, ok := getPath(values, p); ok {
				held++
			}
		}
		if 2*held > all {
			return true
		}
	}
	return false
}

// leafPaths are the paths of v's scalars, lists and empty maps.
func leafPaths(prefix string, v any) []string {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return []string{prefix}
	}
	var out []string
	for k, x := range m {
		out = append(out, leafPaths(strings.TrimPrefix(prefix+"."+k, "."), x)...)
	}
	return out
}

// imageVersionPaths are the paths of a release's default image versions: each non-empty `version` leaf.
func imageVersionPaths(prefix string, defaults map[string]any) map[string]string {
	out := map[string]string{}
	for k, v := range defaults {
		p := strings.TrimPrefix(prefix+"."+k, ".")
		switch t := v.(type) {
		case map[string]any:
			maps.Copy(out, imageVersionPaths(p, t))
		case string:
			if k == "version" && t != "" {
				out[p] = t
			}
		}
	}
	return out
}

// matchingImageVersions counts the default image versions of a release that values carry unchanged.
func matchingImageVersions(values, defaults map[string]any) int {
	n := 0
	for p, want := range imageVersionPaths("", defaults) {
		if got, ok := getPath(values, p); ok && got == want {
			n++
		}
	}
	return n
}

// setImageVersions counts the image versions values sets, at the paths any known release has one.
func setImageVersions(values map[string]any) int {
	paths := map[string]bool{}
	for _, d := range releaseDefaults() {
		for p := range imageVersionPaths("", d) {
			paths[p] = true
		}
	}
	n := 0
	for p := range paths {
		if got, ok := getPath(values, p); ok && got != "" && got != nil {
			n++
		}
	}
	return n
}

// dropDefaults returns values without what equals defaults, and reports each key it dropped: a whole subtree in
// one entry where all of it is the default. A key the defaults lack, or an empty map (which changes nothing in
// Helm's merge, and the converter reports), is kept. So is the `enabled` switch of a block the site changed
// otherwise: its settings (a ServiceMonitor's interval) mean something only with the block on or off as it ran.
func dropDefaults(prefix string, values, defaults map[string]any, tag string, report *[]Entry) map[string]any {
	kept := map[string]any{}
	if _, has := values["enabled"]; has && prefix != "" && differsBesides(values, defaults, "enabled") {
		kept["enabled"] = values["enabled"]
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if _, done := kept[k]; done {
			continue
		}
		p := strings.TrimPrefix(prefix+"."+k, ".")
		v, d := values[k], defaults[k]
		_, hasDefault := defaults[k]
		vm, vIsMap := v.(map[string]any)
		dm, dIsMap := d.(map[string]any)
		switch {
		case hasDefault && equal(v, d):
			*report = append(*report, Entry{Key: p, Action: Dropped, Why: defaultWhy(v, tag)})
		case vIsMap && dIsMap && len(vm) > 0:
			if sub := dropDefaults(p, vm, dm, tag, report); len(sub) > 0 {
				kept[k] = sub
			}
		default:
			kept[k] = v
		}
	}
	return kept
}

// differsBesides reports whether values sets a key other than skip to something else than defaults.
func differsBesides(values, defaults map[string]any, skip string) bool {
	for k, v := range values {
		if d, has := defaults[k]; k != skip && (!has || !equal(v, d)) {
			return true
		}
	}
	return false
}

// defaultWhy is the report's reason for a dropped default, naming a scalar's value.
func defaultWhy(v any, tag string) string {
	why := "the GPU Operator " + tag + " default: not a site setting, this chart's own applies"
	switch v.(type) {
	case map[string]any, []any, nil:
		return why
	}
	return show(v) + ": " + why
}
