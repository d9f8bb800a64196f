package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// adminUser is the harness's own user: every client of a local control plane (the tests, controller-manager,
// scheduler, kwok, a real kubelet) authenticates as it, in group system:masters.
const adminUser = "kube-gpu-stack-admin"

// adminTokenFile is the API server's static token file in the cluster's folder.
const adminTokenFile = "admin-token.csv"

// writeAdminToken writes a static token file for adminUser into dir and returns the token. The harness's clients
// send it as a bearer token rather than a client certificate: the API server checks a client certificate's chain
// with an ECDSA verification on every request, which took a twentieth of its CPU in the e2e suite; a static token
// is a map lookup.
func writeAdminToken(dir string) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, adminUser, adminUser)
	return token, os.WriteFile(filepath.Join(dir, adminTokenFile), []byte(line), 0o600)
}

// adminConfig is started (envtest's config, with envtest's own client certificate) authenticating as adminUser
// by token instead.
func adminConfig(started *rest.Config, token string) *rest.Config {
	cfg := rest.CopyConfig(started)
	cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = nil, nil, "", ""
	cfg.BearerToken = token
	return cfg
}

// protobuf is cfg asking for and sending protobuf, as controller-manager and scheduler do by default: for the
// built-in types the typed clientset serves, encoding and decoding it costs the tests and the API server a
// fraction of JSON. Custom resources need JSON, so only Cluster.Client gets it; Cluster.Config stays JSON.
func protobuf(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return cfg
}

// harnessAPIServerArgs are the kube-apiserver flags of every local control plane, on top of envtest's. None changes
// what the API serves; they drop per-request work that only a shared, remote API server needs:
//   - the static token file (writeAdminToken);
//   - no gzip of large responses (APIResponseCompression) nor of the initial lists that informers stream through
//     a watch (WatchListCompression, 2% of the API server's CPU in the e2e suite): every client is on the loopback;
//   - no API priority and fairness: the simple in-flight limits (400 reads, 200 writes at once) stand in, which
//     the tests never reach; APF's queues and bookkeeping on every request were 3% of the API server's CPU;
//   - a shutdown that ends its open watches 2 s after the last short request, answering 429 (Retry-After: 1) to
//     requests in between (shutdown-send-retry-after, as a production API server behind a load balancer runs).
//     Otherwise the shutdown waits for every watch to end, up to the request timeout (a minute): a client of the
//     tests still watching when its control plane stops (a pool's DRA plugin in tests/e2e) held the API server
//     until envtest gave up after 30 s and killed it, at the end of the longest suite.
func harnessAPIServerArgs(tokenFile string) map[string][]string {
	return map[string][]string{
		"token-auth-file":              {tokenFile},
		"feature-gates":                {"APIResponseCompression=false,WatchListCompression=false"},
		"enable-priority-and-fairness": {"false"},
		"shutdown-send-retry-after":    {"true"},
	}
}

// controllers are the controller-manager's controllers: the default set without those whose objects no test and
// no chart creates (volumes, endpoints of Services, StatefulSets, CronJobs, autoscalers, ReplicationControllers,
// certificate requests, node TTL annotations) and without node IPAM (kwok assigns pod addresses) and the token
// controller (envtest signs service-account tokens through the API server). Several of those watch every pod, and
// the endpoint controllers rewrite a Service's endpoints on every operand pod's change.
var controllers = "--controllers=" + strings.Join([]string{"*",
	"-serviceaccount-token-controller", "-node-ipam-controller",
	"-persistentvolume-attach-detach-controller", "-persistentvolume-binder-controller",
	"-persistentvolume-expander-controller", "-persistentvolume-protection-controller",
	"-persistentvolumeclaim-protection-controller", "-ephemeral-volume-controller",
	"-volumeattributesclass-protection-controller",
	"-endpoints-controller", "-endpointslice-controller", "-endpointslice-mirroring-controller",
	"-statefulset-controller", "-cronjob-controller", "-horizontal-pod-autoscaler-controller",
	"-replicationcontroller-controller", "-ttl-controller",
	"-certificatesigningrequest-approving-controller", "-certificatesigningrequest-cleaner-controller",
	"-certificatesigningrequest-signing-controller", "-kube-apiserver-serving-clustertrustbundle-publisher-controller",
	"-podcertificaterequest-cleaner-controller",
}, ",")
