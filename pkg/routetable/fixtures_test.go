package routetable

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/eppanswer"
	"github.com/mci-dev/mci/pkg/publishedaddrs"
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
	regex          = sidecartest.Regex
	withHeaders    = sidecartest.WithHeaders
	withMethod     = sidecartest.WithMethod
	withQuery      = sidecartest.WithQuery
	poolRef        = sidecartest.PoolRef
	importRef      = sidecartest.ImportRef
	backendRef     = sidecartest.BackendRef
	pool           = sidecartest.Pool
	eppService     = sidecartest.EPPService
	gateway        = sidecartest.Gateway
	listener       = sidecartest.Listener
	fromNamespaces = sidecartest.FromNamespaces
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

// publishedLoopback is what sidecartest's imported clusters publish of
// their pools (sidecartest.DefaultEndpointAddresses on port 8000), as the
// table holds it.
var publishedLoopback = func() eppanswer.Published {
	addrs, err := publishedaddrs.Parse(sidecartest.DefaultEndpointAddresses)
	if err != nil {
		panic(err)
	}
	return eppanswer.Published{Port: 8000, Addresses: addrs}
}()
