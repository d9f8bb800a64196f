package metricsauth

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A scraper's answer is reused within its TTL (one token and one access review per minute, not per scrape), a
// denial for less time, and both are asked again once they expire: a revoked binding stops working within allowTTL.
func TestAnswersAreReusedOnlyWithinTheirTTL(t *testing.T) {
	client := fake.NewClientset()
	allowed, reviews := true, 0
	client.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		return true, &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Authenticated: true,
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus"}}}, nil
	})
	client.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		if sar.Spec.NonResourceAttributes == nil || sar.Spec.NonResourceAttributes.Path != "/metrics" || sar.Spec.NonResourceAttributes.Verb != "get" {
			t.Errorf("access review for %+v, want get /metrics", sar.Spec.NonResourceAttributes)
		}
		return true, &authorizationv1.SubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: allowed}}, nil
	})
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	g := New(client)
	g.now = func() time.Time { return now }
	h := g.Protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	scrape := func() int {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for range 3 {
		if code := scrape(); code != http.StatusOK {
			t.Fatalf("scrape: %d", code)
		}
	}
	if reviews != 1 {
		t.Fatalf("%d token reviews for 3 scrapes within a minute, want 1", reviews)
	}
	allowed = false // the binding is removed
	now = now.Add(allowTTL)
	if code := scrape(); code != http.StatusForbidden || reviews != 2 {
		t.Fatalf("after the TTL: %d with %d reviews, want 403 asked again", code, reviews)
	}
	now = now.Add(denyTTL - time.Second)
	allowed = true
	if code := scrape(); code != http.StatusForbidden || reviews != 2 {
		t.Fatalf("within the denial's TTL: %d with %d reviews, want the 403 reused", code, reviews)
	}
	now = now.Add(time.Second)
	if code := scrape(); code != http.StatusOK || reviews != 3 {
		t.Fatalf("after the denial's TTL: %d with %d reviews, want 200 asked again", code, reviews)
	}
}
