package imagelist

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/yaml"
)

// ImagesAnnotation is Chart.yaml's Artifact Hub annotation listing the chart's images.
const ImagesAnnotation = "artifacthub.io/images"

// ArtifactHubImage is one entry of the artifacthub.io/images annotation.
type ArtifactHubImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// ArtifactHubImages names each reference (sorted, unique) for the annotation: the repository's last path part
// (driver, k8s-device-plugin), made longer only where that is ambiguous: then the tag (driver-570.195.03-rhel9),
// then the digest's first 12 hex digits, then the whole repository path, and last the whole reference.
func ArtifactHubImages(refs []string) []ArtifactHubImage {
	refs = slices.Compact(slices.Sorted(slices.Values(refs)))
	candidates := make([][]string, len(refs))
	for i, r := range refs {
		candidates[i] = nameCandidates(r)
	}
	level := make([]int, len(refs))
	for {
		count := map[string]int{}
		for i := range refs {
			count[candidates[i][level[i]]]++
		}
		changed := false
		for i := range refs {
			if count[candidates[i][level[i]]] > 1 && level[i] < len(candidates[i])-1 {
				level[i]++
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	out := make([]ArtifactHubImage, len(refs))
	for i, r := range refs {
		out[i] = ArtifactHubImage{Name: candidates[i][level[i]], Image: r}
	}
	return out
}

// nameCandidates are a reference's names, shortest first; the last, the reference itself, is always unique.
func nameCandidates(ref string) []string {
	repo, tag, digest := ref, "", ""
	if r, err := name.ParseReference(ref); err == nil {
		repo = r.Context().RepositoryStr()
		if t, err := name.NewTag(strings.Split(ref, "@")[0], name.StrictValidation); err == nil {
			tag = t.TagStr()
		}
		if d, ok := r.(name.Digest); ok {
			_, hex, _ := strings.Cut(d.DigestStr(), ":")
			digest = hex[:min(12, len(hex))]
		}
	}
	base := repo[strings.LastIndex(repo, "/")+1:]
	withTag := join(base, tag)
	withDigest := join(withTag, digest)
	return slices.Compact([]string{base, withTag, withDigest, join(strings.ReplaceAll(repo, "/", "-"), tag, digest), ref})
}

func join(parts ...string) string {
	return strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), "-")
}

// FormatArtifactHubImages is the annotation's value for a set of references, in one stable form (entries sorted
// by image, name before image), e.g. "- name: driver-rhel9\n  image: nvcr.io/nvidia/driver:595.91.07-rhel9\n".
func FormatArtifactHubImages(refs []string) string {
	var b strings.Builder
	for _, e := range ArtifactHubImages(refs) {
		fmt.Fprintf(&b, "- name: %s\n  image: %s\n", e.Name, e.Image)
	}
	return b.String()
}

// ParseArtifactHubImages reads the annotation's value.
func ParseArtifactHubImages(value string) ([]ArtifactHubImage, error) {
	var out []ArtifactHubImage
	if err := yaml.UnmarshalStrict([]byte(value), &out); err != nil {
		return nil, fmt.Errorf("%s annotation: %w", ImagesAnnotation, err)
	}
	return out, nil
}

// ChartAnnotations reads the annotations of a Chart.yaml.
func ChartAnnotations(chartYAML []byte) (map[string]string, error) {
	var c struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(chartYAML, &c); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %w", err)
	}
	return c.Annotations, nil
}

var annotationsLine = regexp.MustCompile(`(?m)^annotations:[ \t]*\n`)

// SetChartAnnotation returns chartYAML with one annotation's value replaced (or added at the end of the
// annotations mapping) as a literal block scalar, every other byte unchanged. value must end in a newline.
// Chart.yaml needs a top-level block-style `annotations:` mapping.
func SetChartAnnotation(chartYAML []byte, key, value string) ([]byte, error) {
	if !strings.HasSuffix(value, "\n") {
		return nil, fmt.Errorf("annotation %s: value must end in a newline", key)
	}
	text := string(chartYAML)
	loc := annotationsLine.FindStringIndex(text)
	if loc == nil {
		return nil, fmt.Errorf("Chart.yaml has no top-level block `annotations:` mapping to hold %s", key)
	}
	// The mapping runs until the next line that starts in column 0 (a top-level key).
	blockStart, blockEnd := loc[1], len(text)
	for i := blockStart; i < len(text); {
		eol := strings.IndexByte(text[i:], '\n')
		line := text[i:]
		if eol >= 0 {
			line = text[i : i+eol+1]
		}
		if trimmed := strings.TrimSpace(line); trimmed != "" && line[0] != ' ' && line[0] != '\t' {
			blockEnd = i
			break
		}
		i += len(line)
	}
	block := text[blockStart:blockEnd]
	indent := "  "
	if m := regexp.MustCompile(`^([ \t]+)\S`).FindStringSubmatch(block); m != nil {
		indent = m[1]
	}

	var entry strings.Builder
	fmt.Fprintf(&entry, "%s%s: |\n", indent, key)
	for line := range strings.Lines(value) {
		if line == "\n" {
			entry.WriteString(line)
			continue
		}
		entry.WriteString(indent + "  " + line)
	}

	keyLine := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(indent+key) + `:.*\n`)
	var newBlock string
	if m := keyLine.FindStringIndex(block); m != nil {
		// The old value is every following line that is blank or indented deeper than the key.
		end := m[1]
		for end < len(block) {
			eol := strings.IndexByte(block[end:], '\n')
			line := block[end:]
			if eol >= 0 {
				line = block[end : end+eol+1]
			}
			if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, indent+" ") && !strings.HasPrefix(line, indent+"\t") {
				break
			}
			end += len(line)
		}
		// Blank lines ending the old value belong to the file's layout, not to the value.
		for end > m[1] && strings.HasSuffix(block[:end], "\n\n") {
			end--
		}
		newBlock = block[:m[0]] + entry.String() + block[end:]
	} else {
		// Append after the last non-blank line of the mapping.
		trimmed := strings.TrimRight(block, " \t\n")
		cut := len(trimmed)
		if cut > 0 {
			cut++ // keep its newline
		}
		newBlock = block[:cut] + entry.String() + block[cut:]
	}
	out := []byte(text[:blockStart] + newBlock + text[blockEnd:])

	got, err := ChartAnnotations(out)
	if err != nil {
		return nil, fmt.Errorf("setting %s broke Chart.yaml: %w", key, err)
	}
	if got[key] != value {
		return nil, fmt.Errorf("setting %s in Chart.yaml did not round-trip: got %q", key, got[key])
	}
	return out, nil
}
