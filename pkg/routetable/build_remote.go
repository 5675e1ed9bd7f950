package routetable

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
)

// remoteClusters resolves an import's clusters, once: the entries whose
// Ready condition is not False and that carry what their routing mode
// needs.
func (b *builder) remoteClusters(imp *v1alpha1.InferencePoolImport) []*Cluster {
	key := types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}
	ref := objectRef{remote: true, key: key}
	b.use(ref)
	if rr, ok := b.remotes[key]; ok {
		return rr.clusters
	}
	mark := len(b.errs)
	out := b.resolveRemote(imp)
	b.remotes[key] = remoteResult{clusters: out, errs: b.resolved(ref, mark)}
	return out
}

// resolveRemote resolves each cluster entry of imp. The Incremental
// builder keeps each entry's resolution (cluster and problems) and reuses
// it while the entry is unchanged, so that an export change costs the
// entries it changes, not the import's every entry.
func (b *builder) resolveRemote(imp *v1alpha1.InferencePoolImport) []*Cluster {
	key := types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}
	var memo *entryMemo
	if b.incremental {
		memo = b.entryMemo[key].next(len(imp.Status.Clusters))
		b.entryMemo[key] = memo
	}
	out := make([]*Cluster, 0, len(imp.Status.Clusters))
	notReady := 0
	for i := range imp.Status.Clusters {
		ic := &imp.Status.Clusters[i]
		re, ok := memo.find(i, ic.Name)
		if ok && sameEntry(re.from, ic) {
			b.errs = append(b.errs, re.errs...)
		} else {
			re = b.resolveEntry(imp, ic)
			memo.set(i, re)
		}
		if re.notReady {
			notReady++
		}
		if re.cluster != nil {
			out = append(out, re.cluster)
		}
	}
	if len(out) == 0 {
		b.report(InferencePoolImportKind, imp.Namespace, imp.Name, ReasonNoReadyClusters, "none of its %d cluster(s) can take requests (%d not Ready); its requests get 503, or follow FailOpen", len(imp.Status.Clusters), notReady)
	}
	return out
}

// entryMemo is the resolution of each cluster entry of an import, in the
// import's order, and the previous resolution's when the number of
// entries changed. A resolution is reused only for an entry that is the
// same as the one it was made of (its from), so the memo may hold any
// resolution in any place: where an entry's is looked for decides only
// how often one is found.
type entryMemo struct {
	entries []resolvedEntry
	prev    []resolvedEntry
	// byName indexes prev (entries when prev is nil) by entry name, made
	// when an entry is not where it was.
	byName map[string]int
}

// next is the memo for a resolution of n entries.
func (m *entryMemo) next(n int) *entryMemo {
	if m != nil && len(m.entries) == n {
		m.prev, m.byName = nil, nil
		return m
	}
	out := &entryMemo{entries: make([]resolvedEntry, n)}
	if m != nil {
		out.prev = m.entries
	}
	return out
}

// find is the resolution that entry i, of this name, had: in place when
// the entries are where they were, else by name.
func (m *entryMemo) find(i int, name string) (resolvedEntry, bool) {
	if m == nil {
		return resolvedEntry{}, false
	}
	old := m.entries
	if m.prev != nil {
		old = m.prev
	}
	if i < len(old) && old[i].from != nil && old[i].from.Name == name {
		return old[i], true
	}
	if m.byName == nil {
		m.byName = make(map[string]int, len(old))
		for j, re := range old {
			if re.from != nil {
				m.byName[re.from.Name] = j
			}
		}
	}
	j, ok := m.byName[name]
	if !ok {
		return resolvedEntry{}, false
	}
	return old[j], true
}

func (m *entryMemo) set(i int, re resolvedEntry) {
	if m != nil {
		m.entries[i] = re
	}
}

// resolvedEntry is the resolution of one cluster entry of an import: from
// is (a copy of) the entry, cluster what it resolved to (nil: skipped),
// errs the problems it reported.
type resolvedEntry struct {
	from     *v1alpha1.ImportedCluster
	cluster  *Cluster
	notReady bool
	errs     []error
}

// resolveEntry resolves cluster entry ic of imp, reporting its problems;
// for the Incremental builder, they are kept with the result too.
func (b *builder) resolveEntry(imp *v1alpha1.InferencePoolImport, ic *v1alpha1.ImportedCluster) resolvedEntry {
	mark := len(b.errs)
	c, notReady := b.resolveCluster(imp, *ic)
	re := resolvedEntry{cluster: c, notReady: notReady}
	if b.incremental {
		re.from, re.errs = ic.DeepCopy(), slices.Clone(b.errs[mark:])
	}
	return re
}

