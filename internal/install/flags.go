package install

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
// capabilities and after it installs CRDs, and the mapper looks again, once, on a kind it does not know
// (lookAgainOnAMiss: a CRD the action itself created, for a later hook). No discovery cache is written to disk, so a later cluster on
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
		g.dc = memory.NewMemCacheClient(client)
		g.mapper = newMapper(g.dc)
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

// lookAgainOnAMiss is a REST mapper over the action's discovery cache that, on a kind it does not know, drops the
// cache and asks the API server once more, as client-go's mapper over Helm's disk cache does (a CRD the action itself
// created, for a later hook). A kind the server does not serve then fails with the mapper's no-match error, which
// Helm reports. (Over a memory cache the mapper alone trusts a populated cache and never looks again; a cache that
// never called itself fresh made it look again for ever, and an install whose hook named an unserved kind hung.)
type lookAgainOnAMiss struct {
	*restmapper.DeferredDiscoveryRESTMapper
}

func newMapper(dc discovery.CachedDiscoveryInterface) meta.RESTMapper {
	return restmapper.NewShortcutExpander(lookAgainOnAMiss{restmapper.NewDeferredDiscoveryRESTMapper(dc)}, dc, nil)
}

// again calls lookup, and once more after a reset when it found no match.
func again[T any](ctx context.Context, m lookAgainOnAMiss, lookup func() (T, error), found func(T) bool) (T, error) {
	v, err := lookup()
	if meta.IsNoMatchError(err) || err == nil && !found(v) {
		m.ResetWithContext(ctx)
		v, err = lookup()
	}
	return v, err
}

func some[T any](v []T) bool { return len(v) > 0 }
func always[T any](T) bool   { return true }

// The shortcut expander calls the WithContext methods; the others are the same through them.

func (m lookAgainOnAMiss) KindForWithContext(ctx context.Context, r schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	return again(ctx, m, func() (schema.GroupVersionKind, error) {
		return m.DeferredDiscoveryRESTMapper.KindForWithContext(ctx, r)
	}, always)
}

func (m lookAgainOnAMiss) KindsForWithContext(ctx context.Context, r schema.GroupVersionResource) ([]schema.GroupVersionKind, error) {
	return again(ctx, m, func() ([]schema.GroupVersionKind, error) {
		return m.DeferredDiscoveryRESTMapper.KindsForWithContext(ctx, r)
	}, some)
}

func (m lookAgainOnAMiss) ResourceForWithContext(ctx context.Context, r schema.GroupVersionResource) (schema.GroupVersionResource, error) {
	return again(ctx, m, func() (schema.GroupVersionResource, error) {
		return m.DeferredDiscoveryRESTMapper.ResourceForWithContext(ctx, r)
	}, always)
}

func (m lookAgainOnAMiss) ResourcesForWithContext(ctx context.Context, r schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	return again(ctx, m, func() ([]schema.GroupVersionResource, error) {
		return m.DeferredDiscoveryRESTMapper.ResourcesForWithContext(ctx, r)
	}, some)
}

func (m lookAgainOnAMiss) RESTMappingWithContext(ctx context.Context, gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return again(ctx, m, func() (*meta.RESTMapping, error) {
		return m.DeferredDiscoveryRESTMapper.RESTMappingWithContext(ctx, gk, versions...)
	}, always)
}

func (m lookAgainOnAMiss) RESTMappingsWithContext(ctx context.Context, gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	return again(ctx, m, func() ([]*meta.RESTMapping, error) {
		return m.DeferredDiscoveryRESTMapper.RESTMappingsWithContext(ctx, gk, versions...)
	}, some)
}

func (m lookAgainOnAMiss) KindFor(r schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	return m.KindForWithContext(context.Background(), r)
}

func (m lookAgainOnAMiss) KindsFor(r schema.GroupVersionResource) ([]schema.GroupVersionKind, error) {
	return m.KindsForWithContext(context.Background(), r)
}

func (m lookAgainOnAMiss) ResourceFor(r schema.GroupVersionResource) (schema.GroupVersionResource, error) {
	return m.ResourceForWithContext(context.Background(), r)
}

func (m lookAgainOnAMiss) ResourcesFor(r schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	return m.ResourcesForWithContext(context.Background(), r)
}

func (m lookAgainOnAMiss) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return m.RESTMappingWithContext(context.Background(), gk, versions...)
}

func (m lookAgainOnAMiss) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	return m.RESTMappingsWithContext(context.Background(), gk, versions...)
}
