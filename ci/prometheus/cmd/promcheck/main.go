// Command promcheck checks the PromQL the chart ships: every expression in a Prometheus rules file and in the panel
// targets of Grafana dashboard JSON files must parse, and every metric it selects must be one the exporters emit
// (a list of names, one a line) or a recording rule of the rules files records. It exits 1 naming each problem, so a rule on a metric no exporter serves fails CI
// instead of staying silent in production.
//
//	promcheck -metrics known.txt [-rules rules.yaml]... [-dashboard d.json]...
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// options are the command's flags.
type options struct {
	metrics    string
	rules      list
	dashboards list
}

func main() {
	var o options
	flag.StringVar(&o.metrics, "metrics", "", "file naming the metrics the exporters emit, one a line (# comments)")
	flag.Var(&o.rules, "rules", "Prometheus rules file (repeatable)")
	flag.Var(&o.dashboards, "dashboard", "Grafana dashboard JSON file (repeatable)")
	flag.Parse()
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "promcheck:", err)
		os.Exit(2)
	}
	problems, err := o.run(os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promcheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

func (o *options) validate() error {
	if o.metrics == "" {
		return errors.New("-metrics is required")
	}
	if len(o.rules)+len(o.dashboards) == 0 {
		return errors.New("nothing to check: give -rules or -dashboard")
	}
	return nil
}

// run checks every file and returns one line per problem.
func (o *options) run(out io.Writer) ([]string, error) {
	known, err := readMetrics(o.metrics)
	if err != nil {
		return nil, err
	}
	c := checker{known: known, p: parser.NewParser(parser.Options{})}
	for _, f := range o.rules {
		if err := c.rules(f); err != nil {
			return nil, err
		}
	}
	for _, f := range o.dashboards {
		if err := c.dashboard(f); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(out, "promcheck: %d expressions checked against %d metrics\n", c.exprs, len(known))
	return c.problems, nil
}

func readMetrics(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	known := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); line != "" && !strings.HasPrefix(line, "#") {
			known[line] = true
		}
	}
	if len(known) == 0 && s.Err() == nil {
		return nil, fmt.Errorf("%s names no metrics", path)
	}
	return known, s.Err()
}

type checker struct {
	known    map[string]bool
	p        parser.Parser
	exprs    int
	problems []string
}

// rules validates a rules file as Prometheus loads it, then checks each expression's metrics.
func (c *checker) rules(path string) error {
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, c.p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		c.problems = append(c.problems, err.Error())
	}
	if groups == nil {
		return nil
	}
	// a recording rule's series is one Prometheus emits: other rules and the dashboards may select it
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				c.known[r.Record] = true
			}
		}
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			c.expr(fmt.Sprintf("%s: group %s, rule %s", path, g.Name, name), r.Expr)
		}
	}
	return nil
}

// panel is the part of a Grafana panel holding queries; rows nest panels.
type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func (c *checker) dashboard(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		c.problems = append(c.problems, fmt.Sprintf("%s: not a dashboard: %v", path, err))
		return nil
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, t := range p.Targets {
				if strings.TrimSpace(t.Expr) != "" {
					c.expr(fmt.Sprintf("%s: panel %d %q, target %d", path, p.ID, p.Title, i), expandVariables(t.Expr))
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return nil
}

var (
	// Grafana's interval variables stand for a range; any duration parses the same.
	intervalVar = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)
	// Other dashboard variables ($node, ${node}, ${node:regex}, [[node]]) stand for label values.
	otherVar = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[A-Za-z0-9_]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z0-9_]+\]\]`)
)

// expandVariables replaces dashboard variables by values that parse, as Grafana substitutes them before querying.
func expandVariables(expr string) string {
	expr = intervalVar.ReplaceAllString(expr, "5m")
	return otherVar.ReplaceAllString(expr, "value")
}

// expr parses one expression and checks the metric of each selector.
func (c *checker) expr(where, expr string) {
	c.exprs++
	e, err := c.p.ParseExpr(expr)
	if err != nil {
		c.problems = append(c.problems, fmt.Sprintf("%s: %v", where, err))
		return
	}
	for _, sel := range parser.ExtractSelectors(e) {
		name := metricName(sel)
		if name == "" {
			c.problems = append(c.problems, fmt.Sprintf("%s: a selector without a fixed metric name (%v) cannot be checked", where, sel))
			continue
		}
		if !c.known[name] {
			c.problems = append(c.problems, fmt.Sprintf("%s: metric %s is emitted by no exporter the chart configures", where, name))
		}
	}
}

func metricName(sel []*labels.Matcher) string {
	i := slices.IndexFunc(sel, func(m *labels.Matcher) bool {
		return m.Name == labels.MetricName && m.Type == labels.MatchEqual
	})
	if i < 0 {
		return ""
	}
	return sel[i].Value
}
