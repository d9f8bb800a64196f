package install

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/resource"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest/fake"
)

func infos(names ...string) kube.ResourceList {
	var out kube.ResourceList
	for _, n := range names {
		out = append(out, &resource.Info{Name: n})
	}
	return out
}

// TestWaitAsksOnlyWhatIsNotYetDone: while the last resource is not done, each poll asks for it alone, not for the
// ones before it again; the wait ends with one pass over all of them.
func TestWaitAsksOnlyWhatIsNotYetDone(t *testing.T) {
	rs := infos("a", "b", "c", "slow")
	asked := map[string]int{}
	err := pollUntilAllDone(rs, time.Minute, true, func(_ context.Context, r *resource.Info) (bool, error) {
		asked[r.Name]++
		return r.Name != "slow" || asked["slow"] >= 10, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// a, b, c once at first and once in the final pass; slow until it is done, then once more in the final pass
	want := map[string]int{"a": 2, "b": 2, "c": 2, "slow": 11}
	for n, w := range want {
		if asked[n] != w {
			t.Errorf("%s asked %d times, want %d (all: %v)", n, asked[n], w, asked)
		}
	}
}

// TestDeletionWaitAsksEachUntilGone: without recheck each resource is asked for until it is done and not again.
func TestDeletionWaitAsksEachUntilGone(t *testing.T) {
	rs := infos("a", "slow", "c")
	asked := map[string]int{}
	err := pollUntilAllDone(rs, time.Minute, false, func(_ context.Context, r *resource.Info) (bool, error) {
		asked[r.Name]++
		return r.Name != "slow" || asked["slow"] >= 3, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"a": 1, "slow": 3, "c": 1}; !maps.Equal(asked, want) {
		t.Errorf("asked %v, want %v", asked, want)
	}
}

// TestWaitNeedsAllDoneAtOnce: a resource seen done that is no longer done in the final pass keeps the wait going,
// as Helm's pass over every resource would.
func TestWaitNeedsAllDoneAtOnce(t *testing.T) {
	rs := infos("flaky", "slow")
	asked := map[string]int{}
	err := pollUntilAllDone(rs, time.Minute, true, func(_ context.Context, r *resource.Info) (bool, error) {
		asked[r.Name]++
		switch r.Name {
		case "flaky": // done at first, not done in the first final pass, done after
			return asked["flaky"] != 2, nil
		default:
			return asked["slow"] >= 3, nil
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// flaky: done, not done in the first final pass, done when asked again, done in the second final pass;
	// slow: 3 until done, then in both final passes and once more between them (it was pending again)
	if asked["flaky"] != 4 || asked["slow"] != 5 {
		t.Errorf("asked %v, want flaky 4 and slow 5 times", asked)
	}
}

// TestWaitEndsOnAnError: an error ends the wait with that error; the timeout ends one that never finishes.
func TestWaitEndsOnAnError(t *testing.T) {
	boom := errors.New("boom")
	err := pollUntilAllDone(infos("a", "b"), time.Minute, true, func(_ context.Context, r *resource.Info) (bool, error) {
		if r.Name == "b" {
			return false, boom
		}
		return true, nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want boom", err)
	}
	err = pollUntilAllDone(infos("never"), 300*time.Millisecond, true, func(context.Context, *resource.Info) (bool, error) { return false, nil })
	if err == nil {
		t.Error("a wait that never finishes ended without an error")
	}
}

// TestWaitForDeleteReadsOnlyTheObjects: a deletion wait asks for each object until it is NotFound, and for
// nothing else (resource.Info.Get would also read the namespace after every NotFound).
func TestWaitForDeleteReadsOnlyTheObjects(t *testing.T) {
	var paths []string
	client := &fake.RESTClient{
		NegotiatedSerializer: scheme.Codecs.WithoutConversion(),
		Client: fake.CreateHTTPClient(func(req *http.Request) (*http.Response, error) {
			paths = append(paths, req.Method+" "+req.URL.Path)
			if len(paths) <= 2 { // the object is there for the first two reads
				return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
					Body: io.NopCloser(strings.NewReader(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"ns"}}`))}, nil
			}
			return &http.Response{StatusCode: http.StatusNotFound, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))}, nil
		}),
	}
	info := &resource.Info{Client: client, Namespace: "ns", Name: "x", Mapping: &meta.RESTMapping{
		Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Scope: meta.RESTScopeNamespace,
	}}
	if err := (quickClient{}).WaitForDelete(kube.ResourceList{info}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if p != "GET /namespaces/ns/configmaps/x" {
			t.Errorf("the wait asked for %s; want only its object", p)
		}
	}
	if len(paths) != 3 { // twice found, then NotFound, and not again: it stays gone
		t.Errorf("asked %d times (%v), want 3", len(paths), paths)
	}
}

// TestHookLogsAreNotRead: after a hook with an output-log policy, Helm asks the kube client for the hook pod's
// logs; the harness's client reads none (the API server would ask a kubelet that a simulated pod does not have).
func TestHookLogsAreNotRead(t *testing.T) {
	var mu sync.Mutex // the server's handler runs on its own goroutines
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.URL.Path)
		mu.Unlock()
		http.Error(w, "no kubelet", http.StatusBadGateway)
	}))
	defer srv.Close()
	flags := genericclioptions.NewConfigFlags(false)
	flags.APIServer = &srv.URL
	helm := kube.New(flags)
	_ = helm.IsReachable() // builds the client set, as Helm's actions do first (this server answers it 502)
	mu.Lock()
	asked = nil
	mu.Unlock()
	var c kube.InterfaceLogs = quickClient{helm}
	pods := &corev1.PodList{Items: []corev1.Pod{{
		ObjectMeta: metav1.ObjectMeta{Name: "gate", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "validation-gate"}}},
	}}}
	written := false
	err := c.OutputContainerLogsForPodList(pods, "ns", func(_, _, _ string) io.Writer { written = true; return io.Discard })
	mu.Lock()
	defer mu.Unlock()
	if err != nil || written || len(asked) > 0 {
		t.Errorf("reading hook logs: error %v, writer asked for %v, requests %v; want none of them", err, written, asked)
	}
}
