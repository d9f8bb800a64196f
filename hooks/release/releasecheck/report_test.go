package releasecheck

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A gate that passed must not fail its release because one write of its report met an API error that may pass
// (etcd timing out, the API server restarting): the write is retried; an error retrying cannot fix still fails it.
func TestSaveConfigMapRetriesTransientErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fail    error
		times   int
		wantErr bool
	}{
		{"etcd timeout on the update, twice", apierrors.NewInternalError(errors.New("etcdserver: request timed out")), 2, false},
		{"throttled once", apierrors.NewTooManyRequests("slow down", 0), 1, false},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "report", errors.New("no")), 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			n := 0
			client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
				if n < tc.times {
					n++
					return true, nil, tc.fail
				}
				return false, nil, nil
			})
			r := &Report{Release: "gpu", Namespace: "gpu-operator", Summary: map[State]int{}}
			err := SaveConfigMap(context.Background(), client, "report", r, nil)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if _, err := client.CoreV1().ConfigMaps("gpu-operator").Get(context.Background(), "report", metav1.GetOptions{}); err != nil {
				t.Fatalf("report not written: %v", err)
			}
		})
	}
}
