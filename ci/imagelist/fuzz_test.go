package imagelist

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParse: no images.txt content panics Parse (seeds in testdata/fuzz/FuzzParse run with every `go test`); an
// error names the line; every reference parsed passes CheckReference and names its registry, and Format then
// Parse gives the same references, sorted and unique.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, content string) {
		refs, err := Parse(content)
		if err != nil {
			if !strings.HasPrefix(err.Error(), FileName+":") {
				t.Fatalf("error %q does not name the line", err)
			}
			return
		}
		for _, r := range refs {
			if err := CheckReference(r); err != nil || RegistryOf(r) == "" {
				t.Fatalf("Parse accepted %q: %v", r, err)
			}
		}
		again, err := Parse(string(Format(refs)))
		if want := slices.Compact(slices.Sorted(slices.Values(refs))); err != nil || !slices.Equal(again, want) {
			t.Fatalf("Format then Parse of %q gives %q (%v), want %q", refs, again, err, want)
		}
	})
}
