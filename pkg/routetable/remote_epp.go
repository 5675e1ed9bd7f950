package routetable

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/mci-dev/mci/pkg/eppaddr"
)

// RemoteEndpointPickers is how the ext_proc port of another cluster's EPP
// (an import's cluster) may be reached. Such an EPP sees every request it
// routes, prompt and headers, and answers where the gateway sends it: it is
// reached over TLS verified with the pool's credentials Secret or its
// BackendTLSPolicy, unless the importing side's operator allows less for
// that import. The exporter cannot allow it: it is the party not trusted.
type RemoteEndpointPickers struct {
	// RequireVerified refuses a remote EPP whose ext_proc would be reached
	// in plaintext or over TLS not verified, unless Insecure names its
	// import. mci-sidecar sets it; false reaches remote EPPs as asked.
	RequireVerified bool
	// Insecure are the imports ("namespace/name", or "*" for all) whose
	// remote EPPs may be reached without verified TLS (ParseInsecureImport).
	Insecure []string
}

// ParseInsecureImport checks an entry of RemoteEndpointPickers.Insecure.
func ParseInsecureImport(v string) error {
	if v == "*" {
		return nil
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return fmt.Errorf("%q: want namespace/name of an InferencePoolImport, or *", v)
	}
	return nil
}

// allowsInsecure says whether the import key may reach its remote EPPs
// without verified TLS.
func (r RemoteEndpointPickers) allowsInsecure(key types.NamespacedName) bool {
	for _, v := range r.Insecure {
		if v == "*" || v == key.String() {
			return true
		}
	}
	return false
}

// verified says whether t is TLS verified (a credentials Secret or a
// BackendTLSPolicy).
func verified(t eppaddr.PortTransport) bool {
	k := t.Kind()
	return k == eppaddr.TransportKindSecret || k == eppaddr.TransportKindVerified
}

// checkRemoteExtProc decides whether the remote cluster c of import key may
// be routed to with its ext_proc transport; false reports why, and the
// cluster is skipped. With RequireVerified, a cluster reached without
// verified TLS because the operator allows it is marked Unverified.
func (b *builder) checkRemoteExtProc(key types.NamespacedName, c *Cluster) bool {
	if verified(c.EPPTransport) {
		return true
	}
	rp := b.in.RemoteEndpointPickers
	if !rp.RequireVerified {
		return true
	}
	if rp.allowsInsecure(key) {
		c.Unverified = true
		return true
	}
	b.errs = append(b.errs, &BuildError{Kind: InferencePoolImportKind, Namespace: key.Namespace, Name: key.Name, Reason: ReasonUnverifiedEndpointPicker, Cluster: c.Name,
		Message: fmt.Sprintf("cluster %q: its EPP's ext_proc would be reached over %s, and remote EPPs get requests only over verified TLS: give the exported pool a credentials Secret or a BackendTLSPolicy (docs/tls.md), or allow it here with --insecure-remote-endpoint-pickers=%s; the cluster is skipped",
			c.Name, c.EPPTransport.Kind(), key)})
	return false
}