// resolveCluster resolves cluster entry ic of imp: nil when it cannot take
// requests (notReady when that is its Ready condition), reported.
func (b *builder) resolveCluster(imp *v1alpha1.InferencePoolImport, ic v1alpha1.ImportedCluster) (_ *Cluster, notReady bool) {
	key := types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}
	report := func(reason, format string, args ...any) {
		b.report(InferencePoolImportKind, imp.Namespace, imp.Name, reason, format, args...)
	}
	if ic.Name == b.local {
		// An import never lists the importing cluster; one that does
		// would send requests in a circle.
		report(ReasonLocalClusterInImport, "cluster %q is the local cluster; it is skipped", ic.Name)
		return nil, false
	}
	stale := false
	if ready := meta.FindStatusCondition(ic.Conditions, v1alpha1.ConditionReady); ready != nil && ready.Status == metav1.ConditionFalse {
		if ready.Reason != v1alpha1.ReasonClusterUnreachable && ready.Reason != v1alpha1.ReasonCredentialsRejected {
			return nil, true
		}
		// A cluster that rejects mci-apiserver's credentials is as
		// unknown to the control plane as one it cannot reach; its
		// data plane may well serve.
		stale = true
		report(ReasonClusterUnreachable, "cluster %q is unreachable from mci-apiserver or rejects its credentials (%s); its last known EPP stays a candidate after every reachable cluster", ic.Name, ready.Message)
	}
	weight, region, tags := exportSettings(ic)
	c := &Cluster{Name: ic.Name, Pool: key.String(), Mode: cmp.Or(ic.RoutingMode, v1alpha1.RoutingModeEndpoint), Weight: weight, Region: region, Tags: tags, Stale: stale,
		Draining: meta.IsStatusConditionTrue(ic.Conditions, v1alpha1.ConditionDraining)}
	switch c.Mode {
	case v1alpha1.RoutingModeEndpoint:
		if !b.remoteEPP(c, imp, ic, report) {
			return nil, false
		}
	case v1alpha1.RoutingModeParent:
		c.Parent = parentAddress(ic.Parents)
		if c.Parent == "" {
			report(ReasonInvalidImportedCluster, "cluster %q: no parent gateway has an address and a port; the cluster is skipped", ic.Name)
			return nil, false
		}
	default:
		report(ReasonInvalidImportedCluster, "cluster %q: unknown routing mode %q; the cluster is skipped", ic.Name, ic.RoutingMode)
		return nil, false
	}
	return c, false
}

// remoteEPP fills in how c, imported cluster ic of imp in EndpointMode, is
// reached; false when it cannot be, reported.
func (b *builder) remoteEPP(c *Cluster, imp *v1alpha1.InferencePoolImport, ic v1alpha1.ImportedCluster, report func(reason, format string, args ...any)) bool {
	if !publishedEndpoints(c, ic, report) {
		return false
	}
	svc := ic.EndpointPicker.Service
	if len(svc) == 0 || len(svc[0].Addresses) == 0 || len(svc[0].Ports) == 0 || svc[0].Ports[0].Number <= 0 {
		report(ReasonInvalidImportedCluster, "cluster %q: the endpointPicker has no service address and port; the cluster is skipped", ic.Name)
		return false
	}
	epp := ic.EndpointPicker
	secrets, err := importSecrets(imp.Namespace, epp.SecretRef, epp.Health, epp.Metrics)
	if err != nil {
		// Never plaintext to an EPP that its import says serves TLS.
		report(ReasonInvalidImportedCluster, "cluster %q: %v; the cluster is skipped", ic.Name, err)
		return false
	}
	if err := b.importTransports(c, imp.Namespace, epp, secrets); err != nil {
		report(ReasonInvalidImportedCluster, "cluster %q: %v; the cluster is skipped", ic.Name, err)
		return false
	}
	if !b.checkRemoteExtProc(types.NamespacedName{Namespace: imp.Namespace, Name: imp.Name}, c) {
		return false
	}
	host := svc[0].Addresses[0]
	c.EPP = net.JoinHostPort(host, strconv.Itoa(int(svc[0].Ports[0].Number)))
	if h := epp.Health; h != nil && h.Port > 0 {
		c.Health = net.JoinHostPort(host, strconv.Itoa(int(h.Port)))
	}
	if m := epp.Metrics; m != nil && m.Port > 0 {
		c.Metrics = metricsURL(host, m.Port, c.MetricsTransport.TLS)
		// A token that cannot be used fails the metrics port
		// alone: the cluster is routed to, unmeasured.
		if c.MetricsToken, err = secretIn(imp.Namespace, m.TokenSecretRef); err != nil {
			report(ReasonInvalidImportedCluster, "cluster %q: metrics.tokenSecretRef: %v; its EPP's metrics are not scraped", ic.Name, err)
			c.Metrics = ""
		}
	}
	return true
}

