package clusterset

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/informerhealth"
	"github.com/mci-dev/mci/pkg/inlineinformer"
	"github.com/mci-dev/mci/pkg/statelog"
	"github.com/mci-dev/mci/pkg/versionvector"
)

// Summaries chooses how this server reads the members other than the local
// cluster.
type Summaries string

const (
	// SummariesAuto reads a member through the summaries its own
	// mci-apiserver publishes when its API discovery lists them (summary
	// mode), and watches its objects otherwise (full mode).
	SummariesAuto Summaries = "auto"
	// SummariesNever watches every member's objects (full mode).
	SummariesNever Summaries = "never"
)

// The summaries a member's mci-apiserver publishes, as its API discovery
// (through the member's aggregator) names them.
var (
	apiExportSummaries  = v1alpha1.SchemeGroupVersion.WithResource("inferencepoolexportsummaries")
	apiClusterSummaries = v1alpha1.SchemeGroupVersion.WithResource("inferenceclustersummaries")
)

// summaryStreamLog: a member's summary stream failing with another error
// than the one logged is logged at most once a minute.
var summaryStreamLog = statelog.Rule{Interval: time.Minute}

// summaryInformers watches the member's InferencePoolExportSummaries and
// its InferenceClusterSummary, through the member's aggregator (so through
// the credentials and the link every other request to the member takes),
// and nothing else of it: two watches, served from the member's
// mci-apiserver memory, none by its kube-apiserver's storage. It returns
// what starts them.
func (m *member) summaryInformers(logger klog.Logger) func(context.Context) {
	exportsClient, clustersClient := m.summaryClient.InferencePoolExportSummaries(""), m.summaryClient.InferenceClusterSummaries()
	var exportsLW, clustersLW cache.ListerWatcher = informerhealth.ListWatch(m.summaryClient, exportsClient.List, exportsClient.Watch), informerhealth.ListWatch(m.summaryClient, clustersClient.List, clustersClient.Watch)
	if m.quota != nil {
		// A watch that meets the member's mci-apiserver down (a 503 from
		// its aggregator) resumes rather than relists (listquota.go); it
		// is counted and logged as a failed stream all the same.
		unavailable := func(_ context.Context, err error) { m.summaryStream.failed(m.name, logger, err) }
		exportsBound := boundedListWatch(m, KindExportSummary, "", exportsClient, trimSummary)
		// A cluster summary counts as one object (a member publishes one);
		// its namespaces have their own limit, once it is delivered.
		clustersBound := boundedListWatch(m, KindNamespace, "", clustersClient, trimSummary)
		exportsBound.unavailable, clustersBound.unavailable = unavailable, unavailable
		exportsLW, clustersLW = exportsBound, clustersBound
	}
	// One handler each: informers that call it in line rather than
	// client-go's shared ones, which keep a buffer and goroutines per
	// handler, for every member (inlineinformer). The member's version
	// follows what both have handled (listed.go); it counts as listed
	// once both have synced, which is after the raise to their first
	// lists' versions, so that a version another replica issued after
	// those lists is resumed at once.
	onError := m.summaryStream.watchError(m.name, logger)
	progress := newMemberProgress(2, summaryListVersion, func(rv uint64) {
		m.handler(Event{Member: m.name, Kind: KindListed, ResourceVersion: rv})
	}, logger)
	exports := inlineinformer.New(exportsLW, &v1alpha1.InferencePoolExportSummary{}, inlineinformer.Options{
		Handler: m.summariesHandler(), Transform: trimSummary, WatchErrorHandler: onError, OnProgress: progress.of(0),
		Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
	})
	m.clusterSummaries = newClusterSummaryIndexer()
	clusters := inlineinformer.New(clustersLW, &v1alpha1.InferenceClusterSummary{}, inlineinformer.Options{
		Handler: m.clusterSummaryHandler(), Transform: trimSummary, WatchErrorHandler: onError, OnProgress: progress.of(1),
		Indexer: m.clusterSummaries,
	})
	m.summaries = summaryLister{indexer: exports.GetIndexer(), logger: logger}
	m.synced = append(m.synced, exports.HasSynced, clusters.HasSynced)
	logger.Info("Reading the member through the summaries its mci-apiserver publishes (summary mode)")
	return func(ctx context.Context) {
		go exports.Run(ctx)
		go clusters.Run(ctx)
	}
}

// maxSummaryPolicy bounds the cluster policy annotation kept of a summary:
// a canonical configuration is a few hundred bytes, and a member's
// summaries are held by every other cluster's server.
const maxSummaryPolicy = 1024

// maxSummaryScope bounds the export scope annotation kept of a summary.
// A scope that is larger is kept as an empty object, which names no
// cluster: the export reaches no member rather than more members than
// its exporter chose.
const maxSummaryScope = 4096

