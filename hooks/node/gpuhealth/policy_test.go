package gpuhealth

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPolicy(t *testing.T) {
	p := Policy{Fatal: []uint64{79}, Application: []uint64{13}, ConditionType: DefaultConditionType}
	for xid, want := range map[uint64]Class{79: Fatal, 13: Application, 5: Unlisted} {
		if got := p.Classify(xid); got != want {
			t.Errorf("Classify(%d) = %s, want %s", xid, got, want)
		}
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]Policy{
		"both tiers": {Fatal: []uint64{79}, Application: []uint64{79}, ConditionType: "x"},
		"watch":      {Watches: []string{"eccSingleBit"}, ConditionType: "x"},
		"effect":     {ConditionType: "x", Taint: &corev1.Taint{Key: "k", Effect: "Evict"}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: Validate passed", name)
		}
	}
	xids, err := ParseXids(" 48, 79,,120")
	if err != nil || len(xids) != 3 || xids[2] != 120 {
		t.Fatalf("ParseXids: %v %v", xids, err)
	}
	if _, err := ParseXids("48,x"); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("ParseXids: %v", err)
	}
	taint, err := ParseTaint("nvidia.com/gpu-unhealthy:NoExecute")
	if err != nil || taint.Key != "nvidia.com/gpu-unhealthy" || taint.Effect != corev1.TaintEffectNoExecute {
		t.Fatalf("ParseTaint: %+v %v", taint, err)
	}
	if taint, err := ParseTaint(""); taint != nil || err != nil {
		t.Fatalf("ParseTaint(\"\"): %+v %v", taint, err)
	}
}
