package drainbench

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	kubectldrain "k8s.io/kubectl/pkg/cmd/drain"
	cmdutil "k8s.io/kubectl/pkg/cmd/util"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/gpudrain"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/upgrade/nodestate"
)

// Client rate limits compared: kubectl's defaults (client-go's QPS 5 / burst 10), and one high enough that
// neither side is throttled.
var rateLimits = []struct {
	qps   float32
	burst int
}{{5, 10}, {50, 100}}

const benchPods = 50

// drainer empties a node: cordon, then evict its pods and wait until they are gone, within timeout.
type drainer func(b *testing.B, node string, timeout time.Duration) error

// ours is the driver manager's path: cordon through nodestate, then gpudrain.
func ours(c *counter, qps float32, burst int) func(b *testing.B) drainer {
	return func(b *testing.B) drainer {
		cs := countingClient(b, c, qps, burst)
		return func(b *testing.B, node string, timeout time.Duration) error {
			ctx := context.Background()
			n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, err := nodestate.Apply(ctx, cs, node, nodestate.Cordon(n, "driver-upgrade")); err != nil {
				return err
			}
			o := gpudrain.Options{Client: cs, Node: node, GPUOnly: true, Timeout: timeout}
			o.Complete()
			_, err = o.Run(ctx, &bytes.Buffer{})
			return err
		}
	}
}

// kubectl runs `kubectl drain NODE --ignore-daemonsets --timeout T` in process: the command kubectl builds, with
// a factory over the same API server and rate limit. Discovery is warmed first, as a kubectl with a warm
// discovery cache would have it.
func kubectl(c *counter, qps float32, burst int) func(b *testing.B) drainer {
	return func(b *testing.B) drainer {
		flags := genericclioptions.NewConfigFlags(true).WithDiscoveryBurst(300).WithDiscoveryQPS(50)
		kc, cacheDir := kube.Kubeconfig, b.TempDir()
		flags.KubeConfig, flags.CacheDir = &kc, &cacheDir
		flags.WrapConfigFn = func(cfg *rest.Config) *rest.Config {
			cfg.QPS, cfg.Burst = qps, burst
			cfg.Wrap(c.RoundTripper)
			return cfg
		}
		f := cmdutil.NewFactory(cmdutil.NewMatchVersionFlags(flags))
		mapper, err := f.ToRESTMapper()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := mapper.RESTMapping(schema.GroupKind{Kind: "Node"}, "v1"); err != nil {
			b.Fatal(err)
		}
		return func(b *testing.B, node string, timeout time.Duration) (err error) {
			var out bytes.Buffer
			cmd := kubectldrain.NewCmdDrain(f, genericiooptions.IOStreams{Out: &out, ErrOut: &out})
			cmd.SetArgs([]string{node, "--ignore-daemonsets", "--timeout=" + timeout.String()})
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			type fatal struct{ msg string }
			cmdutil.BehaviorOnFatal(func(msg string, _ int) { panic(fatal{msg}) }) // CheckErr would exit the process
			defer cmdutil.DefaultBehaviorOnFatal()
			defer func() {
				if r := recover(); r != nil {
					f, ok := r.(fatal)
					if !ok {
						panic(r)
					}
					err = fmt.Errorf("kubectl drain: %s", strings.TrimSpace(f.msg))
				}
			}()
			return cmd.Execute()
		}
	}
}

var seq atomic.Int64

// gpuNodeWithPods is a fresh node holding benchPods GPU pods (all Ready), labelled app=<app>.
func gpuNodeWithPods(b *testing.B, kind, app string) (node, ns string) {
	b.Helper()
	name := fmt.Sprintf("bench-%s-%d", kind, seq.Add(1))
	addGPUNode(b, name, nil)
	owner := namespace(b, name)
	createPods(b, owner, name, gpuPods("gpu", benchPods, map[string]string{"app": app})...)
	return name, owner.Namespace
}

