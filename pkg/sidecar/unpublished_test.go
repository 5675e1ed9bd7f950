package sidecar

import (
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
	"github.com/mci-dev/mci/test/envoyclient"
)

// A remote EPP (a real gRPC server) that names, on its pool's published
// port, an address its exporter did not publish of the pool (any other
// routable address: another tenant's service, a node) is refused as
// unpublished_destination, counted, and the request goes to the next
// cluster; the address never reaches the gateway.
func TestRemoteEPPNamingAnUnpublishedAddressIsRefused(t *testing.T) {
	for _, tt := range []struct {
		name, dest string
		published  []string
		refused    bool
	}{
		{name: "a published pod", dest: "10.1.0.2:8000", published: []string{"10.1.0.1", "10.1.0.2"}},
		{name: "a pod within a published /24", dest: "10.1.7.200:8000", published: []string{"10.1.7.0/24"}},
		{name: "another address on the published port", dest: "10.1.0.9:8000", published: []string{"10.1.0.1", "10.1.0.2"}, refused: true},
		{name: "an address next to a published /24", dest: "10.1.8.1:8000", published: []string{"10.1.7.0/24"}, refused: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hostile := &hostileEPP{answer: routed(tt.dest, nil, nil, nil)}
			ah, ap := startHostileEPP(t, hostile)
			c := startFakeEPP(t, "epp-c", "10.3.0.1:8000")
			imp := sidecartest.Import("llm",
				sidecartest.Imported{Name: "cluster-a", Addr: ah, Port: ap, EndpointAddresses: tt.published},
				sidecartest.Imported{Name: "cluster-c", Addr: hostOf(t, c), Port: portOf(t, c), EndpointAddresses: []string{"10.3.0.1"}})
			h := startServerWith(t, routetable.Inputs{
				Routes:  []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil, sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)))},
				Imports: []*v1alpha1.InferencePoolImport{imp},
			}, &fakeState{health: map[string]Health{"cluster-a": HealthServing}}, ServerConfig{
				RemoteDestinations: eppanswer.Policy{Denied: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
			})

			res := h.do(t, envoyclient.Request{Path: "/v1/completions", Body: chatBody})

			require.Nil(t, res.Immediate)
			if !tt.refused {
				assert.Equal(t, tt.dest, res.Destination)
				assert.EqualValues(t, 0, c.calls.Load())
				return
			}
			assert.Equal(t, "10.3.0.1:8000", res.Destination, "the request goes to the next cluster")
			assert.EqualValues(t, 1, c.calls.Load())
			assert.Equal(t, 1.0, testutil.ToFloat64(h.metrics.answersRefused.WithLabelValues("cluster-a", eppanswer.ReasonUnpublishedDestination)))
		})
	}
}
