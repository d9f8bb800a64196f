package driverpools

import (
	"strings"
	"testing"
)

func TestParseRefusesAMalformedMaxUnavailable(t *testing.T) {
	for _, v := range []string{`"abc"`, `"150%"`, `-1`, `0`, `"0%"`, `"1"`, `"-5%"`, `"%"`, `"+5%"`, `"25 %"`, `"101%"`} {
		raw := `[{"name": "gpu-a", "source": "container", "maxUnavailable": ` + v + `}]`
		_, err := Parse(raw)
		if err == nil || !strings.Contains(err.Error(), "driver pool gpu-a: upgradePolicy.maxUnavailable") {
			t.Errorf("maxUnavailable %s: err = %v, want a refusal naming the pool and the key", v, err)
		}
	}
	if _, err := Parse(`[{"name": "gpu-a", "maxUnavailable": 1.5}]`); err == nil {
		t.Error("maxUnavailable 1.5 accepted")
	}
	for v, want := range map[string]int{`1`: 1, `3`: 3, `"25%"`: 3, `"1%"`: 1, `"100%"`: 10, `null`: 1} {
		pools, err := Parse(`[{"name": "gpu-a", "maxUnavailable": ` + v + `}]`)
		if err != nil {
			t.Errorf("maxUnavailable %s: %v", v, err)
			continue
		}
		if n, err := pools[0].MaxUnavailableNodes(10); err != nil || n != want {
			t.Errorf("maxUnavailable %s of 10 nodes = %d, %v; want %d", v, n, err, want)
		}
	}
}
