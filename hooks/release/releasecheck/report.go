package releasecheck

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

// Report ConfigMap keys.
const (
	ReportTextKey  = "report.txt"
	ReportJSONKey  = "report.json"
	ReportPoolsKey = "driver-pools.json"
	ReportStateKey = "state"
)

// Verdict is the report's one-word outcome.
func (r *Report) Verdict() string {
	switch {
	case r.Passed() && r.Summary[Rolling] > 0:
		return "passed, driver rollout rolling on"
	case r.Passed():
		return "passed"
	case r.Settled():
		return "failed"
	}
	return "in progress"
}

// WriteTable prints the node × operand grid (ok / wait / FAIL / roll, "." where the operand does not run), with each node's
// allocation mode (device-plugin / dra) when some node has one, then one line per cell that is not ready with its
// reason, then the cluster-level problems.
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "kube-gpu-stack release %s in %s: %s (%d ready, %d waiting, %d failed", r.Release, r.Namespace,
		r.Verdict(), r.Summary[Ready], r.Summary[Waiting], r.Summary[Failed])
	if r.Summary[Rolling] > 0 {
		fmt.Fprintf(w, ", %d rolling", r.Summary[Rolling])
	}
	fmt.Fprint(w, ")")
	if r.Elapsed != "" {
		fmt.Fprintf(w, " after %s", r.Elapsed)
	}
	fmt.Fprintln(w)
	width := len("node")
	allocWidth := 0 // the allocation column, shown once some node has a mode
	for _, n := range r.Nodes {
		width = max(width, len(n.Name))
		if n.Allocation != "" {
			allocWidth = max(allocWidth, len("allocation"), len(n.Allocation))
		}
	}
	if len(r.Nodes) > 0 {
		fmt.Fprintf(w, "%-*s", width, "node")
		if allocWidth > 0 {
			fmt.Fprintf(w, "  %-*s", allocWidth, "allocation")
		}
		for _, op := range r.Operands {
			fmt.Fprintf(w, "  %s", op)
		}
		fmt.Fprintln(w)
		for _, n := range r.Nodes {
			fmt.Fprintf(w, "%-*s", width, n.Name)
			if allocWidth > 0 {
				fmt.Fprintf(w, "  %-*s", allocWidth, cmp.Or(n.Allocation, "-"))
			}
			for _, op := range r.Operands {
				mark := "."
				if c, ok := n.Cells[op]; ok {
					mark = map[State]string{Ready: "ok", Waiting: "wait", Failed: "FAIL", Rolling: "roll"}[c.State]
				}
				fmt.Fprintf(w, "  %-*s", len(op), mark)
			}
			fmt.Fprintln(w)
		}
	}
	for _, n := range r.Nodes {
		for _, op := range r.Operands {
			if c, ok := n.Cells[op]; ok && c.State != Ready {
				fmt.Fprintf(w, "%s %s %s: %s\n", n.Name, op, c.State, c.Reason)
			}
		}
	}
	for _, p := range r.Problems {
		fmt.Fprintf(w, "cluster %s: %s\n", p.State, p.Message)
	}
}

// Table returns WriteTable's output.
func (r *Report) Table() string {
	var b strings.Builder
	r.WriteTable(&b)
	return b.String()
}

// SaveConfigMap writes the report (table, JSON, verdict) and the driver pools it was checked against to the named
// ConfigMap, creating it on first use. The ConfigMap is the hook's output, not a chart object, so GitOps tools
// never see it drift; the pre-delete hook removes it.
func SaveConfigMap(ctx context.Context, client kubernetes.Interface, name string, r *Report, pools []driverpools.Pool) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	pj, err := json.Marshal(pools)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: r.Namespace,
			Labels: map[string]string{
				"app.kubernetes.io/instance":  r.Release,
				"app.kubernetes.io/part-of":   "kube-gpu-stack",
				"app.kubernetes.io/component": "validation-report",
			},
		},
		Data: map[string]string{ReportTextKey: r.Table(), ReportJSONKey: string(js), ReportPoolsKey: string(pj), ReportStateKey: r.Verdict()},
	}
	cms := client.CoreV1().ConfigMaps(r.Namespace)
	// retried: a gate that passed must not fail its release over one API error that may pass
	return wrap(apiretry.Do(ctx, func(ctx context.Context) error {
		_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		}
		return err
	}), name)
}

func wrap(err error, name string) error {
	if err != nil {
		return fmt.Errorf("write report ConfigMap %s: %w", name, err)
	}
	return nil
}

// LoadConfigMap reads a saved report and its pools.
func LoadConfigMap(ctx context.Context, client kubernetes.Interface, namespace, name string) (*Report, []driverpools.Pool, error) {
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("read report ConfigMap %s/%s (written by the post-install hook): %w", namespace, name, err)
	}
	var r Report
	if err := json.Unmarshal([]byte(cm.Data[ReportJSONKey]), &r); err != nil {
		return nil, nil, fmt.Errorf("report ConfigMap %s/%s: %s: %w", namespace, name, ReportJSONKey, err)
	}
	var pools []driverpools.Pool
	if raw := cm.Data[ReportPoolsKey]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &pools); err != nil {
			return nil, nil, fmt.Errorf("report ConfigMap %s/%s: %s: %w", namespace, name, ReportPoolsKey, err)
		}
	}
	slices.SortFunc(r.Nodes, func(a, b NodeRow) int { return strings.Compare(a.Name, b.Name) })
	return &r, pools, nil
}
