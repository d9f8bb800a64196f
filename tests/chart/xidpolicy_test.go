package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/gpuhealth"
)

// xidConsumers are what one render makes of an Xid in each place that judges it.
type xidConsumers struct {
	disable, enable string                       // the device plugin's health env
	agent           gpuhealth.Policy             // the GPU health agent's, from its env
	alerts          map[string]func(string) bool // the Xid alerts' selectors on the xid label
	severity        map[string]string
}

// TestEveryXidMeansTheSameEverywhere: one render's device plugin, GPU health agent (the node condition) and Xid
// alerts read global.health.xids alike for every Xid from 1 to 160, for the default policy and a changed one: a
// fatal Xid takes the GPU out of the device plugin, makes the condition False and pages (GPUXidFatal, critical); an
// application Xid does none of that and only informs (GPUXidApplication); an Xid in neither tier warns (GPUXid),
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
				wantOut := false
				switch class {
				case gpuhealth.Fatal:
					want, wantOut = []string{"GPUXidFatal"}, true
				case gpuhealth.Application:
					want = []string{"GPUXidApplication"}
				default:
					want, wantOut = []string{"GPUXid"}, !builtIn
				}
				if strings.Join(matched, ",") != strings.Join(want, ",") || out != wantOut {
					t.Errorf("Xid %d: the agent reads it %s, the alerts %v (want %v), the device plugin takes the GPU out: %v (want %v)",
						xid, class, matched, want, out, wantOut)
				}
				if class != gpuhealth.Unlisted || builtIn {
					condition := "True"
					if class == gpuhealth.Fatal {
						condition = "False"
					}
					fmt.Fprintf(&golden, "Xid %3d  %-11s  condition %-5s  alert %s (%s)  device plugin: %s\n", xid, class, condition,
						strings.Join(matched, ","), c.severity[strings.Join(matched, ",")], map[bool]string{true: "GPU out", false: "GPU kept"}[out])
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
	stream := render(t, newestKube, []string{profileFile("monitoring")}, append([]string{"global.health.nodeCondition.enabled=true"}, set...)...)
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
