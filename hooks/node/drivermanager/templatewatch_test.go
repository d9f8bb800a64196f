package drivermanager

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// withDaemonSetController makes client record a DaemonSet's template as a ControllerRevision each time a create or
// update of the DaemonSet changes it, as the DaemonSet controller does (and raises the revision of a template that
// comes back, as on a rollback); a DaemonSet without a selector gets its template's labels as one (the API server
// requires it). The gate follows its DaemonSet's template through those revisions (templateWatch).
func withDaemonSetController(client *fake.Clientset) *fake.Clientset {
	var mu sync.Mutex
	revision := int64(0)
	gvr := appsv1.SchemeGroupVersion.WithResource("daemonsets")
	revGVR := appsv1.SchemeGroupVersion.WithResource("controllerrevisions")
	record := func(ds *appsv1.DaemonSet) error {
		mu.Lock()
		defer mu.Unlock()
		raw, err := json.Marshal(ds.Spec.Template)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(raw)
		hash := hex.EncodeToString(sum[:5])
		revision++
		labels := maps.Clone(ds.Spec.Selector.MatchLabels)
		labels[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
		rev := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-" + hash, Namespace: ds.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
			Data: runtime.RawExtension{Raw: raw}, Revision: revision}
		if _, err := client.Tracker().Get(revGVR, ds.Namespace, rev.Name); err == nil {
			return client.Tracker().Update(revGVR, rev, ds.Namespace)
		}
		return client.Tracker().Create(revGVR, rev, ds.Namespace)
	}
	client.PrependReactor("*", "daemonsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var ds *appsv1.DaemonSet
		switch a := a.(type) {
		case k8stesting.CreateAction:
			ds = a.GetObject().(*appsv1.DaemonSet).DeepCopy()
		case k8stesting.UpdateAction:
			if a.GetSubresource() != "" {
				return false, nil, nil
			}
			ds = a.GetObject().(*appsv1.DaemonSet).DeepCopy()
		default:
			return false, nil, nil
		}
		if ds.Spec.Selector == nil {
			ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: maps.Clone(ds.Spec.Template.Labels)}
		}
		var err error
		if a.GetVerb() == "create" {
			err = client.Tracker().Create(gvr, ds, ds.Namespace)
		} else {
			var old runtime.Object
			if old, err = client.Tracker().Get(gvr, ds.Namespace, ds.Name); err == nil {
				ds.Generation = old.(*appsv1.DaemonSet).Generation
				err = client.Tracker().Update(gvr, ds, ds.Namespace)
				if err == nil && equalTemplates(old.(*appsv1.DaemonSet), ds) {
					return true, ds, nil // a status or metadata write: no revision
				}
			}
		}
		if err != nil {
			return true, nil, err
		}
		return true, ds, record(ds)
	})
	return client
}

func equalTemplates(a, b *appsv1.DaemonSet) bool {
	x, _ := json.Marshal(a.Spec.Template)
	y, _ := json.Marshal(b.Spec.Template)
	return string(x) == string(y)
}

// TestTemplateWatchReadsTheDaemonSetOnlyWhenItsTemplateChanges: a gate on every node follows its DaemonSet; a
// status write (the DaemonSet controller makes a few per node and rollout) must cost it no read, a template change,
// a rollback to an earlier template and the DaemonSet's deletion must each be seen.
func TestTemplateWatchReadsTheDaemonSetOnlyWhenItsTemplateChanges(t *testing.T) {
	client := withDaemonSetController(fake.NewClientset())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: driverDS, Namespace: namespace, UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{ComponentLabel: "driver"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{ComponentLabel: "driver"}}, Spec: driverSpec(oldDigest)}}}
	if _, err := client.AppsV1().DaemonSets(namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := watchTemplate(ctx, client, namespace, driverDS)
	if err != nil {
		t.Fatal(err)
	}
	digestOf := func() string {
		ds, ok := w.Get()
		if !ok {
			return "gone"
		}
		return ds.Spec.Template.Spec.Containers[0].Env[0].Value
	}
	// waitFor waits for the watch to show want
	waitFor := func(want string) {
		t.Helper()
		for digestOf() != want {
			select {
			case <-ctx.Done():
				t.Fatalf("the watch shows %q, want %q", digestOf(), want)
			case <-w.Changed():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	reads := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "daemonsets" {
				n++
			}
		}
		return n
	}
	setDigest := func(d string) {
		t.Helper()
		cur, err := client.AppsV1().DaemonSets(namespace).Get(ctx, driverDS, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.Template.Spec = driverSpec(d)
		if _, err := client.AppsV1().DaemonSets(namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(oldDigest)
	time.Sleep(100 * time.Millisecond) // the first list's read is done
	before := reads()
	for i := range 20 {
		cur, err := client.AppsV1().DaemonSets(namespace).Get(ctx, driverDS, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.NumberReady = int32(i)
		if _, err := client.AppsV1().DaemonSets(namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if got := reads() - before - 20; got != 0 { // the test's own 20 reads
		t.Fatalf("20 status writes made the watch read the DaemonSet %d times, want none", got)
	}
	setDigest(newDigest)
	waitFor(newDigest)
	setDigest(oldDigest) // a rollback: the earlier template's revision is raised
	waitFor(oldDigest)
	if err := client.AppsV1().DaemonSets(namespace).Delete(ctx, driverDS, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// the garbage collector deletes the revisions of a deleted DaemonSet
	revs, err := client.AppsV1().ControllerRevisions(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range revs.Items {
		if err := client.AppsV1().ControllerRevisions(namespace).Delete(ctx, r.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("gone")
	if err := w.Err(); err != nil {
		t.Fatalf("the watch failed: %v", err)
	}
}
