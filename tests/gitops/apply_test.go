package gitops

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// renderRelease renders the repository's chart without a cluster, as `helm template` does (lookup finds nothing;
// the newest supported Kubernetes and its API versions given, plus apis), under a release name and namespace.
func renderRelease(t *testing.T, name, namespace string, includeCRDs bool, files, set []string, apis ...string) *release.Release {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartrender.Values(files, set)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := chartutil.ParseKubeVersion(chartrender.Newest)
	if err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	inst.ClientOnly, inst.DryRun, inst.Replace, inst.IncludeCRDs = true, true, true, includeCRDs
	inst.ReleaseName, inst.Namespace = name, namespace
	inst.KubeVersion, inst.APIVersions = kv, append(slices.Clone(chartrender.APIVersions), apis...)
	rel, err := inst.RunWithContext(t.Context(), chrt, vals)
	if err != nil {
		t.Fatalf("helm template %v %v: %v", files, set, err)
	}
	return rel
}

// dynamicClients talks to any kind of the cluster: a dynamic client and a RESTMapper from discovery.
func dynamicClients(t *testing.T) (dynamic.Interface, *restmapper.DeferredDiscoveryRESTMapper) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
}

// parseObjects decodes every object of a manifest stream as `helm template` prints it, each with the template it
// came from.
func parseObjects(t *testing.T, stream string) []renderedObject {
	t.Helper()
	var out []renderedObject
	for _, doc := range strings.Split(stream, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---")
		source := ""
		if m := sourceLine.FindStringSubmatch(doc); m != nil {
			source = m[1]
		}
		body, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if string(body) == "null" {
			continue // a template that rendered nothing but comments
		}
		o := renderedObject{source: source, body: body, fields: decodeJSON(t, body)}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(body); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		o.gvk, o.name, o.ns = u.GroupVersionKind(), u.GetName(), u.GetNamespace()
		out = append(out, o)
	}
	return out
}

var sourceLine = regexp.MustCompile(`(?m)^# Source: (.+)$`)
