package sidecar

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
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

// TestUnsetOwnRangesAreSaid: the ranges no remote destination may be in
// are counted by what they are, and where this cluster's own Service or
// Pod ranges are not given, the sidecar says so once, naming the flags,
// whatever other ranges are given.
func TestUnsetOwnRangesAreSaid(t *testing.T) {
	nodes := []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")}
	services := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")}
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	for _, tt := range []struct {
		name   string
		policy eppanswer.Policy
		want   string
		// unset are the flags the log line names; none: no line.
		unset []string
	}{
		{name: "none given", unset: []string{"--service-cluster-ip-range", "--cluster-cidr"},
			want: `{ranges="services"} 0` + "\n" + `{ranges="pods"} 0` + "\n" + `{ranges="other"} 0`},
		{name: "only other ranges given", policy: eppanswer.Policy{Denied: nodes}, unset: []string{"--service-cluster-ip-range", "--cluster-cidr"},
			want: `{ranges="services"} 0` + "\n" + `{ranges="pods"} 0` + "\n" + `{ranges="other"} 1`},
		{name: "the Pod ranges missing", policy: eppanswer.Policy{ServiceRanges: services, Denied: nodes}, unset: []string{"--cluster-cidr"},
			want: `{ranges="services"} 2` + "\n" + `{ranges="pods"} 0` + "\n" + `{ranges="other"} 1`},
		{name: "the cluster's own ranges given", policy: eppanswer.Policy{ServiceRanges: services, PodRanges: pods},
			want: `{ranges="services"} 2` + "\n" + `{ranges="pods"} 1` + "\n" + `{ranges="other"} 0`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var logs logLines
			newRemoteAnswers(tt.policy, nil, nil, NewMetrics(reg), logs.logger())

			var want strings.Builder
			want.WriteString("# HELP mci_sidecar_remote_destination_denied_ranges Address ranges no remote EPP may name as a destination beyond loopback, link-local, multicast and unspecified ones, by what they are: services (--service-cluster-ip-range), pods (--cluster-cidr), other (--denied-destination-cidrs). 0 for services or pods: this cluster's Service or Pod addresses are not refused.\n")
			want.WriteString("# TYPE mci_sidecar_remote_destination_denied_ranges gauge\n")
			for _, l := range strings.Split(tt.want, "\n") {
				want.WriteString("mci_sidecar_remote_destination_denied_ranges" + l + "\n")
			}
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "mci_sidecar_remote_destination_denied_ranges"))

			var said []string
			logs.mu.Lock()
			for _, l := range logs.lines {
				if strings.Contains(l, "own ranges are not all set") {
					said = append(said, l)
				}
			}
			logs.mu.Unlock()
			if tt.unset == nil {
				assert.Empty(t, said)
				return
			}
			require.Len(t, said, 1, "said once")
			assert.Contains(t, said[0], `"unset"=["`+strings.Join(tt.unset, `" "`)+`"]`)
		})
	}
}
