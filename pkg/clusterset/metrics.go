package clusterset

import (
	"k8s.io/component-base/metrics"
)

// Metrics exports each member's state as this replica sees it, read from
// the Cache at scrape time so that a member replaced (rotated credentials)
// or removed from the ClusterSet never leaves a stale series behind:
//
//	mci_clusterset_member_listed{member}       1 once every informer of the member has listed
//	mci_clusterset_member_unreachable{member}  1 while flagged ClusterUnreachable (last known data kept)
//	mci_clusterset_member_removed{member}      1 past --member-remove-after (its pools no longer served)
//	mci_clusterset_member_summary_mode{member} 1 while read through the summaries its mci-apiserver publishes
//	mci_clusterset_member_summary_errors_total{member} failed lists and watches of those summaries
//	mci_clusterset_member_mode{member,mode}     1 for the mode the member is read in (full, summary, discovering)
//	mci_clusterset_member_frozen{member,quota}  1 while frozen at that limit (quota.go)
//	mci_clusterset_member_limit_exceeded_total{member,quota} freezes by limit
//	mci_clusterset_member_cluster_id_unknown{member,reason} 1 while its cluster ID cannot be read (identity.go)
//	mci_clusterset_member_credentials_rejected{member,reason} 1 while it refuses the credentials (credentials.go)
//	mci_clusterset_member_credential_expiry_timestamp_seconds{member,kind,source} when a credential sent expires, and who renews it
//	mci_clusterset_member_pods_forbidden{member}  namespaces of its pools whose Pods its credentials may not list (podaccess.go)
//	mci_clusterset_member_draining{member}      1 while its Secret or ClusterProfile drains it (memberdrain.go)
//	mci_clusterset_member_drain_invalid{member} 1 while that drain annotation has a value it ignores
//
// A replica is not ready while a member has listed 0 and removed 0
// (Cache.Ready): these say which member holds it back.
type Metrics struct {
	metrics.BaseStableCollector
	cache *Cache
}

