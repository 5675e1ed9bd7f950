package sidecar

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// TestRemoteEPPsReachedWithoutVerifiedTLSAreShown: each cluster of an
// import whose EPP would be reached without verified TLS is in
// mci_sidecar_remote_epp_unverified, allowed (the operator named the
// import) or refused (skipped).
func TestRemoteEPPsReachedWithoutVerifiedTLSAreShown(t *testing.T) {
	routes := []*gatewayv1.HTTPRoute{sidecartest.Route("r", 0, nil,
		sidecartest.Rule(nil, sidecartest.ImportRef("llm", nil)),
		sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix("/other")}, sidecartest.ImportRef("other", nil)))}
	imports := []*v1alpha1.InferencePoolImport{
		sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"}),
		sidecartest.Import("other", sidecartest.Imported{Name: "cluster-c", Addr: "127.0.3.1"}),
	}
	inc := routetable.NewIncremental(routetable.Inputs{
		RemoteEndpointPickers: routetable.RemoteEndpointPickers{RequireVerified: true, Insecure: []string{sidecartest.Namespace + "/llm"}}})
	for _, r := range routes {
		inc.SetRoute(r)
	}
	for _, imp := range imports {
		inc.SetImport(imp)
	}
	tbl, _ := inc.Table()
	reg := prometheus.NewRegistry()
	NewMetrics(reg).published(tbl, time.Millisecond)
	want := `# HELP mci_sidecar_remote_epp_unverified 1 for each cluster of an import (pool, namespace/name) whose EPP's ext_proc would be reached without verified TLS (plaintext or TLS not verified), by outcome: allowed (--insecure-remote-endpoint-pickers names the import: routed to) or refused (skipped, see the routing table's problems).
# TYPE mci_sidecar_remote_epp_unverified gauge
mci_sidecar_remote_epp_unverified{cluster="cluster-a",outcome="allowed",pool="` + sidecartest.Namespace + `/llm"} 1
mci_sidecar_remote_epp_unverified{cluster="cluster-c",outcome="refused",pool="` + sidecartest.Namespace + `/other"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "mci_sidecar_remote_epp_unverified"))
}
