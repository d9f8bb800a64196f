// Package stackcli is the `kube-gpu-stack` command as it runs in the cluster: the release-level hooks the chart
// runs as Jobs (check, cleanup, pre-upgrade), the MIG manager's seed-label, and the admin's views of them (status,
// upgrade status / retry). It links neither the helm SDK nor a registry client: the commands that need them (plan,
// migrate, image, airgap) are added by hooks/admin/admincli, on the admin's machine only.
package stackcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/refusal"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecheck"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/releasecleanup"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/release/upgradeplan"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/driverpools"
)

// DefaultReportConfigMap is where the post-install hook leaves its report.
const DefaultReportConfigMap = "kube-gpu-stack-validation-report"

// PreUpgradeJob is the chart's pre-upgrade hook Job (kube-gpu-stack.hookNames), on which a refusal is recorded;
// GateJob its post-install and post-upgrade validation gate.
const (
	PreUpgradeJob = "kube-gpu-stack-pre-upgrade"
	GateJob       = "kube-gpu-stack-validation-gate"
)

// DefaultWatchInterval is how often --watch redraws.
const DefaultWatchInterval = 5 * time.Second

// Scope is what every command under the root shares: the kubeconfig flags and --release.
type Scope struct {
	Flags   *genericclioptions.ConfigFlags
	Release *string
	// Now is the clock the commands stamp their writes with (the pre-upgrade plan's name): time.Now, or a node's
	// skewed clock where a harness plays one.
	Now *func() time.Time
}

// NewCommand returns the root command writing its output to out.
func NewCommand(out io.Writer) *cobra.Command {
	root, _ := NewRoot(out)
	return root
}

// NewRoot is NewCommand that also returns the root's shared flags, for commands added on top of it.
func NewRoot(out io.Writer) (*cobra.Command, Scope) {
	flags := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use:           "kube-gpu-stack",
		Short:         "Release-level hooks of the kube-gpu-stack chart and the admin's views of them",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	flags.AddFlags(root.PersistentFlags())
	var release string
	root.PersistentFlags().StringVar(&release, "release", "", "Helm release name")
	now := time.Now
	// the admin's commands first; the ones the chart's Jobs and containers run come last, under their own heading,
	// so that the first screen of --help is the admin's
	root.AddGroup(&cobra.Group{ID: AdminGroup, Title: "Commands:"}, &cobra.Group{ID: HookGroup, Title: "Run by the chart's hooks and pods (rarely by hand):"})
	inGroup := func(id string, cmds ...*cobra.Command) []*cobra.Command {
		for _, c := range cmds {
			c.GroupID = id
		}
		return cmds
	}
	root.AddCommand(inGroup(AdminGroup, statusCommand(flags, &release, out), upgradeCommand(flags, &release, out))...)
	root.AddCommand(inGroup(HookGroup, checkCommand(flags, &release, out), cleanupCommand(flags, &release, out),
		preUpgradeCommand(flags, &release, out, &now), seedLabelCommand(flags, out), keepRuntimeConfigCommand(out))...)
	root.SetHelpCommandGroupID(AdminGroup)
	root.SetCompletionCommandGroupID(AdminGroup)
	return root, Scope{Flags: flags, Release: &release, Now: &now}
}

// The groups of the root's --help: AdminGroup for a command an admin runs, HookGroup for one the chart runs.
const (
	AdminGroup = "admin"
	HookGroup  = "hooks"
)

// Clients returns the REST config, a clientset and the namespace the kubeconfig flags select.
func (s Scope) Clients() (*rest.Config, kubernetes.Interface, string, error) { return clients(s.Flags) }

// hookQPS and hookBurst pace the release-level hooks' client. Each of them is one process that walks every node (the
// gate, the pre-upgrade plan, the cleanup); at client-go's default of 5 requests/s the cleanup alone (about two
// requests per node) would take over 6 minutes on 1,000 nodes, past helm's default hook timeout. 50/s is what one
// kubectl-like client may fairly ask of the API server's 400 in-flight requests.
const hookQPS, hookBurst = 50, 100

