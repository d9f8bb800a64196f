package fleetview

import (
	"reflect"
	"testing"
)

func TestDiffNamesEveryLeafThatDiffersAndNothingElse(t *testing.T) {
	want := map[string]any{
		"driver":    map[string]any{"version": "600.10.01", "upgradePolicy": map[string]any{"maxUnavailable": "10%"}},
		"toolkit":   map[string]any{"enabled": true},
		"nodeLabel": map[string]any{},
		"list":      []any{"a", "b"},
		"number":    2,
	}
	have := map[string]any{
		"driver":  map[string]any{"version": "595.91.07", "upgradePolicy": map[string]any{"maxUnavailable": "10%"}},
		"toolkit": map[string]any{"enabled": true},
		"list":    []any{"a", "b"},
		"number":  2.0, // JSON's number, as Helm stores values
		"extra":   map[string]any{"on": false},
	}
	got := Diff(want, have)
	wantDrift := []Drift{
		{Key: "driver.version", Want: `"600.10.01"`, Have: `"595.91.07"`},
		{Key: "extra.on", Want: Absent, Have: "false"},
		{Key: "nodeLabel", Want: "{}", Have: Absent},
	}
	if !reflect.DeepEqual(got, wantDrift) {
		t.Errorf("Diff:\n got %+v\nwant %+v", got, wantDrift)
	}
	if d := Diff(want, want); len(d) != 0 {
		t.Errorf("a file against itself drifts: %+v", d)
	}
	if d := Diff(map[string]any{"list": []any{"a"}}, map[string]any{"list": []any{"a", "b"}}); len(d) != 1 || d[0].Key != "list" {
		t.Errorf("a list is one value: %+v", d)
	}
}
