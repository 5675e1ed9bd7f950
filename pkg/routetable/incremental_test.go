package routetable

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/routingpolicy"
)

// describeTable renders everything of a table that routing reads, so that
// two tables route alike iff their descriptions are equal. It also checks
// that every matcher points at a rule of the table itself.
func describeTable(t *testing.T, tbl *Table) string {
	t.Helper()
	var b strings.Builder
	ruleIndex := func(r *Rule) int {
		i := slices.Index(tbl.rules, r)
		require.GreaterOrEqual(t, i, 0, "a matcher of %s#%d points at a rule that is not in the table", r.Route, r.Index)
		return i
	}
	fmt.Fprintf(&b, "shimMode=%v local=%s\n", tbl.shimMode, tbl.local)
	for i, r := range tbl.rules {
		fmt.Fprintf(&b, "rule %d: %s#%d wrr=%s\n", i, r.Route, r.Index, r.wrr.key)
		for _, be := range r.Backends {
			describeBackend(t, &b, be)
		}
	}
	group := func(name string, ms []*matcher) {
		fmt.Fprintf(&b, "host %q:", name)
		for _, m := range ms {
			fmt.Fprintf(&b, " [rule %d match %d %d%q %q h%d q%d]", ruleIndex(m.rule), m.matchIndex, m.pathKind, m.pathValue, m.method, len(m.headers), len(m.query))
		}
		b.WriteString("\n")
	}
	hosts := make([]string, 0, len(tbl.index.exact))
	for h := range tbl.index.exact {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		group(h, tbl.index.exact[h])
	}
	for _, g := range tbl.index.wildcards {
		group("*"+g.suffix, g.matchers)
	}
	group("", tbl.index.any)
	for _, be := range tbl.shimList {
		b.WriteString("shim ")
		describeBackend(t, &b, be)
		require.Same(t, be, tbl.Shim(types.NamespacedName{Namespace: be.Namespace, Name: be.Name}))
	}
	errs := make([]string, len(tbl.Errors))
	for i, e := range tbl.Errors {
		errs[i] = e.Error()
	}
	sort.Strings(errs)
	for _, e := range errs {
		fmt.Fprintf(&b, "error %s\n", e)
	}
	return b.String()
}

func describeBackend(t *testing.T, b *strings.Builder, be *Backend) {
	fmt.Fprintf(b, "  %s w=%d invalid=%q fm=%s policy=%s shim=%v\n", be, be.Weight, be.Invalid, be.FailureMode, be.Policy.Name, be.Shim)
	for _, c := range be.Clusters {
		fmt.Fprintf(b, "    cluster %+v\n", *c)
	}
	if be.Local != nil {
		fmt.Fprintf(b, "    local %+v\n", *be.Local)
		if be.Shim {
			require.Same(t, be.Clusters[0], be.Local, "a shim's local EPP is its first cluster")
		}
	}
	if be.wrr != nil {
		fmt.Fprintf(b, "    wrr %s\n", be.wrr.key)
	}
	if be.models != nil {
		m, o, _ := be.models.Counts()
		fmt.Fprintf(b, "    models %d objectives %d chat=%d code=%d", m, o, be.Criticality("chat", ""), be.Criticality("code", ""))
		for _, obj := range []string{"o0", "o1", "o2"} {
			fmt.Fprintf(b, " chat/%s=%d", obj, be.Criticality("chat", obj))
		}
		fmt.Fprintln(b)
	}
}

// objects is the reference state: what Build is given.
type objects struct {
	routes   map[types.NamespacedName]*gatewayv1.HTTPRoute
	imports  map[types.NamespacedName]*v1alpha1.InferencePoolImport
	pools    map[types.NamespacedName]*poolv1.InferencePool
	services map[types.NamespacedName]*corev1.Service
	models   map[types.NamespacedName]*v1alpha2.InferenceModel
	gateways map[types.NamespacedName]*gatewayv1.Gateway
	nss      map[types.NamespacedName]*corev1.Namespace
	grants   map[types.NamespacedName]*gatewayv1beta1.ReferenceGrant
	// objectives of both groups.
	objectives map[ObjectiveKey]*v1alpha2.InferenceObjective
}

