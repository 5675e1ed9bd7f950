package servedapis

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
)

func TestDiscoverAsksEachGroupVersionOnce(t *testing.T) {
	gateways := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	policies := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "backendtlspolicies"}
	grants := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}
	models := schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencemodels"}
	discoveryUnavailable := schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	leases := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	services := schema.GroupVersionResource{Version: "v1", Resource: "services"}

	asked := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked[r.URL.Path]++
		var list metav1.APIResourceList
		switch r.URL.Path {
		case "/apis/gateway.networking.k8s.io/v1":
			list.APIResources = []metav1.APIResource{{Name: "gateways"}, {Name: "httproutes"}}
		case "/apis/discovery.k8s.io/v1":
			http.Error(w, "etcd is not ready", http.StatusServiceUnavailable)
			return
		case "/apis/coordination.k8s.io/v1":
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		case "/api/v1":
			list.APIResources = []metav1.APIResource{{Name: "services"}}
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	}))
	defer srv.Close()
	d, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	require.NoError(t, err)

	served := Discover(t.Context(), d, 0, gateways, policies, grants, models, discoveryUnavailable, leases, services)

	tests := []struct {
		name     string
		resource schema.GroupVersionResource
		want     bool
		// unanswered: taken as served because the cluster could not say.
		unanswered bool
	}{
		{name: "a resource the group version lists is served", resource: gateways, want: true},
		{name: "a resource the group version does not list is not", resource: policies},
		{name: "a group version the cluster does not know serves nothing", resource: grants},
		{name: "a group of no installed CRD serves nothing", resource: models},
		{name: "a group version that cannot be asked is taken to serve its resources", resource: discoveryUnavailable, want: true},
		{name: "a group version whose answer is an error is taken to serve its resources, unanswered", resource: leases, want: true, unanswered: true},
		{name: "the core group is asked at /api", resource: services, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, served.Has(tc.resource))
			assert.Equal(t, !tc.unanswered, served.Answered(tc.resource), "answered")
		})
	}
	assert.False(t, served.Answered(schema.GroupVersionResource{Version: "v1", Resource: "pods"}), "a resource not asked about is not answered")
	assert.Equal(t, 1, asked["/apis/gateway.networking.k8s.io/v1"], "one request per group version")
	assert.Equal(t, 1, asked["/apis/discovery.k8s.io/v1"], "no retries")
	assert.True(t, served.Any(grants, gateways))
	assert.False(t, served.Any(grants, models))
	assert.Equal(t, map[schema.GroupVersionResource]bool{gateways: true, policies: false, grants: false, models: false, discoveryUnavailable: true, leases: true, services: true}, served.Map())
}

func TestDiscoverAsksAFakeDiscoveryThroughItsResources(t *testing.T) {
	objectives := schema.GroupVersionResource{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferenceobjectives"}
	rewrites := schema.GroupVersionResource{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferencemodelrewrites"}
	models := schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencemodels"}
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: []*metav1.APIResourceList{
		{GroupVersion: "llm-d.ai/v1alpha2", APIResources: []metav1.APIResource{{Name: "inferenceobjectives"}}},
	}}}

	served := Discover(t.Context(), d, 0, objectives, rewrites, models)

	assert.Equal(t, map[schema.GroupVersionResource]bool{objectives: true, rewrites: false, models: false}, served.Map())
}

// A cluster that could not be asked is taken to serve what it was to be
// asked about, as Discover takes a group version it cannot ask: served,
// neither known nor answered.
func TestUnaskedTakesEveryResourceAsServedWithoutAnAnswer(t *testing.T) {
	r := schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha1", Resource: "inferencepoolexportsummaries"}
	s := Unasked(r)
	assert.True(t, s.Has(r))
	assert.False(t, s.Known(r))
	assert.False(t, s.Answered(r))
	assert.False(t, s.Has(schema.GroupVersionResource{Resource: "other"}))
}
