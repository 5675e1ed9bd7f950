package app

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/mci-dev/mci/pkg/sidecar"
)

func TestOptionalResourcesFollowWhatTheClusterServes(t *testing.T) {
	llmd := &metav1.APIResourceList{GroupVersion: "llm-d.ai/v1alpha2", APIResources: []metav1.APIResource{{Name: "inferenceobjectives"}}}
	policies := &metav1.APIResourceList{GroupVersion: "gateway.networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "httproutes"}, {Name: "backendtlspolicies"}}}
	routesOnly := &metav1.APIResourceList{GroupVersion: "gateway.networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "httproutes"}}}
	on := sidecar.WatchConfig{InferenceModels: true, BackendTLSPolicies: true}
	tests := []struct {
		name   string
		served []*metav1.APIResourceList
		flags  sidecar.WatchConfig
		want   sidecar.WatchConfig
	}{
		{name: "a cluster that serves them has them read", served: []*metav1.APIResourceList{llmd, policies}, flags: on, want: on},
		{name: "a cluster without their CRDs has them off", served: []*metav1.APIResourceList{routesOnly}, flags: on},
		{name: "one group of InferenceObjectives is enough", served: []*metav1.APIResourceList{llmd, routesOnly}, flags: on, want: sidecar.WatchConfig{InferenceModels: true}},
		{name: "a flag set false stays off where the cluster serves them", served: []*metav1.APIResourceList{llmd, policies}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tc.served}}
			assert.Equal(t, tc.want, followServedAPIs(t.Context(), d, tc.flags))
		})
	}
}