func newObjects() *objects {
	return &objects{
		routes: map[types.NamespacedName]*gatewayv1.HTTPRoute{}, imports: map[types.NamespacedName]*v1alpha1.InferencePoolImport{},
		pools: map[types.NamespacedName]*poolv1.InferencePool{}, services: map[types.NamespacedName]*corev1.Service{},
		models: map[types.NamespacedName]*v1alpha2.InferenceModel{}, gateways: map[types.NamespacedName]*gatewayv1.Gateway{},
		nss: map[types.NamespacedName]*corev1.Namespace{}, grants: map[types.NamespacedName]*gatewayv1beta1.ReferenceGrant{},
		objectives: map[ObjectiveKey]*v1alpha2.InferenceObjective{},
	}
}

func values[K comparable, T any](m map[K]T) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (o *objects) inputs(settings Inputs) Inputs {
	in := settings
	in.Routes, in.Imports, in.Pools, in.Services, in.Models = values(o.routes), values(o.imports), values(o.pools), values(o.services), values(o.models)
	in.Gateways, in.Namespaces, in.ReferenceGrants = values(o.gateways), values(o.nss), values(o.grants)
	in.Objectives = values(o.objectives)
	return in
}

func TestIncrementalEqualsBuildOverRandomChanges(t *testing.T) {
	settings := []struct {
		name string
		in   Inputs
	}{
		{name: "every route", in: Inputs{LocalCluster: "cluster-b"}},
		{name: "one gateway's routes", in: Inputs{LocalCluster: "cluster-b", DefaultPolicy: routingpolicy.Named()[routingpolicy.Weighted],
			ServedGateways: []types.NamespacedName{{Namespace: "example", Name: "gw"}}}},
		{name: "two gateways' routes", in: Inputs{LocalCluster: "cluster-b",
			ServedGateways: []types.NamespacedName{{Namespace: "example", Name: "gw"}, {Namespace: "other", Name: "gw"}}}},
		{name: "EPP shim", in: Inputs{LocalCluster: "cluster-b",
			EndpointPickerServices: []types.NamespacedName{{Namespace: "example", Name: "mci-sidecar"}, {Namespace: "other", Name: "mci-sidecar"}}}},
	}
	const seeds, steps = 20, 100
	for _, s := range settings {
		t.Run(s.name, func(t *testing.T) {
			publications := 0
			// How often the tables met each Gateway API rule, so that the
			// generator is known to exercise them.
			seen := map[string]int{}
			for seed := range uint64(seeds) {
				u := universe{r: rand.New(rand.NewPCG(seed, 42))}
				o := newObjects()
				x := NewIncremental(s.in)
				var history []string
				prev := ""
				for step := range steps {
					// Changes come alone or in bursts, as informer events
					// coalesce.
					for range 1 + u.r.IntN(3) {
						history = append(history, u.change(o, x))
					}
					got, changed := x.Table()
					want, _ := Build(o.inputs(s.in))
					gotDesc, wantDesc := describeTable(t, got), describeTable(t, want)
					countGatewayRules(want, o.routes, seen)
					require.Equal(t, wantDesc, gotDesc, "seed %d step %d after: %s", seed, step, strings.Join(history[max(0, len(history)-6):], "; "))
					if !changed {
						require.Equal(t, prev, gotDesc, "seed %d step %d: an unchanged table must route as the previous one", seed, step)
					} else {
						publications++
					}
					prev = gotDesc
				}
			}
			t.Logf("%d seeds x %d steps: %d new tables; Gateway API rules met: %v", seeds, steps, publications, seen)
			require.Positive(t, seen["granted cross-namespace backendRef"])
			require.Positive(t, seen[ReasonRefNotPermitted])
			if len(s.in.ServedGateways) > 0 {
				for _, what := range []string{"route attached from another namespace", "route narrowed to listener hostnames",
					ReasonNotAllowedByListeners, ReasonNoMatchingListenerHostname, ReasonNoMatchingParent} {
					require.Positive(t, seen[what], what)
				}
			}
		})
	}
}

// countGatewayRules counts what a table shows of the Gateway API rules.
func countGatewayRules(tbl *Table, routes map[types.NamespacedName]*gatewayv1.HTTPRoute, seen map[string]int) {
	for _, err := range tbl.Errors {
		if be, ok := err.(*BuildError); ok {
			seen[be.Reason]++
		}
	}
	for _, rl := range tbl.rules {
		if rl.Route.Namespace != "example" {
			seen["route attached from another namespace"]++
		}
		for _, be := range rl.Backends {
			if be.Namespace != rl.Route.Namespace && be.Invalid == "" {
				seen["granted cross-namespace backendRef"]++
			}
		}
	}
	named := func(ms []*matcher) {
		for _, m := range ms {
			if len(routes[m.rule.Route].Spec.Hostnames) == 0 {
				seen["route narrowed to listener hostnames"]++
			}
		}
	}
	for _, ms := range tbl.index.exact {
		named(ms)
	}
	for _, g := range tbl.index.wildcards {
		named(g.matchers)
	}
}

