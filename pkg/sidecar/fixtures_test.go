package sidecar

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// The tests' objects come from sidecartest, which the tests of the routing
// table and of the server share; these short names keep the tests as they
// were written.
const ns = sidecartest.Namespace

var (
	epoch          = sidecartest.Epoch
	route          = sidecartest.Route
	rule           = sidecartest.Rule
	prefix         = sidecartest.Prefix
	exact          = sidecartest.Exact
	withHeaders    = sidecartest.WithHeaders
	poolRef        = sidecartest.PoolRef
	importRef      = sidecartest.ImportRef
	backendRef     = sidecartest.BackendRef
	pool           = sidecartest.Pool
	eppService     = sidecartest.EPPService
	gateway        = sidecartest.Gateway
	listener       = sidecartest.Listener
	fromNamespaces = sidecartest.FromNamespaces
	gatewayClients = sidecartest.GatewayClients
)

func annotate[T interface{ SetAnnotations(map[string]string) }](obj T, kv ...string) T {
	return sidecartest.Annotate(obj, kv...)
}

type v1alphaImport = v1alpha1.InferencePoolImport

// imported is one cluster entry of an import (sidecartest.Imported).
type imported struct {
	name, addr string
	port       int32
	ready      metav1.ConditionStatus
	parent     string // ParentMode when set: "ip"
}

// importOf builds an InferencePoolImport with EndpointMode (or ParentMode)
// clusters whose EPP health and metrics ports are 9003 and 9090.
func importOf(name string, clusters ...imported) *v1alphaImport {
	var cs []sidecartest.Imported
	for _, c := range clusters {
		cs = append(cs, sidecartest.Imported{Name: c.name, Addr: c.addr, Port: c.port, Ready: c.ready, Parent: c.parent})
	}
	return sidecartest.Import(name, cs...)
}

// buildTable is the routing table of in's objects and settings, built as
// the sidecar builds it (routetable.Incremental), with its problems.
func buildTable(in routetable.Inputs) (*routetable.Table, []error) {
	x := routetable.NewIncremental(in)
	for _, s := range in.Services {
		x.SetService(s)
	}
	for _, p := range in.BackendTLSPolicies {
		x.SetBackendTLSPolicy(p)
	}
	for _, p := range in.Pools {
		x.SetPool(p)
	}
	for _, imp := range in.Imports {
		x.SetImport(imp)
	}
	for _, m := range in.Models {
		x.SetModel(m)
	}
	for _, o := range in.Objectives {
		x.SetObjective(o)
	}
	for _, g := range in.Gateways {
		x.SetGateway(g)
	}
	for _, n := range in.Namespaces {
		x.SetNamespace(n)
	}
	for _, g := range in.ReferenceGrants {
		x.SetReferenceGrant(g)
	}
	for _, r := range in.Routes {
		x.SetRoute(r)
	}
	t, _ := x.Table()
	return t, t.Errors
}
