package gpumigrate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	sigsyaml "sigs.k8s.io/yaml"
)

// WriteValues writes the converted values as a plain values file for `helm install -f`.
func WriteValues(w io.Writer, r Result, source string) error {
	body, err := sigsyaml.Marshal(r.Values)
	if err != nil {
		return err
	}
	if len(r.Values) == 0 {
		body = nil
	}
	_, err = fmt.Fprintf(w, "# kube-gpu-stack values converted by `kube-gpu-stack migrate` from %s (GPU Operator %s keys).\n"+
		"%s# The report lists every input key: where it went, what was dropped and why, and what needs a decision.\n%s",
		source, OperatorTag, sourceComment(r.Source), body)
	return err
}

// sourceComment tells the values file's reader that the input's release defaults are not in it.
func sourceComment(s Source) string {
	if s.Version == "" {
		return ""
	}
	return "# Values equal to the GPU Operator " + s.Version + " defaults were dropped: this chart's own apply.\n"
}

// sourceLine is the report's line on the release the input was read against.
func sourceLine(s Source) string {
	if s.Version == "" {
		return "GPU Operator release: " + s.How
	}
	return "GPU Operator release: " + s.Version + " (" + s.How + "); every value equal to its default is dropped: \"the GPU Operator " + s.Version + " default\""
}

// Counts returns how many entries have each action.
func (r Result) Counts() map[Action]int {
	n := map[Action]int{}
	for _, e := range r.Report {
		n[e.Action]++
	}
	return n
}

// WriteReport writes the report: decisions and keys with no place first, then what was dropped, then what was
// mapped, and the operator's node labels (live mode).
func WriteReport(w io.Writer, r Result) error {
	n := r.Counts()
	fmt.Fprintf(w, "kube-gpu-stack migrate: %d keys: %d mapped, %d dropped, %d need a decision, %d with no place in kube-gpu-stack\n",
		len(r.Report), n[Mapped], n[Dropped], n[Decision], n[Unknown])
	if r.Source.How != "" {
		fmt.Fprintln(w, sourceLine(r.Source))
	}
	sections := []struct {
		a     Action
		title string
	}{
		{Decision, "NEEDS A DECISION"},
		{Unknown, "NO PLACE IN KUBE-GPU-STACK (not converted)"},
		{Dropped, "DROPPED"},
		{Mapped, "MAPPED"},
	}
	for _, s := range sections {
		if n[s.a] == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", s.title)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, e := range r.Report {
			if e.Action != s.a {
				continue
			}
			to := strings.Join(e.To, ", ")
			if to == "" {
				to = "-"
			}
			if e.Why == "" {
				fmt.Fprintf(tw, "  %s\t-> %s\n", e.Key, to)
			} else {
				fmt.Fprintf(tw, "  %s\t-> %s\t%s\n", e.Key, to, e.Why)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Nodes) > 0 {
		fmt.Fprintf(w, "\nNODE LABELS THE OPERATOR WROTE\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, l := range r.Nodes {
			fmt.Fprintf(tw, "  %s=%s\t%d nodes\t%s\n", l.Label, l.Value, l.Nodes, l.Note)
		}
		return tw.Flush()
	}
	return nil
}
