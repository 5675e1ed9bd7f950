// Package apiserver assembles mci-apiserver: the generic Kubernetes API
// server with the inference.networking.x-k8s.io group, whose resources are
// computed from the ClusterSet cache rather than stored.
package apiserver

import (
	"context"
	"fmt"
	"k8s.io/component-base/metrics/legacyregistry"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/dynamic"
	restclient "k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apiconflict"
	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/install"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/clusterset"
	"github.com/mci-dev/mci/pkg/exportstatus"
	poolclient "github.com/mci-dev/mci/pkg/generated/clientset/versioned/typed/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/registry/inference/inferenceclustersummary"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolexport"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolexportsummary"
	"github.com/mci-dev/mci/pkg/registry/inference/inferencepoolimport"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

var (
	// Scheme knows the served API group and the meta types.
	Scheme = runtime.NewScheme()
	// Codecs encode and decode the served API group.
	Codecs = serializer.NewCodecFactory(Scheme)
)

func init() {
	install.Install(Scheme)
	// The meta types (ListOptions, WatchEvent, ...) every API server needs.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	unversioned := schema.GroupVersion{Group: "", Version: "v1"}
	Scheme.AddUnversionedTypes(unversioned,
		&metav1.Status{},
		&metav1.APIVersions{},
		&metav1.APIGroupList{},
		&metav1.APIGroup{},
		&metav1.APIResourceList{},
	)
}

// ExtraConfig is what mci-apiserver adds to the generic server config.
type ExtraConfig struct {
	ClusterSet clusterset.Options
	// Sources say which clusters are members besides the local one.
	Sources []clusterset.Source
	// ExportedStatus, when set, runs the controller that writes the
	// Exported parent status entry on the local cluster's exported
	// InferencePools; nil writes nothing.
	ExportedStatus *ExportedStatusConfig
	// WatchHistorySize is how many changes of each resource a watch can
	// resume across; virtual.DefaultHistorySize when 0.
	WatchHistorySize int
}

// ExportedStatusConfig is what the Exported status controller writes
// through and how its replicas elect the writer.
type ExportedStatusConfig struct {
	Pools    poolclient.InferencePoolsGetter
	Election exportstatus.Election
}

// Config is the complete configuration of mci-apiserver.
type Config struct {
	GenericConfig *genericapiserver.RecommendedConfig
	ExtraConfig   ExtraConfig
}

type completedConfig struct {
	GenericConfig genericapiserver.CompletedConfig
	ExtraConfig   *ExtraConfig
}

// CompletedConfig is a Config with every default filled in.
type CompletedConfig struct {
	*completedConfig
}

// Complete fills in the defaults.
func (c *Config) Complete() CompletedConfig {
	return CompletedConfig{&completedConfig{
		GenericConfig: c.GenericConfig.Complete(),
		ExtraConfig:   &c.ExtraConfig,
	}}
}

// MCIServer is the running server.
type MCIServer struct {
	GenericAPIServer *genericapiserver.GenericAPIServer
	Cache            *clusterset.Cache
}

// New builds the server: the ClusterSet cache, one computed store per
// resource, and the API group that serves them. Watching starts in a
// post-start hook, so nothing connects to a member before the server runs.
func (c CompletedConfig) New() (*MCIServer, error) {
	generic, err := c.GenericConfig.New("mci-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}

	var (
		importStore, exportStore          *virtual.Store
		summaryStore, clusterSummaryStore *virtual.Store
		exported                          *exportstatus.Controller
	)
	local := c.ExtraConfig.ClusterSet.LocalName
	cache := clusterset.New(c.ExtraConfig.ClusterSet, func(ev clusterset.Event) {
		importStore.Notify(ev)
		exportStore.Notify(ev)
		// The summaries are computed from the local cluster alone: another
		// member's event would move their version (its component) without
		// changing them, and other clusters read exactly one member
		// component off every summary.
		if ev.Member == local {
			summaryStore.Notify(ev)
			clusterSummaryStore.Notify(ev)
		}
		if exported != nil {
			exported.Notify(ev)
		}
	})
	// One server per process; a second one (tests) keeps the first one's
	// series rather than failing.
	if err := legacyregistry.CustomRegister(clusterset.NewMetrics(cache)); err != nil {
		klog.Background().Error(err, "Registering the ClusterSet member metrics")
	}
	if es := c.ExtraConfig.ExportedStatus; es != nil {
		exported = exportstatus.New(cache, cache.LocalName(), es.Pools)
	}
	importStore = virtual.NewStore(inferencepoolimport.Resource{Index: cache}, cache, inferencepoolimport.Describe().New)
	exportStore = virtual.NewStore(inferencepoolexport.Resource{LocalName: cache.LocalName()}, cache, inferencepoolexport.Describe().New)

	summaryStore = virtual.NewStore(inferencepoolexportsummary.Resource{Index: cache}, localCluster{cache}, inferencepoolexportsummary.Describe().New)
	clusterSummaryStore = virtual.NewStore(inferenceclustersummary.Resource{LocalName: local}, localCluster{cache}, inferenceclustersummary.Describe().New)

	for _, s := range []*virtual.Store{importStore, exportStore, summaryStore, clusterSummaryStore} {
		s.SetHistorySize(c.ExtraConfig.WatchHistorySize)
	}

	served, err := installGroup(generic, cache, importStore, exportStore, summaryStore, clusterSummaryStore)
	if err != nil {
		return nil, err
	}

	// /readyz stays unready until the stores report ready: every member has
	// listed or is flagged unreachable (bounded by the generic server's
	// storage initialization timeout).
	generic.AddPostStartHookOrDie("storage-readiness", generic.StorageReadinessHook.Hook)
	generic.AddPostStartHookOrDie("mci-clusterset-cache", func(ctx genericapiserver.PostStartHookContext) error {
		go func() {
			if err := cache.Run(ctx, c.ExtraConfig.Sources...); err != nil {
				klog.FromContext(ctx).Error(err, "ClusterSet cache stopped")
			}
		}()
		go importStore.Run(ctx)
		go exportStore.Run(ctx)
		go summaryStore.Run(ctx)
		go clusterSummaryStore.Run(ctx)
		if exported != nil {
			go exported.Run(ctx, c.ExtraConfig.ExportedStatus.Election)
		}
		if local := c.ExtraConfig.ClusterSet.Local; local != nil {
			go reportConflictingCRDs(ctx, local, served)
		}
		return nil
	})
	return &MCIServer{GenericAPIServer: generic, Cache: cache}, nil
}

// reportConflictingCRDs says once whether a CRD of the local cluster (GIE's
// InferencePoolImport CRD) claims the group version this server serves,
// and who answers for it.
func reportConflictingCRDs(ctx context.Context, local *restclient.Config, served []string) {
	client, err := dynamic.NewForConfig(local)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot check for CRDs of the served group version")
		return
	}
	apiconflict.Report(ctx, client, v1alpha1.SchemeGroupVersion, served)
}

// installGroup serves the computed stores in the inference API group. The
// imports and exports wait for every member; the summaries, which other
// clusters' servers read, for the local cluster only. It returns the
// resources it serves (subresources apart).
func installGroup(generic *genericapiserver.GenericAPIServer, cache *clusterset.Cache, importStore, exportStore, summaryStore, clusterSummaryStore *virtual.Store) ([]string, error) {
	importREST := virtual.NewREST(importStore, inferencepoolimport.Describe(), cache.Ready)
	exportREST := virtual.NewREST(exportStore, inferencepoolexport.Describe(), cache.Ready)
	// Other clusters' servers read the summaries: they wait for the local
	// cluster only, so that a fleet that starts together does not wait on
	// itself.
	// A member outside an export's scope is never sent its summary: the
	// stream is filtered per reader, by the member its identity names.
	summaryREST := virtual.NewREST(summaryStore, inferencepoolexportsummary.Describe(), cache.LocalReady).
		WithVisibility(inferencepoolexportsummary.Visibility(cache))
	clusterSummaryREST := virtual.NewREST(clusterSummaryStore, inferenceclustersummary.Describe(), cache.LocalReady)

	group := genericapiserver.NewDefaultAPIGroupInfo(inference.GroupName, Scheme, metav1.ParameterCodec, Codecs)
	group.VersionedResourcesStorageMap["v1alpha1"] = map[string]rest.Storage{
		"inferencepoolimports":         importREST,
		"inferencepoolimports/status":  virtual.NewStatusREST(importREST),
		"inferencepoolexports":         exportREST,
		"inferencepoolexports/status":  virtual.NewStatusREST(exportREST),
		"inferencepoolexportsummaries": summaryREST,
		"inferenceclustersummaries":    clusterSummaryREST,
	}

	if err := generic.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("installing the %s API group: %w", inference.GroupName, err)
	}
	var served []string
	for r := range group.VersionedResourcesStorageMap["v1alpha1"] {
		if !strings.Contains(r, "/") {
			served = append(served, r)
		}
	}
	sort.Strings(served)
	return served, nil
}

// localCluster is the ClusterSet as the summaries' stores need it: complete
// once the local cluster has listed, whatever the other members do.
type localCluster struct{ *clusterset.Cache }

// Ready implements virtual.Snapshotter.
func (l localCluster) Ready() error { return l.LocalReady() }
