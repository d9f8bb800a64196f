package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	notSlug = regexp.MustCompile(`[^a-z0-9 _-]`)
)

// slug is the anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
func slug(h string) string {
	return strings.ReplaceAll(notSlug.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
}

// anchors are the headings of a Markdown file (outside code blocks) as slugs.
func anchors(t *testing.T, path string) map[string]bool {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fenced.ReplaceAllString(string(raw), ""), -1) {
		out[slug(m[1])] = true
	}
	return out
}

// TestDocumentedLinksResolve: every relative link in the README and docs/ names a file of the repository, and an
// anchor in a Markdown file names one of its headings. The README links to the docs pages and the pages to each
// other's sections, so a page moved or a heading renamed breaks them silently otherwise.
func TestDocumentedLinksResolve(t *testing.T) {
	root := chartrender.RepoRoot()
	files := docFiles(t)
	links := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, m := range mdLink.FindAllStringSubmatch(fenced.ReplaceAllString(string(raw), ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(target, "#")
			file := f
			if path != "" {
				file = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: link %s: no such file", rel, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[anchor] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", rel, target, filepath.Base(file))
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the README links to the docs pages")
	}
	t.Logf("%d relative links in %d files resolve", links, len(files))
}

// TestReadmeIsAFrontDoor: the README stays short, and links to every page of docs/.
func TestReadmeIsAFrontDoor(t *testing.T) {
	root := chartrender.RepoRoot()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "\n"); n > 200 {
		t.Errorf("README.md has %d lines; keep it to 200 and move the detail into docs/", n)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if !strings.Contains(string(raw), "](docs/"+filepath.Base(p)+")") {
			t.Errorf("README.md does not link to docs/%s", filepath.Base(p))
		}
	}
}