// publishedEndpoints sets what a destination of c's EPP (imported cluster
// ic, in EndpointMode) must match: false, reported, when nothing could
// (no endpoint addresses, or a list that does not parse), since every
// answer of its EPP would be refused; the requests go to the other
// clusters instead. An exporter whose mci-apiserver predates the list
// publishes none: upgrade mci-apiservers before sidecars.
func publishedEndpoints(c *Cluster, ic v1alpha1.ImportedCluster, report func(reason, format string, args ...any)) bool {
	addrs, err := publishedaddrs.Parse(ic.EndpointAddresses)
	switch {
	case err != nil:
		report(ReasonInvalidImportedCluster, "cluster %q: endpointAddresses: %v; the cluster is skipped", ic.Name, err)
		return false
	case addrs.Len() == 0:
		report(ReasonInvalidImportedCluster, "cluster %q publishes no endpoint addresses for the pool, so no destination its EPP names could be accepted; the cluster is skipped", ic.Name)
		return false
	}
	c.Published = eppanswer.Published{Port: ic.TargetPortNumber, Addresses: addrs}
	return true
}

// importTransports resolves how each port of an imported cluster's EPP is
// reached, from the import's transports, its Secrets and the sidecar's
// defaults.
func (b *builder) importTransports(c *Cluster, namespace string, epp v1alpha1.EndpointPickerImport, secrets [3]types.NamespacedName) error {
	def := b.in.DefaultTransport
	mode, validation := eppaddr.TransportOf(epp.Transport)
	var err error
	if c.EPPTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortExtProc, mode, secrets[0], validation, namespace, def.ExtProc); err != nil {
		return err
	}
	if epp.Health != nil {
		mode, validation = eppaddr.TransportOf(epp.Health.Transport)
		if c.HealthTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortHealth, mode, secrets[1], validation, namespace, def.Health); err != nil {
			return err
		}
	}
	if epp.Metrics != nil {
		mode, validation = eppaddr.TransportOf(epp.Metrics.Transport)
		if c.MetricsTransport, err = eppaddr.ResolvePortTransport(eppaddr.PortMetrics, mode, secrets[2], validation, namespace, def.Metrics); err != nil {
			return err
		}
	}
	return nil
}

// importSecrets returns the Secrets of an import's endpointPicker, health
// and metrics secretRefs (zero for none). A reference without a namespace
// is to the import's own; one to another namespace is refused, as there is
// no ReferenceGrant for it (mci-apiserver only ever names the pool's).
func importSecrets(namespace string, epp *corev1.SecretReference, health *v1alpha1.HealthEndpoint, metrics *v1alpha1.MetricsEndpoint) ([3]types.NamespacedName, error) {
	refs := [3]*corev1.SecretReference{epp}
	if health != nil {
		refs[1] = health.SecretRef
	}
	if metrics != nil {
		refs[2] = metrics.SecretRef
	}
	var out [3]types.NamespacedName
	for i, r := range refs {
		var err error
		if out[i], err = secretIn(namespace, r); err != nil {
			return out, err
		}
	}
	return out, nil
}

// secretIn is the Secret r names, which must be of the import's namespace
// (namespace sameness); none for nil.
func secretIn(namespace string, r *corev1.SecretReference) (types.NamespacedName, error) {
	if r == nil {
		return types.NamespacedName{}, nil
	}
	ns := cmp.Or(r.Namespace, namespace)
	if ns != namespace {
		return types.NamespacedName{}, fmt.Errorf("secretRef %s/%s is in another namespace than the import's; only Secrets of namespace %s can be used", ns, r.Name, namespace)
	}
	if r.Name == "" {
		return types.NamespacedName{}, errors.New("a secretRef has no name")
	}
	return types.NamespacedName{Namespace: ns, Name: r.Name}, nil
}

// parentAddress is where a ParentMode request goes: the first parent
// gateway that is Programmed (or says nothing) with an address and a port,
// its first address and lowest listener port.
func parentAddress(parents []v1alpha1.ParentImport) string {
	best := ""
	for _, p := range parents {
		if len(p.Service) == 0 || len(p.Service[0].Addresses) == 0 || len(p.Service[0].Ports) == 0 {
			continue
		}
		addr := net.JoinHostPort(p.Service[0].Addresses[0], strconv.Itoa(int(p.Service[0].Ports[0].Number)))
		if !meta.IsStatusConditionFalse(p.Conditions, string(gatewayv1.GatewayConditionProgrammed)) {
			return addr
		}
		if best == "" {
			best = addr
		}
	}
	return best
}

// exportSettings reads what an imported cluster's exporter states: its
// weight (1 when it states none), region and tags.
func exportSettings(ic v1alpha1.ImportedCluster) (weight int64, region string, tags map[string]string) {
	s := ic.ExportSettings
	if s == nil {
		return 1, "", nil
	}
	// mci-apiserver serves 1 to 1000; another server's import is held to
	// the same bounds rather than trusted with the route's arithmetic.
	return min(max(int64(s.Weight), 1), 1000), s.Region, s.Tags
}
