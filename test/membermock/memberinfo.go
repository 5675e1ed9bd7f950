package membermock

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/server/mux"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/registry/virtual"
)

// installMemberInfo answers what a reader asks a member besides its
// summaries, as the member's kube-apiserver would: the uid of its
// kube-system Namespace (its cluster ID), and the discovery of the group
// versions of the objects it holds (InferencePools, Gateways,
// BackendTLSPolicies), which a reader asks about with the summaries'.
func installMemberInfo(m *mux.PathRecorderMux, memberOf func(context.Context) (*served, error)) {
	m.Handle("/api/v1/namespaces/kube-system", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		member, err := memberOf(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		ns := &corev1.Namespace{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: member.clusterID},
			Status:     corev1.NamespaceStatus{Phase: corev1.NamespaceActive},
		}
		writeJSON(w, ns)
	}))
	for gv, resources := range map[string][]metav1.APIResource{
		poolv1.SchemeGroupVersion.String(): {
			{Name: "inferencepools", SingularName: "inferencepool", Namespaced: true, Kind: "InferencePool", Verbs: readVerbs},
		},
		gatewayv1.SchemeGroupVersion.String(): {
			{Name: "gateways", SingularName: "gateway", Namespaced: true, Kind: "Gateway", Verbs: readVerbs},
			{Name: "backendtlspolicies", SingularName: "backendtlspolicy", Namespaced: true, Kind: "BackendTLSPolicy", Verbs: readVerbs},
		},
	} {
		list := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv, APIResources: resources}
		m.Handle("/apis/"+gv, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, list) }))
	}
}

var readVerbs = metav1.Verbs{"get", "list", "watch"}

func writeJSON(w http.ResponseWriter, obj any) {
	data, err := json.Marshal(obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// summaryReaderAuthorizer allows what a member grants the identity it
// hands its summary readers (artifacts/deploy/mci-apiserver): get, list
// and watch of its summaries and get of its kube-system Namespace, with
// discovery and health, which every authenticated user may read.
// Anything else is forbidden, as RBAC forbids it.
var summaryReaderAuthorizer = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if !a.IsResourceRequest() {
		if a.GetVerb() == "get" {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	}
	read := a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch"
	switch {
	case a.GetAPIGroup() == inference.GroupName && read && a.GetSubresource() == "" &&
		(a.GetResource() == "inferencepoolexportsummaries" || a.GetResource() == "inferenceclustersummaries"):
		return authorizer.DecisionAllow, "", nil
	case a.GetAPIGroup() == "" && a.GetResource() == "namespaces" && a.GetName() == "kube-system" && a.GetVerb() == "get":
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, fmt.Sprintf("a summary reader may not %s %s", a.GetVerb(), a.GetResource()), nil
})

// memberREST serves one summary resource of every member: each request
// from the storage of the member it came to. What does not depend on the
// member (names, kinds, tables, refused writes) is the embedded REST's.
type memberREST struct {
	*virtual.REST
	fleet *Fleet
	of    func(*Member) *virtual.REST
}

func (r *memberREST) storage(ctx context.Context) (*virtual.REST, error) {
	m, err := r.fleet.memberOf(ctx)
	if err != nil {
		return nil, err
	}
	return r.of(m.Member), nil
}

// Get implements rest.Getter.
func (r *memberREST) Get(ctx context.Context, name string, opts *metav1.GetOptions) (runtime.Object, error) {
	s, err := r.storage(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, name, opts)
}

// List implements rest.Lister.
func (r *memberREST) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	s, err := r.storage(ctx)
	if err != nil {
		return nil, err
	}
	return s.List(ctx, opts)
}

// Watch implements rest.Watcher.
func (r *memberREST) Watch(ctx context.Context, opts *metainternalversion.ListOptions) (watch.Interface, error) {
	s, err := r.storage(ctx)
	if err != nil {
		return nil, err
	}
	return s.Watch(ctx, opts)
}
