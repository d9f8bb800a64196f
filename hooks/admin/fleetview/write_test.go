package fleetview

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestWriteShowsAnUnreadableClusterAndCutsLongLists(t *testing.T) {
	var notes []NodeNote
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
		notes = append(notes, NodeNote{"gpu-" + n, "driver waiting: x"})
	}
	clusters := []Cluster{
		{Context: "prod", Namespace: "gpu-operator", Release: "gpu", Chart: "1.2.3", GPUNodes: 12, NotValidated: notes,
			Pools: []PoolDrivers{{Pool: "default", Drivers: []DriverNodes{{"595.91.07", 10}, {"600.10.01", 2}}}}},
		{Context: "lab", Namespace: "gpu-operator", Error: "dial tcp: connection refused"},
	}
	var b strings.Builder
	if err := Write(&b, clusters, FormatTable); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"default: 595.91.07 x10, 600.10.01 x2", "unreadable: dial tcp: connection refused",
		"prod: GPU nodes not validated (12)", "gpu-j: driver waiting: x", "... and 2 more (-o json lists every one)", "needs a look"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "gpu-k:") {
		t.Errorf("the table lists more than %d nodes:\n%s", detailLimit, out)
	}
	b.Reset()
	if err := Write(&b, clusters, FormatJSON); err != nil {
		t.Fatal(err)
	}
	var parsed struct{ Clusters []Cluster }
	if err := json.Unmarshal([]byte(b.String()), &parsed); err != nil || len(parsed.Clusters) != 2 || len(parsed.Clusters[0].NotValidated) != 12 {
		t.Errorf("json: %v %+v", err, parsed)
	}
	b.Reset()
	if err := Write(&b, clusters, FormatMarkdown); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "| CONTEXT | RELEASE |") || !strings.Contains(b.String(), "\n| lab | gpu-operator |") {
		t.Errorf("markdown:\n%s", b.String())
	}
	if err := Write(&b, clusters, "yaml"); err == nil || !strings.Contains(err.Error(), "table, json, markdown") {
		t.Errorf("an unknown format: %v", err)
	}
}
