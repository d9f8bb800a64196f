package install

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"helm.sh/helm/v3/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/resource"
	"k8s.io/client-go/rest"
)

// WaitPoll is how often the waits of quickClient look again. Helm looks every 2 s; on the local control plane a
// rollout or a deletion is over well within that, so most of each wait was the poll's own pace.
const WaitPoll = 100 * time.Millisecond

// quickClient is Helm's kube client with its three waits (`--wait` after install and upgrade, the wait for a
// deleted hook to go, `uninstall --wait`) asking every WaitPoll instead of every 2 s. What they wait for is
// Helm's own: its ReadyChecker, with the options Helm's Wait and WaitWithJobs use, and NotFound for deletions.
// Every other call is Helm's.
//
// Helm asks for every resource on each poll until the first that is not done. At ten polls a second that was a
// tenth of the harness's requests, most of them for objects long done, so a poll starts at the first resource not
// yet seen done (pending) and goes on from there; once each has been seen done, one pass over all of them must find
// them all done at once, as Helm's single pass does.
type quickClient struct{ *kube.Client }

// Wait is kube.Client.Wait, polled every WaitPoll.
func (c quickClient) Wait(resources kube.ResourceList, timeout time.Duration) error {
	return c.waitReady(resources, timeout, kube.PausedAsReady(true))
}

// WaitWithJobs is kube.Client.WaitWithJobs, polled every WaitPoll.
func (c quickClient) WaitWithJobs(resources kube.ResourceList, timeout time.Duration) error {
	return c.waitReady(resources, timeout, kube.PausedAsReady(true), kube.CheckJobs(true))
}

func (c quickClient) waitReady(resources kube.ResourceList, timeout time.Duration, opts ...kube.ReadyCheckerOption) error {
	cs, err := c.Factory.KubernetesClientSet()
	if err != nil {
		return err
	}
	checker := kube.NewReadyChecker(cs, c.Log, opts...)
	return pollUntilAllDone(resources, timeout, true, func(ctx context.Context, r *resource.Info) (bool, error) {
		ready, err := checker.IsReady(ctx, r)
		if err != nil && retryable(err) {
			return false, nil // as Helm does, a passing API error is asked again (until the timeout here)
		}
		return ready, err
	})
}

// OutputContainerLogsForPodList copies no log. After a hook that asks for it (helm.sh/hook-output-log-policy, as
// the validation gate does) Helm streams the hook pod's log to the Configuration's HookOutputFunc, which the SDK
// leaves at io.Discard and the harness does not set. On the local control plane that read could only fail: no
// kubelet serves a simulated pod's log, and Helm then printed "error outputting logs for hook failure" after a
// gate that had passed. The gate's report is read from the kubelet stand-in instead (kubelet.Kubelet.LastRun).
func (quickClient) OutputContainerLogsForPodList(*corev1.PodList, string, func(namespace, pod, container string) io.Writer) error {
	return nil
}

// WaitForDelete is kube.Client.WaitForDelete, polled every WaitPoll, asking for each object until it is gone.
// It reads an object with its resource's own GET, not resource.Info.Get, which after every NotFound also reads the
// object's namespace (to tell a missing namespace apart). That read and a second pass over objects already gone
// were 9% of the e2e suite's requests.
func (c quickClient) WaitForDelete(resources kube.ResourceList, timeout time.Duration) error {
	return pollUntilAllDone(resources, timeout, false, func(_ context.Context, r *resource.Info) (bool, error) {
		_, err := resource.NewHelper(r.Client, r.Mapping).WithSubresource(r.Subresource).Get(r.Namespace, r.Name)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// pollUntilAllDone asks done about resources every WaitPoll, starting each poll at the first resource not yet seen
// done. With recheck the wait ends when one pass finds every resource done, as Helm's does: a resource seen ready
// may stop being ready. Without, it ends once each has been seen done: an object seen deleted stays deleted (one
// of the same name created later is another object). An error ends the wait.
func pollUntilAllDone(resources kube.ResourceList, timeout time.Duration, recheck bool, done func(context.Context, *resource.Info) (bool, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pending := resources
	return wait.PollUntilContextCancel(ctx, WaitPoll, true, func(ctx context.Context) (bool, error) {
		for len(pending) > 0 {
			if ok, err := done(ctx, pending[0]); !ok || err != nil {
				return false, err
			}
			pending = pending[1:]
		}
		if !recheck {
			return true, nil
		}
		for i, r := range resources {
			if ok, err := done(ctx, r); !ok || err != nil {
				pending = resources[i:]
				return false, err
			}
		}
		return true, nil
	})
}

// retryable is Helm's rule for an error worth asking again: not an API status, or one with no code, 429 or a 5xx
// other than 501.
func retryable(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true
	}
	code := st.Status().Code
	return code == 0 || code == http.StatusTooManyRequests || (code >= 500 && code != http.StatusNotImplemented)
}

// unthrottled lifts client-go's default client-side limit (5 requests/s, bursts of 10) from the harness's Helm:
// the ready checks above ask for every resource of a release several times a second. The API server's own limits
// stay.
func unthrottled(c *rest.Config) *rest.Config {
	c.QPS, c.Burst = 1000, 2000
	return c
}
