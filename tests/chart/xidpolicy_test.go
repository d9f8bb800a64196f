package chart

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpuhealth"
)

// xidConsumers are what one render makes of an Xid in each place that judges it.
type xidConsumers struct {
	disable, enable string                       // the device plugin's health env
	agent           gpuhealth.Policy             // the GPU health agent's, from its env
	alerts          map[string]func(string) bool // the Xid alerts' selectors on the xid label
	severity        map[string]string
	npd             []npdRule // the Node Problem Detector kernel-log monitor's rules
}

// npdRule is one rule of a Node Problem Detector log monitor.
type npdRule struct {
	Type      string `json:"type"`
	Condition string `json:"condition"`
	Reason    string `json:"reason"`
	Pattern   string `json:"pattern"`
}

// npdReading is what the monitor makes of the kernel log line the driver writes for xid: the matching rule's
// type and reason ("" when none matches). NPD matches a rule's pattern against the whole message.
func (c xidConsumers) npdReading(t *testing.T, xid uint64) string {
	line := fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): %d, pid=4242, name=python3, Ch 00000008", xid)
	var got []string
	for _, r := range c.npd {
		if regexp.MustCompile("^(?:" + r.Pattern + ")$").MatchString(line) {
			got = append(got, r.Type+" "+r.Reason)
		}
	}
	if len(got) > 1 {
		t.Errorf("Xid %d matches %d rules: %v", xid, len(got), got)
	}
	return strings.Join(got, ",")
}

