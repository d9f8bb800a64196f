package scale

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/cluster"
)

// token is a one-hour token of a service account.
func token(ctx context.Context, c *cluster.Cluster, ns, sa string) (string, error) {
	hour := int64(3600)
	tok, err := c.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", ns, sa, err)
	}
	return tok.Status.Token, nil
}

// kubeconfigFor writes a kubeconfig for a service account's token into dir.
func kubeconfigFor(c *cluster.Cluster, dir, name, tok string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tok}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name}
	kc.CurrentContext = name
	path := filepath.Join(dir, "kubeconfig-"+name)
	return path, clientcmd.WriteToFile(*kc, path)
}

// addNodes registers the simulated nodes, 16 at a time, and waits (one list every 2 s) until every one has settled
// as cluster.AddNodes waits for each: Ready, without the not-ready taint, with the TTL controller's annotation.
func addNodes(ctx context.Context, c *cluster.Cluster, nodes []*corev1.Node) error {
	work := make(chan *corev1.Node)
	errs := make(chan error, len(nodes))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for n := range work {
				n = n.DeepCopy()
				if n.Annotations == nil {
					n.Annotations = map[string]string{}
				}
				n.Annotations[cluster.SimulatedNodeAnnotation] = "fake"
				if _, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create node %s: %w", n.Name, err)
				}
			}
		})
	}
	for _, n := range nodes {
		work <- n
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	var pending int
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		pending = len(nodes)
		for _, n := range list.Items {
			if cluster.Settled(&n) {
				pending--
			}
		}
		return pending == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d nodes did not settle (Ready, untainted): %w", pending, len(nodes), err)
	}
	return nil
}

// proc is one run of a binary: wall time, peak resident memory, output.
type proc struct {
	Start, End time.Time
	MaxRSS     int64 // bytes
	Output     string
	Err        error
}

func (p proc) Wall() time.Duration { return p.End.Sub(p.Start) }
func (p proc) MiB() float64        { return float64(p.MaxRSS) / (1 << 20) }

// run runs a binary to its end and reads its peak resident memory from /proc/PID/status (VmHWM, polled every 5 ms
// until it exits). Not getrusage's ru_maxrss: Go starts a child with vfork semantics, and Linux carries the parent's
// high-water mark (the test binary's, hundreds of MiB) into the child's maxrss at exec.
func run(ctx context.Context, env []string, name string, args ...string) proc {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	p := proc{Start: time.Now()}
	if p.Err = cmd.Start(); p.Err != nil {
		return p
	}
	done := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var hwm int64
		status := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "status")
		for {
			if v := vmHWM(status); v > hwm {
				hwm = v
			}
			select {
			case <-done:
				peak <- hwm
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	p.Err = cmd.Wait()
	p.End = time.Now()
	close(done)
	p.MaxRSS = <-peak
	p.Output = out.String()
	return p
}

// vmHWM reads a process's peak resident set (bytes) from its status file; 0 when gone.
func vmHWM(status string) int64 {
	b, err := os.ReadFile(status)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}
