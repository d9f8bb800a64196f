package install

import (
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// clientGetter is what one Helm action reaches the cluster through: kubeconfig's cluster as `helm --kubeconfig`
// would, with one discovery client for the whole action, cached in memory. Helm's own flags hand out a new
// disk-cached discovery client on every call, and each REST mapper or capability check through one re-read and
// re-decoded every group version's document from $HOME/.kube/cache: a fifth of a control-plane suite's CPU. A new
// getter per action keeps what a new `helm` process sees: Helm invalidates discovery when it reads the cluster's
// capabilities and after it installs CRDs, and the mapper looks again on a kind it does not know (lookAgainOnAMiss:
// a CRD the action itself created, for a later hook). No discovery cache is written to disk, so a later cluster on
// the same loopback port cannot read a stale one.
type clientGetter struct {
	*genericclioptions.ConfigFlags

	once   sync.Once
	dc     discovery.CachedDiscoveryInterface
	mapper meta.RESTMapper
	err    error
}

func newClientGetter(kubeconfig, namespace string) *clientGetter {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &namespace
	flags.WrapConfigFn = unthrottled
	return &clientGetter{ConfigFlags: flags}
}

func (g *clientGetter) init() {
	g.once.Do(func() {
		cfg, err := g.ToRESTConfig()
		if err != nil {
			g.err = err
			return
		}
		// discovery asks for many group versions at once, as Helm's flags allow it (burst 300)
		cfg.Burst = max(cfg.Burst, 300)
		client, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			g.err = err
			return
		}
		g.dc = lookAgainOnAMiss{memory.NewMemCacheClient(client)}
		g.mapper = restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(g.dc), g.dc, nil)
	})
}

// ToDiscoveryClient is the action's one discovery client.
func (g *clientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	g.init()
	return g.dc, g.err
}

// ToRESTMapper is the action's one REST mapper, over its discovery client.
func (g *clientGetter) ToRESTMapper() (meta.RESTMapper, error) {
	g.init()
	return g.mapper, g.err
}

// lookAgainOnAMiss is a discovery cache that never calls itself fresh, so a REST mapper over it (client-go's
// DeferredDiscoveryRESTMapper) that does not know a kind invalidates it and asks the API server again, as it does
// over Helm's disk cache; over a memory cache it would trust a populated cache and fail.
type lookAgainOnAMiss struct {
	discovery.CachedDiscoveryInterface
}

// Fresh is always false: see lookAgainOnAMiss.
func (lookAgainOnAMiss) Fresh() bool { return false }