// summaryAnnotations are the annotations kept of an export summary: its
// exporter's cluster policy, which imports carry on (pkg/imports checks
// it again), when it is not oversized, and its export scope, which the
// exporter's server already applied to what it sends here and which
// placement applies again (pkg/imports).
func summaryAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	if v, ok := in[v1alpha1.ClusterPolicyAnnotation]; ok && len(v) <= maxSummaryPolicy {
		out = map[string]string{v1alpha1.ClusterPolicyAnnotation: v}
	}
	if v, ok := in[v1alpha1.ExportToAnnotation]; ok {
		if len(v) > maxSummaryScope {
			v = "{}"
		}
		if out == nil {
			out = map[string]string{}
		}
		out[v1alpha1.ExportToAnnotation] = v
	}
	return out
}

// trimSummary keeps what the import computation reads of a summary, as
// small as it reads it: no managed fields, annotations but the cluster
// policy (summaryAnnotations) or uid (an import's
// uid is derived from its own name), the resourceVersion down to its one
// member component (summaryVersion; the reflector has taken the whole one
// for resuming before the transform), and then kept encoded
// (compactSummary); the namespaces of a cluster summary sorted (the
// published order is not trusted: lookups search it).
func trimSummary(obj interface{}) (interface{}, error) {
	switch o := obj.(type) {
	case *v1alpha1.InferencePoolExportSummary:
		o.ManagedFields, o.Annotations, o.UID = nil, summaryAnnotations(o.Annotations), ""
		o.ResourceVersion = memberComponent(o.ResourceVersion)
		return compactOf(o)
	case *v1alpha1.InferenceClusterSummary:
		o.ManagedFields, o.Annotations = nil, nil
		if !slices.IsSorted(o.Status.Namespaces) {
			slices.Sort(o.Status.Namespaces)
		}
		o.Status.Namespaces = slices.Compact(o.Status.Namespaces)
	}
	return obj, nil
}

// memberComponent re-encodes a summary's resourceVersion with its member
// component only; one it cannot read is kept whole, for summaryRV to
// report.
func memberComponent(rv string) string {
	v, err := versionvector.Decode(rv)
	if err != nil {
		return rv
	}
	for k := range v {
		if strings.HasPrefix(k, "~") {
			delete(v, k)
		}
	}
	return versionvector.Encode(v)
}

// summaryVersion is the member's own resourceVersion at a summary: the
// one member component of the summary's version vector (a summary depends
// on its own cluster only, so its server's version has no other). It is
// what full mode would have read on the member's objects, so versions
// issued here mean the same in both modes.
func summaryVersion(rv string) (uint64, error) {
	v, err := versionvector.Decode(rv)
	if err != nil {
		return 0, err
	}
	var (
		found uint64
		n     int
	)
	for k, c := range v {
		if strings.HasPrefix(k, "~") {
			continue
		}
		found, n = c, n+1
	}
	if n > 1 {
		return 0, fmt.Errorf("resourceVersion %q of a summary has %d member components, not one", rv, n)
	}
	return found, nil
}

// summaryListVersion is the member's own resourceVersion at a list of its
// summaries, read as summaryRV reads a summary's, without freezing the
// member: a version that cannot be read only raises nothing.
func summaryListVersion(rv string) (uint64, error) {
	n, err := summaryVersion(rv)
	if err != nil {
		return memberResourceVersion(rv)
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("resourceVersion %.64q of a list of summaries has member component %d, past the int64 range of a kube-apiserver's", rv, n)
	}
	return n, nil
}

// summariesHandler passes summary changes on as Events of
// KindExportSummary.
func (m *member) summariesHandler() cache.ResourceEventHandler {
	notify := func(obj interface{}, deleted, changed bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		o, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		rv, ok := m.summaryRV(o.GetResourceVersion())
		if !ok || !m.admit(KindExportSummary, o.GetNamespace(), o.GetName(), obj, deleted, changed) {
			return
		}
		m.handler(Event{Member: m.name, Kind: KindExportSummary, Namespace: o.GetNamespace(), Name: o.GetName(), ResourceVersion: rv})
	}
	return countedHandler(notify)
}

// clusterSummaryHandler passes a change of the member's namespaces on as a
// KindNamespace Event per namespace that came or went, as the member's
// Namespace informer does in full mode. A cluster summary named after
// another cluster than the member is refused, and freezes the member: a
// member must not speak for another.
func (m *member) clusterSummaryHandler() cache.ResourceEventHandler {
	namespacesOf := func(obj interface{}) ([]string, uint64) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*v1alpha1.InferenceClusterSummary)
		if !ok || s == nil || s.Name != m.name {
			return nil, 0
		}
		rv, _ := m.summaryRV(s.ResourceVersion)
		return s.Status.Namespaces, rv
	}
	diff := func(old, obj interface{}, deleted, changed bool) {
		if s, ok := obj.(*v1alpha1.InferenceClusterSummary); ok && s.Name != m.name && !deleted {
			m.freeze(quotaIdentity, fmt.Sprintf("it publishes a cluster summary named %q, not after the member", s.Name))
			return
		}
		if s, ok := obj.(*v1alpha1.InferenceClusterSummary); ok && !deleted {
			if _, ok := m.summaryRV(s.ResourceVersion); !ok {
				return
			}
		}
		before, _ := namespacesOf(old)
		after, rv := namespacesOf(obj)
		if deleted {
			before, after = after, nil
		}
		if !m.admit(KindNamespace, "", "", nil, true, changed) || !m.admitNamespaces(len(after)) {
			return
		}
		for _, ns := range symmetricDifference(before, after) {
			m.handler(Event{Member: m.name, Kind: KindNamespace, Namespace: ns, ResourceVersion: rv})
		}
	}
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj interface{}, initial bool) { diff(nil, obj, false, !initial) },
		UpdateFunc: func(old, obj interface{}) { diff(old, obj, false, resourceVersionOf(old) != resourceVersionOf(obj)) },
		DeleteFunc: func(obj interface{}) { diff(nil, obj, true, true) },
	}
}

