package rolloutbench

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// apiCounter counts the requests one component's client makes (client side: exactly that component's, nothing
// else's), and the response bytes it reads.
type apiCounter struct {
	mu   sync.Mutex
	reqs []apiReq
}

type apiReq struct {
	at    time.Time
	call  string // verb and resource, e.g. "list nodes", "watch pods", "patch nodes", "create pods/eviction"
	bytes *int64
}

// client is a clientset whose requests c counts, under user agent agent. It has a connection of its own (a Dial of
// its own keeps client-go from sharing a cached transport), as each driver pod's containers have in a cluster and
// the stand-in's own clients have (apiFor): one client for every node would put all their watches and requests on
// connections a cluster never shares.
func (c *apiCounter) client(cfg *rest.Config, agent string) (kubernetes.Interface, error) {
	cfg = withAgent(cfg, agent)
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			req := apiReq{at: time.Now(), call: call(r), bytes: new(int64)}
			c.mu.Lock()
			c.reqs = append(c.reqs, req)
			c.mu.Unlock()
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.Body != nil {
				resp.Body = &countingBody{ReadCloser: resp.Body, c: c, n: req.bytes}
			}
			return resp, err
		})
	}
	return kubernetes.NewForConfig(cfg)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countingBody struct {
	io.ReadCloser
	c *apiCounter
	n *int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.c.mu.Lock()
	*b.n += int64(n)
	b.c.mu.Unlock()
	return n, err
}

// call names a request by verb and resource: /api/v1/namespaces/ns/pods/name/eviction is "post pods/eviction".
func call(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	resource, named := "", false
	if len(parts) > 0 {
		resource = parts[0]
	}
	if len(parts) > 1 {
		named = true
	}
	if len(parts) > 2 {
		resource += "/" + parts[2]
	}
	verb := strings.ToLower(r.Method)
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "watch"
	case r.Method == http.MethodGet && !named:
		verb = "list"
	case r.Method == http.MethodGet:
		verb = "get"
	case r.Method == http.MethodPost:
		verb = "create"
	case r.Method == http.MethodPut:
		verb = "update"
	}
	return verb + " " + resource
}

// apiTally is what a counter saw in a window: requests by call, and response bytes.
type apiTally struct {
	total int
	bytes int64
	calls map[string]int
	// callBytes are the response bytes by call.
	callBytes map[string]int64
	// perSecond are the requests in each second of the window, for spotting steady polling.
	perSecond []int
}

func (c *apiCounter) tally(from, to time.Time) apiTally {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := apiTally{calls: map[string]int{}, callBytes: map[string]int64{}, perSecond: make([]int, int(to.Sub(from)/time.Second)+1)}
	for _, r := range c.reqs {
		if r.at.Before(from) || !r.at.Before(to) {
			continue
		}
		t.total++
		t.bytes += *r.bytes
		t.calls[r.call]++
		t.callBytes[r.call] += *r.bytes
		t.perSecond[int(r.at.Sub(from)/time.Second)]++
	}
	return t
}

// String lists the calls, most frequent first.
func (t apiTally) String() string {
	names := make([]string, 0, len(t.calls))
	for n := range t.calls {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if t.calls[a] != t.calls[b] {
			return t.calls[b] - t.calls[a]
		}
		return strings.Compare(a, b)
	})
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d (%d KiB)", n, t.calls[n], t.callBytes[n]/1024)
	}
	return b.String()
}