func implementations(c *counter, qps float32, burst int) []struct {
	name string
	make func(*testing.B) drainer
} {
	return []struct {
		name string
		make func(*testing.B) drainer
	}{{"ours", ours(c, qps, burst)}, {"kubectl", kubectl(c, qps, burst)}}
}

// BenchmarkDrain50GPUPods drains a node holding 50 GPU pods (cordon, evict, wait until gone): wall time per
// drain and API requests per drain, ours against kubectl drain at the same client rate limit.
func BenchmarkDrain50GPUPods(b *testing.B) {
	for _, rl := range rateLimits {
		c := &counter{}
		for _, impl := range implementations(c, rl.qps, rl.burst) {
			b.Run(fmt.Sprintf("%s/qps%g-burst%d", impl.name, rl.qps, rl.burst), func(b *testing.B) {
				drain := impl.make(b)
				var requests int
				var wall time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					node, ns := gpuNodeWithPods(b, "drain", "bench")
					c.Reset()
					b.StartTimer()
					start := time.Now()
					if err := drain(b, node, 5*time.Minute); err != nil {
						b.Fatal(err)
					}
					wall += time.Since(start)
					b.StopTimer()
					requests += c.Total()
					if i == 0 {
						b.Logf("requests by kind: %s", breakdown(c))
					}
					if left := nodePodNames(b, ns, node); len(left) != 0 {
						b.Fatalf("pods left on %s: %v", node, left)
					}
				}
				b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
				b.ReportMetric(wall.Seconds()/float64(b.N), "s/drain")
			})
		}
	}
}

// BenchmarkPDBBlocked50GPUPods drains a node whose 50 GPU pods sit under a budget that allows no disruption,
// and reports the API requests per minute made while waiting (from 10 s in until the timeout at 30 s).
func BenchmarkPDBBlocked50GPUPods(b *testing.B) {
	const timeout, settle = 30 * time.Second, 10 * time.Second
	for _, rl := range rateLimits {
		c := &counter{}
		for _, impl := range implementations(c, rl.qps, rl.burst) {
			b.Run(fmt.Sprintf("%s/qps%g-burst%d", impl.name, rl.qps, rl.burst), func(b *testing.B) {
				drain := impl.make(b)
				var perMinute float64
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					node, ns := gpuNodeWithPods(b, "pdb", "blocked")
					pdb(b, ns, "blocked", benchPods)
					c.Reset()
					b.StartTimer()
					start := time.Now()
					if err := drain(b, node, timeout); err == nil {
						b.Fatal("drain succeeded through a budget that allows no disruption")
					}
					b.StopTimer()
					waiting := c.Between(start.Add(settle), start.Add(timeout))
					perMinute += float64(waiting) / (timeout - settle).Minutes()
					if i == 0 {
						b.Logf("requests by kind (whole run): %s", breakdown(c))
					}
					if left := nodePodNames(b, ns, node); len(left) != benchPods {
						b.Fatalf("%d pods left on %s, want all %d", len(left), node, benchPods)
					}
				}
				b.ReportMetric(perMinute/float64(b.N), "requests/min-blocked")
			})
		}
	}
}

// breakdown summarises the counted requests by method and resource.
func breakdown(c *counter) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	kinds := map[string]int{}
	for _, r := range c.reqs {
		method, rest, _ := strings.Cut(r, " ")
		path, query, _ := strings.Cut(rest, "?")
		parts := strings.Split(strings.Trim(path, "/"), "/")
		kind := parts[len(parts)-1]
		switch {
		case strings.Contains(path, "/pods/") && strings.HasSuffix(path, "/eviction"):
			kind = "pods/eviction"
		case strings.Contains(path, "/pods/"):
			kind = "pod"
		case strings.Contains(path, "/nodes/"):
			kind = "node"
		case path == "/api/v1" || path == "/api" || path == "/apis":
			kind = path
		}
		if strings.Contains(query, "watch=true") {
			method = "WATCH"
		}
		kinds[method+" "+kind]++
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s=%d", k, kinds[k]))
	}
	return strings.Join(out, " ")
}
