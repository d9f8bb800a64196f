package stackcli

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/kube/apiretry"
)

// DefaultNamespace is the release namespace of the README's install (helm install gpu ... -n gpu-operator).
const DefaultNamespace = "gpu-operator"

// NamespaceHelp ends the help of each admin command that reads the release (status, upgrade status / retry, plan).
const NamespaceHelp = "The release namespace is -n/--namespace, else the kubeconfig context's, else " + DefaultNamespace + " (the chart's default)."

// Namespace is the release namespace the admin's commands read (NamespaceHelp), and where it came from, for their
// errors. A user's kubeconfig context often names no namespace, and its "default" is never where the chart is; the
// hooks instead take theirs from their pod (clients).
func (s Scope) Namespace() (ns, from string, err error) { return adminNamespace(s.Flags) }

func adminNamespace(flags *genericclioptions.ConfigFlags) (ns, from string, err error) {
	if flags.Namespace != nil && *flags.Namespace != "" {
		return *flags.Namespace, "--namespace", nil
	}
	raw, err := flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil && !clientcmd.IsEmptyConfig(err) {
		return "", "", err
	}
	name := raw.CurrentContext
	if flags.Context != nil && *flags.Context != "" {
		name = *flags.Context
	}
	if c := raw.Contexts[name]; c != nil && c.Namespace != "" {
		return c.Namespace, "the kubeconfig context " + name, nil
	}
	return DefaultNamespace, "the chart's default; no -n, and the kubeconfig context names none", nil
}

// adminClients are clients for the admin's commands: the clientset and the release namespace with its source.
func adminClients(flags *genericclioptions.ConfigFlags) (client kubernetes.Interface, ns, from string, err error) {
	if _, client, _, err = clients(flags); err != nil {
		return nil, "", "", err
	}
	ns, from, err = adminNamespace(flags)
	return client, ns, from, err
}

// partOfLabel marks every object the chart renders; its DaemonSets also carry their release's instance label.
const partOfLabel, instanceLabel = "app.kubernetes.io/part-of", "app.kubernetes.io/instance"

// findRelease fails unless namespace holds the chart's DaemonSets of release (of any release when ""), naming
// where it looked and the releases it found there: a view of the wrong namespace would show every node as
// having no driver, and an exit 0 says that is the truth.
func findRelease(ctx context.Context, client kubernetes.Interface, namespace, from, release string) error {
	sel := labels.Set{partOfLabel: "kube-gpu-stack"}
	if release != "" {
		sel[instanceLabel] = release
	}
	list, err := apiretry.Value(ctx, func(ctx context.Context) ([]string, error) {
		dss, err := client.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{LabelSelector: partOfLabel + "=kube-gpu-stack"})
		if err != nil {
			return nil, err
		}
		found := map[string]bool{}
		for _, ds := range dss.Items {
			found[ds.Labels[instanceLabel]] = true
		}
		return slices.Sorted(maps.Keys(found)), nil
	})
	if err != nil {
		return fmt.Errorf("look for the release's DaemonSets in namespace %q: %w", namespace, err)
	}
	if release == "" && len(list) > 0 || slices.Contains(list, release) {
		return nil
	}
	what := "no kube-gpu-stack release"
	if release != "" {
		what += fmt.Sprintf(" %q", release)
	}
	there := "none"
	if len(list) > 0 {
		there = strings.Join(list, ", ")
	}
	return fmt.Errorf("%s in namespace %q (%s): no DaemonSet there carries %s (releases there: %s); name the release's namespace with -n and its name with --release",
		what, namespace, from, sel, there)
}

// ForContext is the scope with the kubeconfig context name instead of the one the flags select: one cluster of a
// view of several (status --context a --context b). It keeps the flags that are the user's (the kubeconfig file, -n,
// --release, impersonation, the request timeout); those that name one cluster's server or credentials (--server,
// --token, --certificate-authority, --cluster, --user, ...) are left to each context.
func (s Scope) ForContext(name string) Scope {
	f := genericclioptions.NewConfigFlags(true)
	f.Context = &name
	f.CacheDir, f.KubeConfig, f.Namespace, f.Timeout, f.DisableCompression = s.Flags.CacheDir, s.Flags.KubeConfig, s.Flags.Namespace, s.Flags.Timeout, s.Flags.DisableCompression
	f.Impersonate, f.ImpersonateUID, f.ImpersonateGroup, f.ImpersonateUserExtra = s.Flags.Impersonate, s.Flags.ImpersonateUID, s.Flags.ImpersonateGroup, s.Flags.ImpersonateUserExtra
	return Scope{Flags: f, Release: s.Release, Now: s.Now}
}

// Contexts are the kubeconfig's context names, sorted.
func (s Scope) Contexts() ([]string, error) {
	raw, err := s.Flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(raw.Contexts)), nil
}
