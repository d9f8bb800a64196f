package install

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	fakediscovery "k8s.io/client-go/discovery/fake"
	k8stesting "k8s.io/client-go/testing"
)

var nodeFeatureRule = schema.GroupKind{Group: "nfd.k8s-sigs.io", Kind: "NodeFeatureRule"}

func nfdResources() *metav1.APIResourceList {
	return &metav1.APIResourceList{GroupVersion: "nfd.k8s-sigs.io/v1alpha1", APIResources: []metav1.APIResource{
		{Name: "nodefeaturerules", Kind: "NodeFeatureRule", Verbs: metav1.Verbs{"get", "create"}}}}
}

// mapping runs lookup in the background and fails t if it has not returned within a few seconds (the mapper once
// looked again for ever on a kind the server does not serve).
func mapping(t *testing.T, m meta.RESTMapper, gk schema.GroupKind, version string) (*meta.RESTMapping, error) {
	t.Helper()
	type result struct {
		m   *meta.RESTMapping
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := m.RESTMapping(gk, version)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		return r.m, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("RESTMapping(%s) did not return: the mapper keeps looking again", gk)
		return nil, nil
	}
}

// filledMapper is the action's mapper over a discovery that serves pods only, its cache filled by one mapping.
func filledMapper(t *testing.T) (*fakediscovery.FakeDiscovery, meta.RESTMapper) {
	t.Helper()
	fake := &fakediscovery.FakeDiscovery{Fake: &k8stesting.Fake{}}
	fake.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods", Kind: "Pod", Namespaced: true}}}}
	m := newMapper(memory.NewMemCacheClient(fake))
	if _, err := mapping(t, m, schema.GroupKind{Kind: "Pod"}, "v1"); err != nil {
		t.Fatal(err)
	}
	return fake, m
}

// An install whose hook names a kind the cluster does not serve (external NFD not installed) fails with the
// mapper's no-match error, after looking once more, instead of hanging.
func TestMapperFailsOnAKindTheServerDoesNotServe(t *testing.T) {
	_, m := filledMapper(t)
	_, err := mapping(t, m, nodeFeatureRule, "v1alpha1")
	if !meta.IsNoMatchError(err) {
		t.Fatalf("mapping an unserved kind: %v; want a no-match error", err)
	}
}

// A kind whose CRD the action created after the mapper filled its cache (bundled NFD's first install: the rule is
// a post-install hook) is found by looking again.
func TestMapperLooksAgainForAKindServedSinceItsCacheFilled(t *testing.T) {
	fake, m := filledMapper(t)
	fake.Resources = append(fake.Resources, nfdResources())
	r, err := mapping(t, m, nodeFeatureRule, "v1alpha1")
	if err != nil || r.Resource.Resource != "nodefeaturerules" {
		t.Fatalf("mapping a kind served since the cache filled: %v, %v", r, err)
	}
}
