package fleetview

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Formats Write knows.
const (
	FormatTable    = "table"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
)

// Formats are the -o values, in the help's order.
var Formats = []string{FormatTable, FormatJSON, FormatMarkdown}

// detailLimit is how many nodes a list shows under the summary before it only counts the rest.
const detailLimit = 10

// Write prints the view in format: a summary of one row per cluster and, under it, each cluster's nodes that need
// a look; JSON is every field of every cluster.
func Write(out io.Writer, clusters []Cluster, format string) error {
	switch format {
	case FormatJSON:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"clusters": clusters})
	case FormatMarkdown:
		writeMarkdown(out, clusters)
		return nil
	case FormatTable, "":
		return writeTable(out, clusters)
	}
	return fmt.Errorf("output %q: want one of %s", format, strings.Join(Formats, ", "))
}

// row is a cluster's summary cells.
func row(c Cluster) []string {
	if c.Error != "" {
		return []string{c.Context, c.Namespace, "-", "-", "-", "-", "-", "-", "-", "unreadable: " + c.Error}
	}
	drift := "-"
	if c.DriftChecked {
		drift = fmt.Sprint(len(c.Drift))
	}
	return []string{c.Context, c.Namespace + "/" + c.Release, or(c.Chart), fmt.Sprint(c.GPUNodes), drivers(c.Pools),
		fmt.Sprint(len(c.NotValidated)), fmt.Sprint(len(c.Health)), fmt.Sprint(len(c.Upgrading)), drift, verdict(c)}
}

var header = []string{"CONTEXT", "RELEASE", "CHART", "GPU NODES", "DRIVERS (POOL: VERSION xNODES)", "NOT VALIDATED", "UNHEALTHY", "UPGRADING", "DRIFT", "VERDICT"}

// verdict is the cluster in a word or two: what to look at first.
func verdict(c Cluster) string {
	switch {
	case len(c.NotValidated) > 0 || len(c.Health) > 0:
		return "needs a look"
	case len(c.Upgrading) > 0:
		return "upgrading"
	case len(c.Drift) > 0:
		return "drifted"
	}
	return "ok"
}

func drivers(pools []PoolDrivers) string {
	var parts []string
	for _, p := range pools {
		var vs []string
		for _, d := range p.Drivers {
			vs = append(vs, fmt.Sprintf("%s x%d", d.Version, d.Nodes))
		}
		parts = append(parts, p.Pool+": "+strings.Join(vs, ", "))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func or(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func writeTable(out io.Writer, clusters []Cluster) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, c := range clusters {
		fmt.Fprintln(w, strings.Join(row(c), "\t"))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, c := range clusters {
		for _, d := range details(c) {
			fmt.Fprintf(out, "\n%s: %s\n", c.Context, d.title)
			for _, line := range d.lines {
				fmt.Fprintf(out, "  %s\n", line)
			}
		}
	}
	return nil
}

func writeMarkdown(out io.Writer, clusters []Cluster) {
	fmt.Fprintf(out, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat(" --- |", len(header)))
	for _, c := range clusters {
		cells := row(c)
		for i := range cells {
			cells[i] = strings.ReplaceAll(cells[i], "|", `\|`)
		}
		fmt.Fprintf(out, "| %s |\n", strings.Join(cells, " | "))
	}
	for _, c := range clusters {
		for _, d := range details(c) {
			fmt.Fprintf(out, "\n**%s**: %s\n\n", c.Context, d.title)
			for _, line := range d.lines {
				fmt.Fprintf(out, "- %s\n", strings.ReplaceAll(line, "|", `\|`))
			}
		}
	}
}

type detail struct {
	title string
	lines []string
}

// details are a cluster's lists under the summary, each cut at detailLimit nodes.
func details(c Cluster) []detail {
	var out []detail
	notes := func(title string, ns []NodeNote) {
		if len(ns) == 0 {
			return
		}
		d := detail{title: fmt.Sprintf("%s (%d)", title, len(ns))}
		for i, n := range ns {
			if i == detailLimit {
				d.lines = append(d.lines, fmt.Sprintf("... and %d more (-o json lists every one)", len(ns)-detailLimit))
				break
			}
			d.lines = append(d.lines, n.Node+": "+n.Note)
		}
		out = append(out, d)
	}
	notes("GPU nodes not validated", c.NotValidated)
	notes("GPU health", c.Health)
	notes("driver changes under way or failed", c.Upgrading)
	if len(c.Drift) > 0 {
		d := detail{title: fmt.Sprintf("values drift from the file (%d)", len(c.Drift))}
		for _, x := range c.Drift {
			d.lines = append(d.lines, fmt.Sprintf("%s: file %s, release %s", x.Key, x.Want, x.Have))
		}
		out = append(out, d)
	}
	return out
}