// NewIncremental of objects is the table Build makes of them: the
// sidecar's tests build their tables so.
func TestNewIncrementalHoldsItsInputsObjects(t *testing.T) {
	withRules := 0
	for seed := range uint64(20) {
		u := universe{r: rand.New(rand.NewPCG(seed, 7))}
		o := newObjects()
		x := NewIncremental(Inputs{})
		for range 30 {
			u.change(o, x)
		}
		in := o.inputs(Inputs{})
		got, _ := NewIncremental(in).Table()
		want, _ := Build(in)
		require.Equal(t, describeTable(t, want), describeTable(t, got), "seed %d", seed)
		if len(want.Rules()) > 0 {
			withRules++
		}
	}
	assert.Greater(t, withRules, 10, "the objects make tables with rules")
}

// A Gateway's status, labels of namespaces no route of the Gateway lives
// in, and ReferenceGrants of namespaces no backendRef crosses into change
// nothing; a change that matters recompiles only the routes it affects.
func TestIncrementalRecompilesOnlyTheRoutesAGatewayAPIChangeAffects(t *testing.T) {
	x := NewIncremental(Inputs{LocalCluster: "cluster-b", ServedGateways: []types.NamespacedName{{Namespace: ns, Name: "inf-gw"}}})
	g := gateway("inf-gw", listener("http", 80, "", fromNamespaces(gatewayv1.NamespacesFromAll, nil)))
	x.SetGateway(g)
	local := route("local", 0, []string{"local.example.com"}, rule(nil, importRef("llm", nil)))
	local.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}
	x.SetRoute(local)
	team := route("team", 0, []string{"team.example.com"}, rule(nil, gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Group: ptr.To(gatewayv1.Group(InferencePoolImportGroup)), Kind: ptr.To(gatewayv1.Kind(InferencePoolImportKind)), Name: "llm", Namespace: ptr.To(gatewayv1.Namespace(ns)),
	}}}))
	team.Namespace = "team-a"
	team.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw", Namespace: ptr.To(gatewayv1.Namespace(ns))}}
	x.SetRoute(team)
	x.SetImport(importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}))
	x.SetNamespace(labelled("team-a"))
	first, changed := x.Table()
	require.True(t, changed)
	require.Len(t, first.Rules(), 2)
	require.NotEmpty(t, first.Rules()[1].Backends[0].Invalid, "no ReferenceGrant yet")

	status := g.DeepCopy()
	status.Status.Conditions = []metav1.Condition{{Type: "Programmed", Status: metav1.ConditionTrue}}
	x.SetGateway(status)
	x.SetGateway(gateway("other-gw"))
	x.SetNamespace(labelled("team-b", "team", "b"))
	x.SetNamespace(labelled("team-a"))
	x.SetReferenceGrant(&gatewayv1beta1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "g"}})
	same, changed := x.Table()
	require.False(t, changed, "a Gateway's status, another Gateway, unrelated namespaces and ReferenceGrants make no new table")
	require.Same(t, first, same)

	x.SetReferenceGrant(&gatewayv1beta1.ReferenceGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"},
		Spec: gatewayv1beta1.ReferenceGrantSpec{
			From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "team-a"}},
			To:   []gatewayv1beta1.ReferenceGrantTo{{Group: InferencePoolImportGroup, Kind: InferencePoolImportKind}},
		},
	})
	next, changed := x.Table()
	require.True(t, changed)
	require.Same(t, first.Rules()[0], next.Rules()[0], "the route of the Gateway's namespace is not recompiled")
	require.NotSame(t, first.Rules()[1], next.Rules()[1], "the route whose backendRef the grant allows is")
	require.Empty(t, next.Rules()[1].Backends[0].Invalid)

	g = g.DeepCopy()
	g.Spec.Listeners[0].AllowedRoutes = fromNamespaces(gatewayv1.NamespacesFromSame, nil)
	x.SetGateway(g)
	last, changed := x.Table()
	require.True(t, changed)
	require.Len(t, last.Rules(), 1, "from: Same drops the route of another namespace")
	require.Equal(t, "local", last.Rules()[0].Route.Name)
	require.Equal(t, []string{ReasonNotAllowedByListeners}, reasons(last.Errors))
}
