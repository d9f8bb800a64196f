package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
)

// chartDashboards is where the chart ships the generated dashboards.
var chartDashboards = filepath.Join("..", "..", "charts", "kube-gpu-stack", "dashboards")

// The committed dashboards are exactly what the generator writes: editing the JSON by hand, or the Go without
// `make generate`, fails here.
func TestCommittedDashboardsAreGenerated(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	got, _ := filepath.Glob(filepath.Join(chartDashboards, "*.json"))
	names := func(ps []string) []string {
		var out []string
		for _, p := range ps {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if !slices.Equal(names(got), names(want)) {
		t.Fatalf("the chart ships %v, the generator writes %v: run `make generate`", names(got), names(want))
	}
	for _, p := range want {
		w, _ := os.ReadFile(p)
		g, err := os.ReadFile(filepath.Join(chartDashboards, filepath.Base(p)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(g, w) {
			t.Errorf("%s is stale: run `make generate`", filepath.Base(p))
		}
	}
}

// Write also removes a dashboard file the generator no longer defines.
func TestWriteRemovesDashboardsNoLongerDefined(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dropped.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "dropped.json")); !os.IsNotExist(err) {
		t.Fatalf("a dashboard no longer defined was kept: %v", err)
	}
}

// panel is what the checks read of a panel in the shipped JSON.
type panel struct {
	ID         *int            `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		RefID      string          `json:"refId"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type board struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

// shipped reads every dashboard the chart ships; it fails on invalid JSON.
func shipped(t *testing.T) map[string][]byte {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(chartDashboards, "*.json"))
	if len(paths) < 2 {
		t.Fatalf("the chart ships %d dashboards, want at least the fleet overview and the GPU node view", len(paths))
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Fatalf("%s is not valid JSON", p)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

// checkBoard returns what is wrong with one dashboard: panel ids missing or repeated, a panel or query whose
// datasource is not the ${datasource} variable, a target without an expr.
func checkBoard(b []byte) []string {
	var d board
	if err := json.Unmarshal(b, &d); err != nil {
		return []string{err.Error()}
	}
	var problems []string
	if d.UID == "" || d.Title == "" {
		problems = append(problems, "no uid or title")
	}
	seen := map[int]string{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			switch {
			case p.ID == nil:
				problems = append(problems, "panel "+p.Title+" has no id")
			case seen[*p.ID] != "":
				problems = append(problems, "panels "+seen[*p.ID]+" and "+p.Title+" share an id")
			default:
				seen[*p.ID] = p.Title
			}
			if p.Type != "row" {
				if !isVariable(p.Datasource) {
					problems = append(problems, "panel "+p.Title+": datasource "+string(p.Datasource)+" is not ${datasource}")
				}
				if len(p.Targets) == 0 {
					problems = append(problems, "panel "+p.Title+" has no query")
				}
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					problems = append(problems, "panel "+p.Title+": target "+tg.RefID+" has no expr")
				}
				if !isVariable(tg.Datasource) {
					problems = append(problems, "panel "+p.Title+": target "+tg.RefID+" datasource "+string(tg.Datasource)+" is not ${datasource}")
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	// anywhere else (variables, annotations): every datasource reference is the variable, never a fixed uid
	var anyDoc any
	_ = json.Unmarshal(b, &anyDoc)
	var refs func(v any, path string)
	refs = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if k == "datasource" {
					raw, _ := json.Marshal(c)
					if !isVariable(raw) {
						problems = append(problems, path+".datasource "+string(raw)+" is not ${datasource}")
					}
					continue
				}
				refs(c, path+"."+k)
			}
		case []any:
			for _, c := range v {
				refs(c, path+"[]")
			}
		}
	}
	refs(anyDoc, "")
	return problems
}

func isVariable(raw json.RawMessage) bool {
	var ref struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	return json.Unmarshal(raw, &ref) == nil && ref.Type == "prometheus" && ref.UID == "${datasource}"
}

// Every shipped dashboard: valid JSON, unique panel ids, the datasource a variable everywhere, an expr in every
// target.
func TestDashboardsAreWellFormed(t *testing.T) {
	for name, b := range shipped(t) {
		for _, p := range checkBoard(b) {
			t.Errorf("%s: %s", name, p)
		}
	}
}

// The checks above catch what they are for: each broken variant of a good dashboard is reported.
func TestDashboardChecksCatchMistakes(t *testing.T) {
	good := `{"uid":"u","title":"t","panels":[{"id":1,"type":"row","title":"r","panels":[]},
		{"id":2,"type":"timeseries","title":"p","datasource":{"type":"prometheus","uid":"${datasource}"},
		 "targets":[{"refId":"A","expr":"up","datasource":{"type":"prometheus","uid":"${datasource}"}}]}]}`
	if p := checkBoard([]byte(good)); len(p) != 0 {
		t.Fatalf("good dashboard reported: %v", p)
	}
	for name, bad := range map[string]string{
		"duplicate id":      strings.Replace(good, `"id":2`, `"id":1`, 1),
		"missing id":        strings.Replace(good, `"id":2,`, ``, 1),
		"fixed datasource":  strings.Replace(good, `"title":"p","datasource":{"type":"prometheus","uid":"${datasource}"}`, `"title":"p","datasource":{"type":"prometheus","uid":"P1809F7CD0C75ACF3"}`, 1),
		"fixed target ds":   strings.Replace(good, `"expr":"up","datasource":{"type":"prometheus","uid":"${datasource}"}`, `"expr":"up","datasource":{"type":"prometheus","uid":"abc"}`, 1),
		"empty expr":        strings.Replace(good, `"expr":"up"`, `"expr":" "`, 1),
		"fixed variable ds": strings.Replace(good, `"panels":[{"id":1`, `"templating":{"list":[{"name":"node","datasource":{"uid":"abc"}}]},"panels":[{"id":1`, 1),
	} {
		if p := checkBoard([]byte(bad)); len(p) == 0 {
			t.Errorf("%s: not reported", name)
		}
	}
}

var metricRef = regexp.MustCompile(`\b(DCGM_[A-Z0-9_]+|kube_gpu_stack_[a-z_]+|gpu_operator_[a-z_]+)\b`)

// Every metric a panel or variable reads is one the stack's exporter emits (validation.StackMetricNames), one of
// the DCGM metrics this generator declares (DCGMMetrics, which the chart's DCGM profile must enable) or one of the
// chart's recorded series (RecordedSeries; promcheck in tests/monitoring checks the rules record them); the
// last-Xid gauge is never used.
func TestDashboardsReadOnlyKnownMetrics(t *testing.T) {
	known := append(slices.Clone(validation.StackMetricNames()), DCGMMetrics()...)
	for _, r := range RecordedSeries() {
		known = append(known, metricRef.FindString(r)) // the name within level:metric:operations
	}
	used := map[string]bool{}
	for name, b := range shipped(t) {
		for _, m := range metricRef.FindAllString(string(b), -1) {
			used[m] = true
			if m == "DCGM_FI_DEV_XID_ERRORS" {
				t.Errorf("%s reads DCGM_FI_DEV_XID_ERRORS, the last-Xid gauge: use DCGM_EXP_XID_ERRORS_COUNT", name)
			} else if !slices.Contains(known, m) {
				t.Errorf("%s reads %s, which no exporter of the stack emits", name, m)
			}
		}
	}
	for _, m := range DCGMMetrics() {
		if !used[m] {
			t.Errorf("DCGMMetrics declares %s, which no panel reads", m)
		}
	}
}
