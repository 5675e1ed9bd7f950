package inferencepoolexportsummary

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

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
	if u == nil {
		return "", false
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
		return "", false
	}
	for _, n := range names[1:] {
		if n != names[0] {
			return "", false
		}
	}
	if len(validation.IsDNS1123Subdomain(names[0])) > 0 {
		return "", false
	}
	return names[0], true
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
func Visibility(members MemberLabels) func(ctx context.Context) func(virtual.Object) bool {
	return func(ctx context.Context) func(virtual.Object) bool {
		u, _ := genericapirequest.UserFrom(ctx)
		name, identified := ReaderMember(u)
		var memberLabels map[string]string
		if identified {
			memberLabels = members.MemberLabels(name)
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
			return imports.ExportScopeIncludes(s, name, memberLabels)
		}
	}
}
