package chart

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestMetricsNetworkPoliciesSelectTheirPodsAndPorts: with monitoring.networkPolicy each metrics port's policy
// selects exactly one DaemonSet's pods (found in the render by their template labels), names a port those pods
// serve, and admits only its readers: the scrapers for the node status exporter; the scrapers and the GPU health
// agent's pods for the DCGM exporter; the DCGM exporter's pods alone for the host engine. Enforcement is the
// network plugin's: no plugin runs in these tests.
func TestMetricsNetworkPoliciesSelectTheirPodsAndPorts(t *testing.T) {
	t.Parallel()
	scraper := `{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}`
	stream := render(t, newestKube, []string{profileFile("monitoring")}, "monitoring.networkPolicy.enabled=true",
		"monitoring.networkPolicy.scrapers[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
		"dcgm.enabled=true", "dcgmExporter.remoteHostEngine=nvidia-dcgm:5555",
		"global.health.nodeCondition.enabled=true")
	var daemonSets []appsv1.DaemonSet
	var policies []networkingv1.NetworkPolicy
	for _, doc := range strings.Split(stream, "\n---") {
		switch {
		case strings.Contains(doc, "\nkind: DaemonSet"):
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
				t.Fatal(err)
			}
			daemonSets = append(daemonSets, ds)
		case strings.Contains(doc, "\nkind: NetworkPolicy"):
			var np networkingv1.NetworkPolicy
			if err := yaml.Unmarshal([]byte(doc), &np); err != nil {
				t.Fatal(err)
			}
			policies = append(policies, np)
		}
	}
	selected := func(sel *metav1.LabelSelector) []string {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ds := range daemonSets {
			if s.Matches(labels.Set(ds.Spec.Template.Labels)) {
				names = append(names, ds.Name)
			}
		}
		return names
	}
	want := map[string]struct {
		port    int32
		readers []string // DaemonSets whose pods may connect, besides the scrapers
		scraper bool
	}{
		"nvidia-node-status-exporter-ingress": {8000, nil, true},
		"nvidia-dcgm-exporter-ingress":        {9400, []string{"nvidia-gpu-health"}, true},
		"nvidia-dcgm-ingress":                 {5555, []string{"nvidia-dcgm-exporter"}, false},
	}
	if len(policies) != len(want) {
		t.Fatalf("%d NetworkPolicies, want %d", len(policies), len(want))
	}
	for _, np := range policies {
		w, ok := want[np.Name]
		if !ok {
			t.Errorf("unexpected NetworkPolicy %s", np.Name)
			continue
		}
		pods := selected(&np.Spec.PodSelector)
		if len(pods) != 1 || pods[0]+"-ingress" != np.Name {
			t.Errorf("%s selects the pods of %v, want %s's alone", np.Name, pods, strings.TrimSuffix(np.Name, "-ingress"))
			continue
		}
		ds := daemonSets[slices.IndexFunc(daemonSets, func(d appsv1.DaemonSet) bool { return d.Name == pods[0] })]
		served := false
		for _, c := range ds.Spec.Template.Spec.Containers {
			served = served || slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == w.port })
		}
		if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntVal != w.port || !served {
			t.Errorf("%s: ingress %+v, want port %d, which %s serves (%v)", np.Name, np.Spec.Ingress, w.port, ds.Name, served)
			continue
		}
		var readers []string
		scrapers := 0
		for _, peer := range np.Spec.Ingress[0].From {
			if peer.PodSelector != nil {
				readers = append(readers, selected(peer.PodSelector)...)
			}
			if b, _ := yaml.Marshal(peer); peer.NamespaceSelector != nil && strings.Contains(string(b), "monitoring") {
				scrapers++
			}
		}
		if !slices.Equal(readers, w.readers) || (scrapers == 1) != w.scraper || len(np.Spec.Ingress[0].From) != len(w.readers)+scrapers {
			t.Errorf("%s admits the pods of %v and %d scraper peers (%s), want %v and scrapers %v", np.Name, readers, scrapers, scraper, w.readers, w.scraper)
		}
	}
	_, err := renderErr(t, newestKube, []string{profileFile("monitoring")}, "monitoring.networkPolicy.enabled=true")
	if err == nil || !strings.Contains(err.Error(), "monitoring.networkPolicy.scrapers") {
		t.Errorf("enabled with no scrapers: %v, want a render error naming monitoring.networkPolicy.scrapers", err)
	}
}