var (
	memberListedDesc = metrics.NewDesc("mci_clusterset_member_listed",
		"1 once every informer of the member has listed in this replica, else 0; a replica is not ready while a member that is not removed has not listed, unless it is flagged CredentialsRejected or frozen.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberUnreachableDesc = metrics.NewDesc("mci_clusterset_member_unreachable",
		"1 while the member is flagged ClusterUnreachable (it has not answered for --member-unreachable-after; its last known data is kept), else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberSummaryModeDesc = metrics.NewDesc("mci_clusterset_member_summary_mode",
		"1 while this replica reads the member through the InferencePoolExportSummaries and InferenceClusterSummary its own mci-apiserver publishes (summary mode), 0 while it watches the member's objects (full mode).",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberSummaryErrorsDesc = metrics.NewDesc("mci_clusterset_member_summary_errors_total",
		"Failed lists and watches of the member's summaries, and problems reading them (more than one cluster summary) once per change, at most once a minute, in summary mode; meanwhile the last known summaries are served.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberModeDesc = metrics.NewDesc("mci_clusterset_member_mode",
		"1 for the mode this replica reads the member in, 0 for the others: full (its objects are watched), summary (the summaries its own mci-apiserver publishes), discovering (its API discovery has not said yet whether it publishes summaries: nothing of it is read, and it is asked again with backoff).",
		[]string{"member", "mode"}, nil, metrics.ALPHA, "")
	memberFrozenDesc = metrics.NewDesc("mci_clusterset_member_frozen",
		"1 while the member is frozen because it exceeded the limit named by quota (objects, bytes, namespaces, eventRate, responseBytes, identity, resourceVersion): its last known data is served flagged ClusterUnreachable and nothing more it sends is applied; else 0.",
		[]string{"member", "quota"}, nil, metrics.ALPHA, "")
	memberLimitExceededDesc = metrics.NewDesc("mci_clusterset_member_limit_exceeded_total",
		"Times the member was frozen for exceeding the limit named by quota, by this member instance (a member read again after --member-freeze-retry, or reconnected, counts anew).",
		[]string{"member", "quota"}, nil, metrics.ALPHA, "")
	memberClusterIDUnknownDesc = metrics.NewDesc("mci_clusterset_member_cluster_id_unknown",
		"1 while the member's cluster ID (the uid of its kube-system Namespace) cannot be read, for the reason named: forbidden (its credentials may not get that Namespace) or error; whether it is another member's cluster under a second name is then not checked, and it is served as it is. Else 0.",
		[]string{"member", "reason"}, nil, metrics.ALPHA, "")
	memberCredentialsRejectedDesc = metrics.NewDesc("mci_clusterset_member_credentials_rejected",
		"1 while the member answers but refuses the credentials this replica reads it with, for the reason named: unauthorized (401 to any request: expired, revoked or not its own) or forbidden (403 to its probe or to a list or watch mci needs); its last known data is served flagged CredentialsRejected and is not removed while it answers. Else 0.",
		[]string{"member", "reason"}, nil, metrics.ALPHA, "")
	memberCredentialExpiryDesc = metrics.NewDesc("mci_clusterset_member_credential_expiry_timestamp_seconds",
		"When the credential this replica sends the member expires, in seconds since the epoch, by kind: token (the exp claim of a bearer token that is a JWT) or client-certificate (a client certificate's NotAfter); and by source, who renews it: inline (the member's kubeconfig holds it: someone must rotate the kubeconfig), file (client-go reads it again from a file named in the kubeconfig, which whatever writes the file renews: a projected token) or plugin (an exec plugin hands it over and client-go runs the plugin again before it expires). Absent when it cannot be read (an opaque token, a certificate an exec plugin hands over).",
		[]string{"member", "kind", "source"}, nil, metrics.ALPHA, "")
	memberPodsForbiddenDesc = metrics.NewDesc("mci_clusterset_member_pods_forbidden",
		"Namespaces of the member's pools whose Pods the credentials this replica reads it with may not list (403): the exports there publish no endpoint addresses (or the last ones listed), so importers accept no destination their EPPs name. The rest of the member is served. 0 when it may list them all.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberDrainingDesc = metrics.NewDesc("mci_clusterset_member_draining",
		"1 while the Secret or ClusterProfile that names the member carries the drain annotation \"true\": its exports are flagged Draining in imports and sidecars send it no new requests; else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberDrainInvalidDesc = metrics.NewDesc("mci_clusterset_member_drain_invalid",
		"1 while the drain annotation of the Secret or ClusterProfile that names the member has a value other than \"true\" or \"false\", which is ignored: the member does not drain. Else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
	memberRemovedDesc = metrics.NewDesc("mci_clusterset_member_removed",
		"1 while the member has not answered for --member-remove-after, so the pools it exported are not served, else 0.",
		[]string{"member"}, nil, metrics.ALPHA, "")
)

// NewMetrics returns the collector of the cache's member states, to be
// registered with the server's metrics registry.
func NewMetrics(c *Cache) *Metrics { return &Metrics{cache: c} }

// DescribeWithStability implements metrics.StableCollector.
func (m *Metrics) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- memberListedDesc
	ch <- memberUnreachableDesc
	ch <- memberRemovedDesc
	ch <- memberSummaryModeDesc
	ch <- memberSummaryErrorsDesc
	ch <- memberModeDesc
	ch <- memberFrozenDesc
	ch <- memberLimitExceededDesc
	ch <- memberClusterIDUnknownDesc
	ch <- memberCredentialsRejectedDesc
	ch <- memberCredentialExpiryDesc
	ch <- memberPodsForbiddenDesc
	ch <- memberDrainingDesc
	ch <- memberDrainInvalidDesc
}

// CollectWithStability implements metrics.StableCollector.
func (m *Metrics) CollectWithStability(ch chan<- metrics.Metric) {
	m.cache.mu.RLock()
	members := append([]*member(nil), m.cache.sorted...)
	metas := m.cache.metas
	m.cache.mu.RUnlock()
	for _, mb := range members {
		st := mb.status()
		ch <- metrics.NewLazyConstMetric(memberListedDesc, metrics.GaugeValue, bit(mb.hasSynced()), mb.name)
		ch <- metrics.NewLazyConstMetric(memberUnreachableDesc, metrics.GaugeValue, bit(st != nil), mb.name)
		ch <- metrics.NewLazyConstMetric(memberRemovedDesc, metrics.GaugeValue, bit(st != nil && st.removed), mb.name)
		ch <- metrics.NewLazyConstMetric(memberSummaryModeDesc, metrics.GaugeValue, bit(mb.mode == modeSummary), mb.name)
		ch <- metrics.NewLazyConstMetric(memberSummaryErrorsDesc, metrics.CounterValue, float64(mb.summaryStream.errorCount()), mb.name)
		if mb.quota != nil {
			frozen, _, _ := mb.quota.state()
			for _, q := range quotaNames {
				ch <- metrics.NewLazyConstMetric(memberFrozenDesc, metrics.GaugeValue, bit(frozen == q), mb.name, q)
				ch <- metrics.NewLazyConstMetric(memberLimitExceededDesc, metrics.CounterValue, float64(mb.quota.exceededCount(q)), mb.name, q)
			}
		}
		unknown := mb.identityUnknown()
		for _, r := range idReasons {
			ch <- metrics.NewLazyConstMetric(memberClusterIDUnknownDesc, metrics.GaugeValue, bit(unknown == r), mb.name, r)
		}
		rejected := mb.credentials.rejected()
		for _, r := range rejectionReasons {
			ch <- metrics.NewLazyConstMetric(memberCredentialsRejectedDesc, metrics.GaugeValue, bit(rejected != nil && rejected.reason == r), mb.name, r)
		}
		if mb.credentials != nil {
			expiries := mb.credentials.expiries()
			for _, kind := range credentialKinds {
				if e, ok := expiries[kind]; ok {
					ch <- metrics.NewLazyConstMetric(memberCredentialExpiryDesc, metrics.GaugeValue, float64(e.at.Unix()), mb.name, kind, e.source)
				}
			}
		}
		ch <- metrics.NewLazyConstMetric(memberPodsForbiddenDesc, metrics.GaugeValue, float64(len(mb.poolNamespaces.podsDenied())), mb.name)
		draining, err := metas[mb.name].draining()
		ch <- metrics.NewLazyConstMetric(memberDrainingDesc, metrics.GaugeValue, bit(draining), mb.name)
		ch <- metrics.NewLazyConstMetric(memberDrainInvalidDesc, metrics.GaugeValue, bit(err != nil), mb.name)
		for _, mode := range memberModes {
			ch <- metrics.NewLazyConstMetric(memberModeDesc, metrics.GaugeValue, bit(mb.mode == mode), mb.name, string(mode))
		}
	}
}

func bit(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
