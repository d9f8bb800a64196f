package nodestate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRevertRecord(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{}, Annotations: map[string]string{}}}
	if r, err := ReadRevert(n); r != nil || err != nil || Reverted(n) {
		t.Fatalf("no record: %v %v reverted %v", r, err, Reverted(n))
	}
	want := Revert{From: "2222222222222222", To: "1111111111111111", DaemonSet: "nvidia-driver-revert-111111111111", Reason: "no validator", At: "2026-09-01T12:00:00Z"}
	n = apply(n, StartRevert(n, want))
	if n.Labels[RevertLabel] != "111111111111" || !Reverted(n) {
		t.Fatalf("after StartRevert: labels %v, reverted %v", n.Labels, Reverted(n))
	}
	if r, err := ReadRevert(n); err != nil || *r != want {
		t.Fatalf("read back %+v, %v", r, err)
	}
	if s := RevertSummary(n); !strings.Contains(s, "driver config 222222222222 failed validation (no validator); back on 111111111111 (DaemonSet nvidia-driver-revert-111111111111)") {
		t.Errorf("summary %q", s)
	}
	// dropping the record keeps the node on its revert DaemonSet, no longer failed
	kept := apply(n, ForgetRevert(n))
	if Reverted(kept) || kept.Labels[RevertLabel] == "" {
		t.Errorf("after ForgetRevert: reverted %v label %q, want the label only", Reverted(kept), kept.Labels[RevertLabel])
	}
	// ending it takes both; and so does the uninstall's cleanup
	for name, p := range map[string]Patch{"EndRevert": EndRevert(n), "Cleanup": must(Cleanup(n))} {
		m := apply(n, p)
		if _, ok := m.Labels[RevertLabel]; ok || Reverted(m) {
			t.Errorf("after %s: labels %v annotations %v", name, m.Labels, m.Annotations)
		}
	}
	// a damaged record still counts as reverted (damage never lifts a hold) and reads as an error naming the key
	n.Annotations[RevertedAnnotation] = "{"
	if _, err := ReadRevert(n); err == nil || !strings.Contains(err.Error(), RevertedAnnotation) || !Reverted(n) {
		t.Errorf("damaged record: err %v reverted %v", err, Reverted(n))
	}
}

func TestSetValidated(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{ValidatedDigestAnnotation: "a"}}}
	if p := SetValidated(n, "a"); !p.Empty() {
		t.Errorf("same digest: %s", p.JSON())
	}
	if p := SetValidated(n, ""); !p.Empty() {
		t.Errorf("no digest: %s", p.JSON())
	}
	if p := SetValidated(n, "b"); string(p.JSON()) != `{"metadata":{"annotations":{"kube-gpu-stack.io/driver-validated-digest":"b"}}}` {
		t.Errorf("new digest: %s", p.JSON())
	}
}

func must(p Patch, err error) Patch {
	if err != nil {
		panic(err)
	}
	return p
}
