package admission

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/validation"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

const exporterSA = "nvidia-node-status-exporter"

// The node status exporter with nodeStatusExporter.secureMetrics, on the local API server, its account given the
// chart's rendered roles: /metrics answers only a scraper whose token the API server accepts and whose account may
// GET /metrics (bound here to the chart's metrics-reader ClusterRole, as an admin binds Prometheus): no token 401,
// a token the API server rejects 401, an account without the rule 403. An exporter whose account may not ask the
// API server (the chart's review rights missing) refuses everyone (500), never serves. /healthz stays open.
func TestSecureMetricsServeOnlyScrapersTheAPIServerAllows(t *testing.T) {
	install(t)
	ctx, c := t.Context(), kube.Client
	stream, err := chartrender.RenderRepo(ctx, nil, []string{"nodeStatusExporter.enabled=true", "nodeStatusExporter.secureMetrics=true"})
	if err != nil {
		t.Fatal(err)
	}
	apply(t, stream, map[string]bool{exporterSA: true}, false)
	reader := clusterRole(t, stream, "nvidia-node-status-exporter-metrics-reader-"+ns)
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, reader, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, sa := range []string{"scraper", "stranger"} {
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scraper-reads-gpu-metrics"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}}}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token := func(sa string) string { return restConfigAs(t, sa, nil).BearerToken }
	scraper, stranger := token("scraper"), token("stranger")

	serve := func(sa string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		o := validation.Options{Component: "metrics", NodeName: nodeA, OutputDir: t.TempDir(), MetricsAddr: addr, MetricsSecure: true,
			Client: clientAs(t, sa, podOn(t, sa, nodeA))}
		o.Complete()
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- o.Run(ctx, io.Discard) }()
		t.Cleanup(func() {
			if err := <-errc; err != nil {
				t.Errorf("exporter as %s: %v", sa, err)
			}
		})
		return "https://" + addr
	}
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(url, bearer string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		var resp *http.Response
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if resp, err = client.Do(req); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	base := serve(exporterSA)
	if code, _ := get(base+"/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz without a token: %d, want 200 (the readiness probe has no token)", code)
	}
	refused := 0
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token the API server rejects", "not-a-token", http.StatusUnauthorized},
		{"an account without the metrics rule", stranger, http.StatusForbidden},
	} {
		if code, body := get(base+"/metrics", tc.token); code != tc.want || strings.Contains(body, validation.MetricValidationReady) {
			t.Errorf("/metrics with %s: %d, want %d and no metrics\n%s", tc.who, code, tc.want, body)
		} else {
			refused++
		}
	}
	if code, body := get(base+"/metrics", scraper); code != http.StatusOK || !strings.Contains(body, validation.MetricValidationReady) {
		t.Fatalf("/metrics with the scraper's token: %d, want 200 with the exporter's metrics\n%s", code, body)
	}
	// the same exporter without the review rights: it cannot tell who asks, so it serves nobody
	blind := serve("stranger")
	if code, body := get(blind+"/metrics", scraper); code != http.StatusInternalServerError || strings.Contains(body, validation.MetricValidationReady) {
		t.Errorf("an exporter that may not ask the API server answered the scraper %d, want 500 and no metrics\n%s", code, body)
	} else {
		refused++
	}
	t.Logf("secure metrics: %d requests refused, the allowed scraper served", refused)
}