func clients(flags *genericclioptions.ConfigFlags) (*rest.Config, kubernetes.Interface, string, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, nil, "", err
	}
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = hookQPS, hookBurst
	}
	// the clientset speaks protobuf, as the control plane's own components do: on 1,000 nodes the gate's watches
	// decode a few thousand pods and nodes, and JSON costs several times the memory and CPU; cfg stays JSON for the
	// dynamic clients (custom resources have no protobuf form)
	proto := rest.CopyConfig(cfg)
	proto.ContentType = runtime.ContentTypeProtobuf
	proto.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfig(proto)
	if err != nil {
		return nil, nil, "", err
	}
	ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
	return cfg, client, ns, err
}

// releaseScope reads what the release-level hooks share: the client, the release namespace and the driver pools.
func releaseScope(flags *genericclioptions.ConfigFlags, rawPools string) (kubernetes.Interface, string, []driverpools.Pool, error) {
	_, client, ns, err := clients(flags)
	if err != nil {
		return nil, "", nil, err
	}
	pools, err := driverpools.Parse(rawPools)
	return client, ns, pools, err
}

func checkCommand(flags *genericclioptions.ConfigFlags, release *string, out io.Writer) *cobra.Command {
	o := releasecheck.Options{}
	var pools string
	var deleteLeftOver bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Wait until every operand rolled out and every GPU node validated; print the node × operand table",
		Long: "The post-install/post-upgrade gate and the helm test: watches the release's DaemonSets, pods and nodes until\n" +
			"nothing is waiting or --timeout passes, prints the table, optionally saves it to a ConfigMap, and exits non-zero\n" +
			"when anything failed.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, o.Namespace, o.Pools, err = releaseScope(flags, pools); err != nil {
				return err
			}
			o.Release = *release
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			if deleteLeftOver {
				if err := upgradeplan.DeleteLeftOverDrivers(cmd.Context(), upgradeplan.Options{Client: o.Client, Namespace: o.Namespace,
					Release: o.Release, Pools: o.Pools}, out); err != nil {
					return err
				}
			}
			_, err = releasecheck.Run(cmd.Context(), o, out)
			return err
		},
	}
	cmd.Flags().BoolVar(&deleteLeftOver, "delete-left-over", false, "first delete the release's driver DaemonSets that no pool renders once their nodes' DaemonSets exist (left by upgrades that failed; needs delete on daemonsets)")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 4*time.Minute, "deadline; keep it below the Helm/Flux timeout")
	cmd.Flags().StringVar(&o.ReportConfigMap, "report-configmap", "", "save the report to this ConfigMap")
	cmd.Flags().StringVar(&pools, "driver-pools", os.Getenv("DRIVER_POOLS"), "driver pools as JSON (env DRIVER_POOLS)")
	cmd.Flags().BoolVar(&o.ResourceSlices, "resource-slices", false, "wait until each DRA node's gpu.nvidia.com ResourceSlices are published (needs list/watch on resourceslices)")
	return cmd
}

func cleanupCommand(flags *genericclioptions.ConfigFlags, release *string, out io.Writer) *cobra.Command {
	var del []string
	var sweep bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what the release put on nodes and the objects its hooks left (the pre-delete hook)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, client, ns, err := clients(flags)
			if err != nil {
				return err
			}
			o := releasecleanup.Options{Client: client, Namespace: ns, Release: *release, Sweep: sweep}
			for _, d := range del {
				obj, err := releasecleanup.ParseObject(d)
				if err != nil {
					return err
				}
				o.Delete = append(o.Delete, obj)
			}
			if o.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return releasecleanup.Run(cmd.Context(), o, out)
		},
	}
	cmd.Flags().StringArrayVar(&del, "delete", nil, "KIND/NAME of an object to delete (repeatable): the hooks' objects, and the release's cluster-scoped ones of any revision")
	cmd.Flags().BoolVar(&sweep, "sweep", false, "last, delete the release's ServiceAccounts, ConfigMaps, Services, Roles, RoleBindings, Deployments and monitoring objects left in the namespace (Helm-owned for this release; not hooks, not kept)")
	return cmd
}