// TestEveryXidMeansTheSameEverywhere: one render's device plugin, GPU health agent (the node condition), Xid
// alerts and Node Problem Detector kernel-log monitor read global.health.xids alike for every Xid from 1 to 160, for the default policy and a changed one: a
// fatal Xid takes the GPU out of the device plugin, makes the condition False, pages (GPUXidFatal, critical) and sets
// NPD's condition; an application Xid does none of that, only informs (GPUXidApplication) and is an NPD event; an
// Xid in neither tier warns (GPUXid), is nothing to NPD,
// leaves the condition True, and the device plugin takes the GPU out unless it is one of the six the plugin always
// ignores. The default policy's reading of every listed Xid, and of the unlisted ones the plugin ignores, is the
// golden testdata/xid-policy.golden.
func TestEveryXidMeansTheSameEverywhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		set  []string
	}{
		{"default", nil},
		{"changed", []string{"global.health.xids.fatal={79,109,31}", "global.health.xids.application={13,92}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := renderXidConsumers(t, tc.set...)
			var golden strings.Builder
			for xid := uint64(1); xid <= 160; xid++ {
				class := c.agent.Classify(xid)
				var matched []string
				for _, name := range []string{"GPUXidFatal", "GPUXidApplication", "GPUXid"} {
					if sel := c.alerts[name]; sel != nil && sel(fmt.Sprint(xid)) {
						matched = append(matched, name)
					}
				}
				out := !devicePluginIgnores(c.disable, c.enable, xid)
				builtIn := devicePluginIgnores("", "", xid)
				var want []string
				wantOut, wantNPD := false, ""
				switch class {
				case gpuhealth.Fatal:
					want, wantOut, wantNPD = []string{"GPUXidFatal"}, true, "permanent FatalXid"
				case gpuhealth.Application:
					want, wantNPD = []string{"GPUXidApplication"}, "temporary ApplicationXid"
				default:
					want, wantOut = []string{"GPUXid"}, !builtIn
				}
				npd := c.npdReading(t, xid)
				if strings.Join(matched, ",") != strings.Join(want, ",") || out != wantOut || npd != wantNPD {
					t.Errorf("Xid %d: the agent reads it %s, the alerts %v (want %v), the device plugin takes the GPU out: %v (want %v), the NPD monitor %q (want %q)",
						xid, class, matched, want, out, wantOut, npd, wantNPD)
				}
				if class != gpuhealth.Unlisted || builtIn {
					condition := "True"
					if class == gpuhealth.Fatal {
						condition = "False"
					}
					fmt.Fprintf(&golden, "Xid %3d  %-11s  condition %-5s  alert %s (%s)  device plugin: %s  NPD: %s\n", xid, class, condition,
						strings.Join(matched, ","), c.severity[strings.Join(matched, ",")], map[bool]string{true: "GPU out", false: "GPU kept"}[out],
						cmp.Or(npd, "-"))
				}
			}
			if tc.name == "default" {
				path := filepath.Join("testdata", "xid-policy.golden")
				if updateGolden {
					if err := os.WriteFile(path, []byte(golden.String()), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if string(want) != golden.String() {
					t.Errorf("%s differs:\n%s\nreview the change, then UPDATE_GOLDEN=1", path, lineDiff(string(want), golden.String()))
				}
			}
		})
	}
}

// renderXidConsumers renders the monitoring profile with the health agent on and reads each consumer's policy.
func renderXidConsumers(t *testing.T, set ...string) xidConsumers {
	t.Helper()
	stream := render(t, newestKube, []string{profileFile("monitoring")},
		append([]string{"global.health.nodeCondition.enabled=true", "global.health.nodeProblemDetector.enabled=true"}, set...)...)
	var c xidConsumers
	dp := containerNamed(t, daemonSet(t, stream, "nvidia-device-plugin-daemonset"), "nvidia-device-plugin")
	d, _ := envVar(dp, "DP_DISABLE_HEALTHCHECKS")
	e, _ := envVar(dp, "DP_ENABLE_HEALTHCHECKS")
	c.disable, c.enable = d.Value, e.Value
	agent := containerNamed(t, daemonSet(t, stream, "nvidia-gpu-health"), "nvidia-gpu-health")
	for name, into := range map[string]*[]uint64{"HEALTH_FATAL_XIDS": &c.agent.Fatal, "HEALTH_APPLICATION_XIDS": &c.agent.Application} {
		v, _ := envVar(agent, name)
		xids, err := gpuhealth.ParseXids(v.Value)
		if err != nil {
			t.Fatalf("%s=%q: %v", name, v.Value, err)
		}
		*into = xids
	}
	c.alerts, c.severity = map[string]func(string) bool{}, map[string]string{}
	for _, o := range objects(t, stream) {
		if o.kind() != "PrometheusRule" {
			continue
		}
		b, err := yaml.Marshal(o.Raw["spec"])
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Groups []struct {
				Rules []struct {
					Alert  string            `json:"alert"`
					Expr   string            `json:"expr"`
					Labels map[string]string `json:"labels"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := yaml.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		for _, g := range spec.Groups {
			for _, r := range g.Rules {
				if sel := xidSelector(r.Expr); sel != nil && strings.HasPrefix(r.Alert, "GPUXid") {
					c.alerts[r.Alert], c.severity[r.Alert] = sel, r.Labels["severity"]
				}
			}
		}
	}
	cm := decodeNamed[corev1.ConfigMap](t, stream, "ConfigMap", "nvidia-xid-kernel-monitor")
	var monitor struct {
		Plugin     string    `json:"plugin"`
		Conditions []npdRule `json:"conditions"`
		Rules      []npdRule `json:"rules"`
	}
	if err := json.Unmarshal([]byte(cm.Data["kernel-monitor-nvidia-xid.json"]), &monitor); err != nil {
		t.Fatalf("the NPD monitor: %v", err)
	}
	if monitor.Plugin != "kmsg" || len(monitor.Conditions) != 1 || monitor.Conditions[0].Type != "GPUXidFatal" {
		t.Errorf("the NPD monitor reads %q with conditions %+v", monitor.Plugin, monitor.Conditions)
	}
	for _, r := range monitor.Rules {
		if r.Type == "permanent" && r.Condition != monitor.Conditions[0].Type {
			t.Errorf("rule %+v sets a condition the monitor does not declare", r)
		}
	}
	c.npd = monitor.Rules
	if c.alerts["GPUXid"] == nil {
		t.Fatal("no GPUXid alert rendered")
	}
	return c
}

var (
	xidMatch    = regexp.MustCompile(`xid=~"([^"]*)"`)
	xidNotMatch = regexp.MustCompile(`xid!~"([^"]*)"`)
)

// xidSelector is an alert's selector on the xid label, anchored as PromQL anchors its matchers: xid=~"A" matches
// ^(?:A)$, and xid!="" with xid!~"B" every Xid but ^(?:B)$. Nil when the expression selects no Xid.
func xidSelector(expr string) func(string) bool {
	if m := xidMatch.FindStringSubmatch(expr); m != nil {
		return regexp.MustCompile("^(?:" + m[1] + ")$").MatchString
	}
	if !strings.Contains(expr, "DCGM_EXP_XID_ERRORS_COUNT") || !strings.Contains(expr, `xid!=""`) {
		return nil
	}
	if m := xidNotMatch.FindStringSubmatch(expr); m != nil {
		known := regexp.MustCompile("^(?:" + m[1] + ")$")
		return func(x string) bool { return !known.MatchString(x) }
	}
	return func(x string) bool { return x != "" }
}