// symmetricDifference lists the names in exactly one of the sorted lists a
// and b.
func symmetricDifference(a, b []string) []string {
	var out []string
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return out
}

// summaryRV reads the member's resourceVersion off a summary, and
// freezes the member at one this server cannot order (resourceversion.go);
// it reports whether the change may be passed on. A summary with no member
// component has version 0 (unknown), as a deletion seen only through a
// relist does.
func (m *member) summaryRV(rv string) (uint64, bool) {
	n, err := summaryVersion(rv)
	if err != nil {
		// A plain resourceVersion, as summaries served from CRDs carry:
		// the member's own.
		if plain, perr := memberResourceVersion(rv); perr == nil {
			n, err = plain, nil
		}
	}
	if err == nil && n > math.MaxInt64 {
		err = fmt.Errorf("resourceVersion %.64q of a summary has member component %d, past the int64 range of a kube-apiserver's", rv, n)
	}
	if err != nil {
		m.freeze(quotaResourceVersion, err.Error())
		return 0, false
	}
	return n, true
}

// summaryNamespaces is the member's namespaces as its one
// InferenceClusterSummary lists them; none until it is listed. A member
// that publishes several (it is not mci-apiserver) is read as having none,
// which its stream's state says.
func (m *member) summaryNamespaces(held heldClusterSummary) imports.SummaryNamespaces {
	if held.count != 1 {
		if held.count > 1 {
			m.summaryStream.unreadable(m.name, fmt.Errorf("the member publishes %d InferenceClusterSummaries, not one", held.count))
		}
		return nil
	}
	if held.name != m.name {
		// Refused (clusterSummaryHandler froze the member).
		return nil
	}
	return held.namespaces
}

// heldClusterSummary is what this server holds of the member's cluster
// summaries; none when it is not read in summary mode.
func (m *member) heldClusterSummary() heldClusterSummary {
	if m.mode != modeSummary || m.clusterSummaries == nil {
		return heldClusterSummary{}
	}
	return m.clusterSummaries.summary()
}

// speaksForAnother reports whether the member was refused as another
// cluster under a second name: its cluster ID is another member's
// (identity.go), or its cluster summary names another cluster
// (clusterSummaryHandler). Nothing it sent is served then, not even as last
// known data, since it is not this member's. A summary is read off the
// cache too (clusterSummaryIndexer), so that nothing is served in the
// moment between the write and the freeze.
func (m *member) speaksForAnother(held heldClusterSummary) bool {
	if reason, _, _ := m.quota.state(); reason == quotaIdentity {
		return true
	}
	return held.count == 1 && held.name != m.name
}

// summaryStream is what this replica knows of a member's summary stream:
// how often its list or watch failed, and its last error, logged once per
// change. The member's kube-apiserver may answer the probe while its
// mci-apiserver does not: its summaries are then kept as last known, and
// the log and mci_clusterset_member_summary_errors_total say so.
type summaryStream struct {
	mu      sync.Mutex
	errors  uint64
	state   statelog.State
	version statelog.State
}

func (s *summaryStream) watchError(member string, logger klog.Logger) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *cache.Reflector, err error) {
		if ctx.Err() != nil {
			return // the member is being stopped
		}
		s.failed(member, logger, err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}
}

// failed counts a failed list or watch of the member's summaries, and logs
// it once per change.
func (s *summaryStream) failed(member string, logger klog.Logger, err error) {
	s.mu.Lock()
	s.errors++
	change := s.state.Observe(time.Now(), "", err.Error(), summaryStreamLog)
	s.mu.Unlock()
	if change.Loud() {
		logger.Error(err, "The member's summary stream failed; its last known summaries are kept while it retries", "member", member)
	}
}

// unreadable records a summary this server cannot read: its version, or a
// member that publishes more than one cluster summary.
func (s *summaryStream) unreadable(member string, err error) {
	s.mu.Lock()
	change := s.version.Observe(time.Now(), "", err.Error(), summaryStreamLog)
	if change.Loud() {
		// Counted once per change, as logged: a snapshot reads the
		// member's summaries many times over.
		s.errors++
	}
	s.mu.Unlock()
	if change.Loud() {
		klog.Background().Error(err, "A summary of the member cannot be read", "member", member)
	}
}

func (s *summaryStream) errorCount() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errors
}
