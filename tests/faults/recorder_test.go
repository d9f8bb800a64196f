package faults

import (
	"slices"
	"testing"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// TestOutOfServiceCountsInRevisionOrder: the recorder's count of nodes out of service follows the API server's
// revisions, not the order a relist hands changes over, and still finds a true excess.
func TestOutOfServiceCountsInRevisionOrder(t *testing.T) {
	at := time.Now()
	v := func(rv uint64, name string, st nodestate.UpgradeState) nodeVersion {
		out := st != nodestate.UpgradeDone && st != nodestate.UpgradeRequired
		return nodeVersion{rv: rv, seen: at, name: name, state: st, outOfService: out}
	}
	// before the outage: gpu-09 in flight. During it (unseen): gpu-09 done at 108, then gpu-02 and gpu-08 start at
	// 109 and 110. The relist hands the three over in map order, gpu-09's last.
	relist := []nodeVersion{
		v(90, "gpu-09", nodestate.PodRestartRequired),
		v(109, "gpu-02", nodestate.CordonRequired),
		v(110, "gpu-08", nodestate.PodDeletionRequired),
		v(108, "gpu-09", nodestate.UpgradeDone),
	}
	r := &recorder{versions: relist}
	if most, which, _ := r.outOfService(); most != 2 || !slices.Equal(which, []string{"gpu-02", "gpu-08"}) {
		t.Errorf("relist in map order: %d out (%v), want 2 (gpu-02, gpu-08)", most, which)
	}
	// the same nodes, but gpu-09 still in flight when gpu-08 starts: three at revision 110
	r = &recorder{versions: []nodeVersion{
		v(90, "gpu-09", nodestate.PodRestartRequired),
		v(109, "gpu-02", nodestate.CordonRequired),
		v(110, "gpu-08", nodestate.PodDeletionRequired),
		v(111, "gpu-09", nodestate.UpgradeDone),
	}}
	if most, which, led := r.outOfService(); most != 3 || len(led) != 3 {
		t.Errorf("three in flight at revision 110: %d out (%v), %d changes led there; want 3 and 3", most, which, len(led))
	}
}
