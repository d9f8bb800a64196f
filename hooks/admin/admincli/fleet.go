package admincli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/fleetview"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/stackcli"
)

// defaultClusterTimeout bounds the read of one cluster of the view: a cluster that does not answer is reported as
// such, and the others are not held up.
const defaultClusterTimeout = 30 * time.Second

// withFleetView gives the status command the view of several clusters: --context repeated, or --all-contexts,
// and -o json / markdown and --values (drift) for any number of them. A single --context without those is the
// command as it was, on that context.
func withFleetView(status *cobra.Command, scope stackcli.Scope, out io.Writer) {
	var contexts []string
	var all bool
	var output, valuesFile string
	var timeout time.Duration
	run := status.RunE
	status.Use = "status [--context NAME]... [--all-contexts] [-o table|json|markdown] [--values FILE]"
	status.Long += "\n\nWith several contexts (--context repeated, or --all-contexts), -o json or markdown, or --values, it prints\n" +
		"instead one row per cluster: the chart version, the drivers each pool runs, the GPU nodes not validated, those\n" +
		"whose GPU health condition is not True, the nodes whose driver change is under way or failed and, with --values,\n" +
		"how many of the release's values differ from the file; then those nodes and values by name. It only reads;\n" +
		"a cluster it cannot read is shown as such and the others still are."
	status.RunE = func(cmd *cobra.Command, args []string) error {
		if all {
			names, err := scope.Contexts()
			if err != nil {
				return err
			}
			contexts = names
		}
		fleet := len(contexts) > 1 || all || valuesFile != "" || output != fleetview.FormatTable
		if !fleet {
			if len(contexts) == 1 {
				*scope.Flags.Context = contexts[0]
			}
			return run(cmd, args)
		}
		for _, f := range []string{"live", "watch"} {
			if on, _ := cmd.Flags().GetBool(f); on {
				return fmt.Errorf("--%s shows one cluster's node table: leave out the several contexts, -o and --values", f)
			}
		}
		if !slices.Contains(fleetview.Formats, output) {
			return fmt.Errorf("-o %q: want one of %v", output, fleetview.Formats)
		}
		var want map[string]any
		if valuesFile != "" {
			raw, err := os.ReadFile(valuesFile)
			if err != nil {
				return err
			}
			if err := yaml.Unmarshal(raw, &want); err != nil {
				return fmt.Errorf("--values %s: %w", valuesFile, err)
			}
			if want == nil {
				want = map[string]any{}
			}
		}
		// the saved report names each release's driver pools
		reportConfigMap, err := cmd.Flags().GetString("report-configmap")
		if err != nil {
			return err
		}
		if len(contexts) == 0 {
			contexts = []string{*scope.Flags.Context} // the kubeconfig's current one when empty
		}
		var sources []fleetview.Source
		for _, name := range contexts {
			s, err := fleetSource(scope, name, want, reportConfigMap)
			if err != nil {
				return fmt.Errorf("context %q: %w", name, err)
			}
			sources = append(sources, s)
		}
		clusters := fleetview.CollectAll(cmd.Context(), sources, timeout)
		if err := fleetview.Write(out, clusters, output); err != nil {
			return err
		}
		for _, c := range clusters {
			if c.Error != "" {
				return errors.New("one or more clusters could not be read (see the table)")
			}
		}
		return nil
	}
	// shadows the root's --context (one name) on this command only: it may be given several times
	status.Flags().StringArrayVar(&contexts, "context", nil, "kubeconfig context `NAME` to read; repeat it for a view of several clusters")
	status.Flags().BoolVar(&all, "all-contexts", false, "the view of every context of the kubeconfig")
	status.Flags().StringVarP(&output, "output", "o", fleetview.FormatTable, "the view's format: table, json or markdown")
	status.Flags().StringVar(&valuesFile, "values", "", "a values `FILE` each cluster's release should run: the view counts and names the values that differ")
	status.Flags().DurationVar(&timeout, "cluster-timeout", defaultClusterTimeout, "how long the view waits for one cluster before it shows it as unreadable")
}

// fleetSource is one context's cluster: its client and release namespace as the other commands take them, and its
// release read through Helm's own storage.
func fleetSource(scope stackcli.Scope, name string, want map[string]any, reportConfigMap string) (fleetview.Source, error) {
	ctxScope := scope
	if name != "" {
		ctxScope = scope.ForContext(name)
	}
	_, client, _, err := ctxScope.Clients()
	if err != nil {
		return fleetview.Source{}, err
	}
	ns, _, err := ctxScope.Namespace()
	if err != nil {
		return fleetview.Source{}, err
	}
	display := name
	if display == "" {
		raw, err := ctxScope.Flags.ToRawKubeConfigLoader().RawConfig()
		if err != nil {
			return fleetview.Source{}, err
		}
		display = raw.CurrentContext
	}
	return fleetview.Source{
		Context: display, Client: client, Namespace: ns, Release: *scope.Release, Want: want, ReportConfigMap: reportConfigMap,
		ReadRelease: func(_ context.Context, release string) (fleetview.Recorded, error) {
			cfg := new(action.Configuration)
			if err := cfg.Init(ctxScope.Flags, ns, "secret", func(string, ...any) {}); err != nil {
				return fleetview.Recorded{}, err
			}
			rel, err := action.NewGet(cfg).Run(release)
			if err != nil {
				return fleetview.Recorded{}, err
			}
			computed, err := chartutil.CoalesceValues(rel.Chart, rel.Config)
			if err != nil {
				return fleetview.Recorded{}, err
			}
			return fleetview.Recorded{ChartVersion: rel.Chart.Metadata.Version, UserValues: rel.Config, ComputedValues: computed}, nil
		},
	}, nil
}