// writeRefusal prints the refusal the pre-upgrade hook recorded on its Job, if the Job that refused is still there
// (the next upgrade's hook replaces it) and the API server still keeps the Event (its event TTL, an hour by default).
func writeRefusal(ctx context.Context, client kubernetes.Interface, ns string, out io.Writer) error {
	ev, err := refusal.Last(ctx, client, ns, PreUpgradeJob)
	if err != nil {
		return fmt.Errorf("read the pre-upgrade hook's refusal: %w", err)
	}
	if ev != nil {
		fmt.Fprintf(out, "\nThe last upgrade was refused by the pre-upgrade hook (%s; kubectl describe job -n %s %s):\n  %s\n",
			ev.LastTimestamp.UTC().Format(time.RFC3339), ns, PreUpgradeJob, ev.Message)
	}
	return nil
}

func statusCommand(flags *genericclioptions.ConfigFlags, release *string, out io.Writer) *cobra.Command {
	var live, watch bool
	var name string
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the node × operand table: the last report saved by the post-install hook, or --live",
		Long: "Prints the node × operand table: the last report the post-install hook saved, or with --live the cluster as it\n" +
			"is now, and, when the pre-upgrade hook refused the last upgrade, why. It fails when the namespace holds no\n" +
			"report (no release with --live). " + NamespaceHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, ns, from, err := adminClients(flags)
			if err != nil {
				return err
			}
			r, pools, err := releasecheck.LoadConfigMap(cmd.Context(), client, ns, name)
			if !live && !watch {
				if err != nil {
					return fmt.Errorf("%w (namespace from %s; or use --live)", err, from)
				}
				// one report per namespace: another release's is not this one's
				if *release != "" && r.Release != *release {
					return fmt.Errorf("the report in %s/%s is release %q's, not %q's (namespace from %s)", ns, name, r.Release, *release, from)
				}
				r.WriteTable(out)
				return writeRefusal(cmd.Context(), client, ns, out)
			}
			if err := findRelease(cmd.Context(), client, ns, from, *release); err != nil {
				return err
			}
			o := releasecheck.Options{Client: client, Namespace: ns, Release: *release, Pools: pools, Once: true}
			if r != nil {
				if o.Release == "" {
					o.Release = r.Release
				}
				// the saved report had DRA nodes: their slices are checked live too
				o.ResourceSlices = slices.ContainsFunc(r.Nodes, func(n releasecheck.NodeRow) bool { return n.Allocation == releasecheck.AllocationDRA })
			}
			o.Complete()
			if err := o.Validate(); err != nil {
				return err
			}
			if !watch {
				if _, err = releasecheck.Run(cmd.Context(), o, out); err != nil {
					return err
				}
				return writeRefusal(cmd.Context(), client, ns, out)
			}
			return upgradeplan.Watch(cmd.Context(), interval, out, time.Now, func(w io.Writer) error {
				if err := upgradeplan.WriteSummary(cmd.Context(), client, ns, GateJob, time.Now(), w); err != nil {
					return err
				}
				fmt.Fprintln(w)
				// a release still settling is what --watch is for: the table says what each node waits for
				if _, err := releasecheck.Run(cmd.Context(), o, w); err != nil && !errors.Is(err, releasecheck.ErrFailed) {
					return err
				}
				return writeRefusal(cmd.Context(), client, ns, w)
			})
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "evaluate the cluster now instead of reading the saved report")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "redraw the live table every --interval, with the nodes' upgrade states, each pool's canary and the validation gate's time left, until Ctrl-C (Helm prints the hooks' logs only once they end)")
	cmd.Flags().DurationVar(&interval, "interval", DefaultWatchInterval, "how often --watch redraws")
	cmd.Flags().StringVar(&name, "report-configmap", DefaultReportConfigMap, "ConfigMap the post-install hook saved its report to")
	return cmd
}
