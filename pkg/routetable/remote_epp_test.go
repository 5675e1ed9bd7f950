package routetable

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// TestRemoteEPPsAreReachedOverVerifiedTLSUnlessTheImportingSideAllowsLess:
// another cluster's EPP sees each request it routes and names where it
// goes, so its ext_proc is reached over TLS verified with the pool's
// credentials Secret or BackendTLSPolicy; plaintext or TLS not verified is
// refused (reported, the cluster skipped) unless the importing side's
// operator names the import. What the exporter says cannot allow it.
func TestRemoteEPPsAreReachedOverVerifiedTLSUnlessTheImportingSideAllowsLess(t *testing.T) {
	routes := []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("llm", nil)))}
	plaintext := func(*v1alpha1.EndpointPickerImport) {}
	unverifiedTLS := func(e *v1alpha1.EndpointPickerImport) {
		e.Transport = &v1alpha1.EndpointTransport{Mode: v1alpha1.TransportTLS}
	}
	withSecret := func(e *v1alpha1.EndpointPickerImport) { e.SecretRef = &corev1.SecretReference{Name: "epp-creds"} }
	withPolicy := func(e *v1alpha1.EndpointPickerImport) {
		e.Transport = &v1alpha1.EndpointTransport{Validation: &v1alpha1.BackendTLSValidation{PolicyName: "epp", Hostname: "epp.example.com"}}
	}
	tests := []struct {
		name           string
		epp            func(*v1alpha1.EndpointPickerImport)
		insecure       []string
		wantRouted     bool
		wantUnverified bool
	}{
		{name: "plaintext is refused", epp: plaintext},
		{name: "TLS not verified is refused", epp: unverifiedTLS},
		{name: "TLS verified with the credentials Secret is routed to", epp: withSecret, wantRouted: true},
		{name: "TLS verified as a BackendTLSPolicy says is routed to", epp: withPolicy, wantRouted: true},
		{name: "plaintext allowed for this import is routed to, and marked", epp: plaintext, insecure: []string{ns + "/llm"}, wantRouted: true, wantUnverified: true},
		{name: "TLS not verified allowed for every import is routed to, and marked", epp: unverifiedTLS, insecure: []string{"*"}, wantRouted: true, wantUnverified: true},
		{name: "plaintext allowed for another import is refused", epp: plaintext, insecure: []string{ns + "/other"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})
			tc.epp(&imp.Status.Clusters[0].EndpointPicker)
			tbl, errs := Build(Inputs{Routes: routes, Imports: []*v1alphaImport{imp},
				RemoteEndpointPickers: RemoteEndpointPickers{RequireVerified: true, Insecure: tc.insecure}})
			b := only(t, tbl)
			if !tc.wantRouted {
				assert.Empty(t, b.Clusters, "never routed to without verified TLS")
				require.Contains(t, reasons(errs), ReasonUnverifiedEndpointPicker)
				var be *BuildError
				require.True(t, errors.As(errs[0], &be))
				assert.Equal(t, "cluster-a", be.Cluster)
				assert.Contains(t, be.Message, "--insecure-remote-endpoint-pickers="+ns+"/llm")
				return
			}
			require.Empty(t, errs)
			require.Len(t, b.Clusters, 1)
			assert.Equal(t, tc.wantUnverified, b.Clusters[0].Unverified)
		})
	}

	t.Run("a local pool's EPP is not held to it", func(t *testing.T) {
		tbl, errs := Build(Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, poolRef("llm", nil)))},
			Pools: []*poolv1.InferencePool{pool("llm", "")}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")},
			RemoteEndpointPickers: RemoteEndpointPickers{RequireVerified: true}})
		require.Empty(t, errs)
		require.Len(t, only(t, tbl).Clusters, 1)
	})
}

func TestParseInsecureImport(t *testing.T) {
	for _, v := range []string{"*", "example/llm"} {
		assert.NoError(t, ParseInsecureImport(v), v)
	}
	for _, v := range []string{"", "llm", "example/", "/llm", "Example/llm", "a/b/c", "**"} {
		assert.Error(t, ParseInsecureImport(v), v)
	}
}
