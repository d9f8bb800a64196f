package chart

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// healthOn is the agent on with the DCGM exporter's health profile, which exports the Xid count it reads.
var healthOn = []string{"global.health.nodeCondition.enabled=true", "dcgmExporter.config.profile=health"}

// TestHealthAgentSources: the agent's env and privileges follow global.health.nodeCondition.source; whenever it may
// read the exporter it gets the URL of the node-local Service, which the exporter's chart renders with
// internalTrafficPolicy Local in front of the exporter's pods.
func TestHealthAgentSources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		source     string
		url, nvml  bool
		privileged bool
	}{
		{source: "auto", url: true, nvml: true, privileged: true},
		{source: "nvml", nvml: true, privileged: true},
		{source: "dcgm-exporter", url: true},
	} {
		t.Run(tc.source, func(t *testing.T) {
			stream := render(t, newestKube, []string{profileFile("container-only")}, append(healthOn, "global.health.nodeCondition.source="+tc.source)...)
			ds := daemonSet(t, stream, "nvidia-gpu-health")
			c := containerNamed(t, ds, "nvidia-gpu-health")
			if e, _ := envVar(c, "HEALTH_SOURCE"); e.Value != tc.source {
				t.Errorf("HEALTH_SOURCE=%q", e.Value)
			}
			e, ok := envVar(c, "HEALTH_DCGM_EXPORTER_URL")
			if ok != tc.url || (ok && e.Value != "http://nvidia-dcgm-exporter-node.gpu-operator.svc:9400/metrics") {
				t.Errorf("HEALTH_DCGM_EXPORTER_URL=%q (rendered %v)", e.Value, ok)
			}
			if _, ok := envVar(c, "HOST_ROOT"); ok != tc.nvml || (len(c.VolumeMounts) == 2) != tc.nvml {
				t.Errorf("NVML roots: HOST_ROOT rendered %v, mounts %+v", ok, c.VolumeMounts)
			}
			sc := c.SecurityContext
			if privileged := sc != nil && sc.Privileged != nil && *sc.Privileged; privileged != tc.privileged {
				t.Errorf("privileged %v, want %v", privileged, tc.privileged)
			}
			if !tc.privileged && (sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation) {
				t.Errorf("the exporter source runs as %+v, want non-root without privilege escalation", sc)
			}

			if !tc.url {
				for _, o := range objects(t, stream) {
					if o.kind() == "Service" && o.name() == "nvidia-dcgm-exporter-node" {
						t.Fatalf("node-local exporter Service rendered for source %s", tc.source)
					}
				}
				return
			}
			svc := decodeNamed[corev1.Service](t, stream, "Service", "nvidia-dcgm-exporter-node")
			if p := svc.Spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyLocal {
				t.Errorf("internalTrafficPolicy %v, want Local", p)
			}
			exp := daemonSet(t, stream, "nvidia-dcgm-exporter")
			for k, v := range svc.Spec.Selector {
				if exp.Spec.Template.Labels[k] != v {
					t.Errorf("selector %s=%s does not select the exporter's pods (%v)", k, v, exp.Spec.Template.Labels)
				}
			}
			// the exporter's ServiceMonitor selects the nvidia-dcgm-exporter Service by its name label: the node-local
			// one must not match, or Prometheus would scrape every exporter twice
			if svc.Labels["app.kubernetes.io/name"] == "nvidia-dcgm-exporter" {
				t.Errorf("the node-local Service carries the exporter Service's name label: %v", svc.Labels)
			}
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9400 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
				t.Errorf("ports %+v", svc.Spec.Ports)
			}
		})
	}
}

// TestHealthExporterSourceNeedsTheExporter: the dcgm-exporter source fails the render, naming the key, without the
// exporter or without the health profile's Xid count.
func TestHealthExporterSourceNeedsTheExporter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"dcgmExporter.enabled=false"}, "global.health.nodeCondition.source=dcgm-exporter reads the GPUs through the node's DCGM exporter, but dcgmExporter.enabled=false"},
		{[]string{"dcgmExporter.config.profile=default"}, "set dcgmExporter.config.profile=health"},
	} {
		set := append([]string{"global.health.nodeCondition.enabled=true", "global.health.nodeCondition.source=dcgm-exporter"}, tc.set...)
		_, err := renderErr(t, newestKube, []string{profileFile("container-only")}, set...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: render error %v, want %q", tc.set, err, tc.want)
		}
	}
	// the health profile, or a collectors ConfigMap of the user's own, is enough
	for _, set := range [][]string{{"dcgmExporter.config.profile=health"}, {"dcgmExporter.config.name=my-collectors"}} {
		set = append([]string{"global.health.nodeCondition.enabled=true", "global.health.nodeCondition.source=dcgm-exporter"}, set...)
		if _, err := renderErr(t, newestKube, []string{profileFile("container-only")}, set...); err != nil {
			t.Errorf("%v: %v", set, err)
		}
	}
}
