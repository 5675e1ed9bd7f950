package inferencepoolexportsummary

import (
	"context"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/mci-dev/mci/pkg/apis/inference"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/imports"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

const (
	// MemberGroupPrefix, followed by a member's name, is the group of the
	// identity that member's mci-apiserver reads this cluster's summaries
	// with (a client certificate's organization, an OIDC or proxy group).
	MemberGroupPrefix = "mci.x-k8s.io:member:"
	// MemberServiceAccountPrefix, followed by a member's name, is the name
	// of the ServiceAccount whose token that member's mci-apiserver reads
	// this cluster's summaries with, for ServiceAccount tokens, which
	// carry no group of one's choosing.
	MemberServiceAccountPrefix = "mci-member-reader."
)

// ReaderMember says which member of the ClusterSet a reader of the
// summaries reads for: the member its identity names by MemberGroupPrefix
// or MemberServiceAccountPrefix. ok=false for an identity that names no
// member, or names two: such a reader is sent the exports that are not
// scoped only. The name is trusted as far as the cluster's authentication
// is: whoever holds the identity is that member, as whoever holds a
// member Secret's kubeconfig is.
func ReaderMember(u user.Info) (string, bool) {
	name, reason := readerMember(u)
	return name, reason == ""
}

// Why a reader names no member: the reason label of
// mci_apiserver_summary_reader_unidentified_total.
const (
	unidentifiedNoMember    = "no_member"
	unidentifiedTwoMembers  = "several_members"
	unidentifiedInvalidName = "invalid_member_name"
)

// readerMember is ReaderMember, with why it names no member ("" when it
// names one).
func readerMember(u user.Info) (string, string) {
	if u == nil {
		return "", unidentifiedNoMember
	}
	var names []string
	for _, g := range u.GetGroups() {
		if name, ok := strings.CutPrefix(g, MemberGroupPrefix); ok {
			names = append(names, name)
		}
	}
	if _, sa, err := serviceaccount.SplitUsername(u.GetName()); err == nil {
		if name, ok := strings.CutPrefix(sa, MemberServiceAccountPrefix); ok {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", unidentifiedNoMember
	}
	for _, n := range names[1:] {
		if n != names[0] {
			return "", unidentifiedTwoMembers
		}
	}
	if len(validation.IsDNS1123Subdomain(names[0])) > 0 {
		return "", unidentifiedInvalidName
	}
	return names[0], ""
}

var unidentifiedReaders = metrics.NewCounterVec(&metrics.CounterOpts{
	Name: "mci_apiserver_summary_reader_unidentified_total",
	Help: "Requests for InferencePoolExportSummaries (list, get, watch) whose reader's identity names no member of the ClusterSet, by reason: " +
		"no_member (neither a group " + MemberGroupPrefix + "<cluster> nor a ServiceAccount " + MemberServiceAccountPrefix + "<cluster>), " +
		"several_members (it names two), invalid_member_name (the name is no cluster name). Such a reader is sent the exports that are not scoped only; " +
		"each change of the identity is also one log line.",
	StabilityLevel: metrics.ALPHA,
}, []string{"reason"})

func init() {
	legacyregistry.MustRegister(unidentifiedReaders)
}

// unidentifiedLog logs a reader that names no member once per change of
// its identity and reason, rather than once per request.
type unidentifiedLog struct {
	mu   sync.Mutex
	last string
}

func (l *unidentifiedLog) note(ctx context.Context, u user.Info, reason string) {
	unidentifiedReaders.WithLabelValues(reason).Inc()
	who := ""
	if u != nil {
		who = u.GetName()
	}
	key := who + "\x00" + reason
	l.mu.Lock()
	changed := l.last != key
	l.last = key
	l.mu.Unlock()
	if changed {
		klog.FromContext(ctx).Info("A reader of the export summaries names no member of the ClusterSet; it is sent the exports that are not scoped only (counted in mci_apiserver_summary_reader_unidentified_total; logged again when another such reader comes)",
			"user", who, "reason", reason, "memberGroupPrefix", MemberGroupPrefix, "memberServiceAccountPrefix", MemberServiceAccountPrefix)
	}
}

// MemberLabels gives the labels this cluster's membership knows a member
// by (its Secret's or ClusterProfile's).
type MemberLabels interface {
	MemberLabels(name string) map[string]string
}

// Visibility is what the summary stream sends each reader: the summaries
// of exports whose scope (the pool's export-to annotation, which the
// summary carries) includes the member the reader reads for, with that
// member's labels as this cluster knows them. A member outside an
// export's scope is never sent its summary: not in a LIST, not in a
// WATCH (a scope that comes to exclude it is a DELETED event, one that
// comes to include it an ADDED one), 404 to a GET. A reader that names no
// member gets the exports that are not scoped only.
//
// The member's labels are read when each summary is judged, not once per
// request: a watch outlives what this cluster knew of the reader when it
// began (a reader that connects while this server's membership is still
// being read, a member whose labels change), and the next change of a
// summary must reach it with the labels known then.
func Visibility(members MemberLabels) func(ctx context.Context) func(virtual.Object) bool {
	var log unidentifiedLog
	return func(ctx context.Context) func(virtual.Object) bool {
		u, _ := genericapirequest.UserFrom(ctx)
		name, reason := readerMember(u)
		identified := reason == ""
		if !identified {
			log.note(ctx, u, reason)
		}
		return func(o virtual.Object) bool {
			s, ok := o.(*inference.InferencePoolExportSummary)
			if !ok {
				return false
			}
			if !identified {
				// Not even a selector of absent labels ("!region")
				// reaches a reader that is no member.
				_, scoped := s.Annotations[v1alpha1.ExportToAnnotation]
				return !scoped
			}
			return imports.ExportScopeIncludes(s, name, members.MemberLabels(name))
		}
	}
}
