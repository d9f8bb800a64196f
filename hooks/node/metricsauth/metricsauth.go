// Package metricsauth serves a metrics handler as kube-rbac-proxy and controller-runtime's metrics filter do: over
// TLS, and only to a caller whose bearer token the API server authenticates (TokenReview) and lets GET the path
// (SubjectAccessReview on the non-resource URL). It makes those two reviews with client-go itself: the filter of
// controller-runtime links k8s.io/apiserver, which doubled the image's binary (36.8 to 75.0 MB) for two requests.
// The node status exporter uses it when its metrics are secure.
package metricsauth

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
)

// How long an answer is reused for the same token and request: Prometheus scrapes every 15 to 60 s with one token,
// so each scrape does not cost two reviews, while a revoked token or binding stops working within these.
const (
	allowTTL = time.Minute
	denyTTL  = 10 * time.Second
)

// Guard answers each request to its handler by the API server's reviews.
type Guard struct {
	client kubernetes.Interface
	now    func() time.Time
	mu     sync.Mutex
	cache  map[string]answer
}

type answer struct {
	status  int // 0: allowed
	message string
	until   time.Time
}

// New returns a Guard whose reviews go through client's account (it needs tokenreviews and subjectaccessreviews
// create).
func New(client kubernetes.Interface) *Guard {
	return &Guard{client: client, now: time.Now, cache: map[string]answer{}}
}

// Protect returns h behind the reviews: a request without a token is answered 401, one whose token the API server
// does not accept 401, one whose account may not use the method on the path 403, a review that fails 500.
func (g *Guard) Protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		a := g.review(r.Context(), token, verb, r.URL.Path)
		if a.status != 0 {
			http.Error(w, a.message, a.status)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (g *Guard) review(ctx context.Context, token, verb, path string) answer {
	key := verb + " " + path + " " + token
	g.mu.Lock()
	a, ok := g.cache[key]
	g.mu.Unlock()
	if ok && g.now().Before(a.until) {
		return a
	}
	a = g.ask(ctx, token, verb, path)
	if a.status == http.StatusInternalServerError {
		return a // the API server may answer the next scrape
	}
	ttl := allowTTL
	if a.status != 0 {
		ttl = denyTTL
	}
	a.until = g.now().Add(ttl)
	g.mu.Lock()
	for k, old := range g.cache { // expired answers go, so the cache holds only the scrapers of the last minute
		if !g.now().Before(old.until) {
			delete(g.cache, k)
		}
	}
	g.cache[key] = a
	g.mu.Unlock()
	return a
}

func (g *Guard) ask(ctx context.Context, token, verb, path string) answer {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr, err := g.client.AuthenticationV1().TokenReviews().Create(ctx,
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return answer{status: http.StatusInternalServerError, message: "token review failed: " + err.Error()}
	}
	if !tr.Status.Authenticated {
		return answer{status: http.StatusUnauthorized, message: "Unauthorized: the API server does not accept the token"}
	}
	u := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := g.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb}},
	}, metav1.CreateOptions{})
	if err != nil {
		return answer{status: http.StatusInternalServerError, message: "access review failed: " + err.Error()}
	}
	if !sar.Status.Allowed {
		return answer{status: http.StatusForbidden, message: fmt.Sprintf("Forbidden: %s may not %s %s", u.Username, verb, path)}
	}
	return answer{}
}

// SelfSignedTLS is a server TLS config with a certificate made now for host (and localhost), kept in memory: the
// scrapers prove who they are with the token; Prometheus scrapes such an endpoint with insecureSkipVerify, as it
// does kube-rbac-proxy's generated certificate.
func SelfSignedTLS(host string) (*tls.Config, error) {
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(host, nil, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("metrics TLS certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("metrics TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
