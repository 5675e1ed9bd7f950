package routetable

import (
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	llmdv1alpha2 "github.com/mci-dev/mci/pkg/apis/llmd/v1alpha2"
	"github.com/mci-dev/mci/pkg/eppaddr"
	"github.com/mci-dev/mci/pkg/requestmodel"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

func reasons(errs []error) []string {
	var out []string
	for _, e := range errs {
		var be *BuildError
		if errors.As(e, &be) {
			out = append(out, be.Reason)
		} else {
			out = append(out, "not a BuildError: "+e.Error())
		}
	}
	return out
}

// only returns the single backend of the single rule of the table.
func only(t *testing.T, tbl *Table) *Backend {
	t.Helper()
	require.Len(t, tbl.Rules(), 1)
	require.Len(t, tbl.Rules()[0].Backends, 1)
	return tbl.Rules()[0].Backends[0]
}

func TestBuild(t *testing.T) {
	oneRef := func(ref gatewayv1.HTTPBackendRef) []*gatewayv1.HTTPRoute {
		return []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, ref))}
	}
	twoClusters := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1", port: 19002})

	tests := []struct {
		name        string
		in          Inputs
		wantReasons []string
		check       func(t *testing.T, tbl *Table)
	}{
		{
			name: "an import's clusters carry their EPP, health and metrics addresses",
			in:   Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{twoClusters}},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				assert.Empty(t, b.Invalid)
				assert.Equal(t, BackendInferencePoolImport, b.Kind)
				require.Len(t, b.Clusters, 2)
				assert.Equal(t, Cluster{Name: "cluster-a", Pool: "example/llm", Mode: v1alpha1.RoutingModeEndpoint, EPP: "127.0.2.1:9002",
					Health: "127.0.2.1:9003", Metrics: "http://127.0.2.1:9090/metrics", Weight: 1, Published: publishedLoopback}, *b.Clusters[0])
				assert.Equal(t, "127.0.3.1:19002", b.Clusters[1].EPP)
				assert.Equal(t, poolv1.FailClose, b.FailureMode, "FailClose is the API's default")
				assert.Equal(t, routingpolicy.HealthBased, b.Policy.Name, "HealthBased is the default policy")
				assert.Nil(t, b.Local)
			},
		},
		{
			name: "a local pool is a cluster of its own, reached through its EPP Service",
			in: Inputs{
				Routes: oneRef(poolRef("llm", nil)), LocalCluster: "cluster-b",
				Pools: []*poolv1.InferencePool{pool("llm", poolv1.FailOpen)}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")},
			},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				require.Len(t, b.Clusters, 1)
				assert.Equal(t, Cluster{Name: "cluster-b", Pool: "example/llm", Mode: v1alpha1.RoutingModeEndpoint, EPP: "127.0.1.1:9002",
					Health: "127.0.1.1:9003", Metrics: "http://127.0.1.1:9090/metrics", Weight: 1, Local: true}, *b.Clusters[0])
				assert.Equal(t, poolv1.FailOpen, b.FailureMode, "the pool's failure mode")
			},
		},
		{
			name: "a local EPP Service without a LoadBalancer address is reached on its cluster IP",
			in: Inputs{
				Routes: oneRef(poolRef("llm", nil)),
				Pools:  []*poolv1.InferencePool{pool("llm", "")},
				Services: []*corev1.Service{func() *corev1.Service {
					s := eppService("llm", "")
					s.Status = corev1.ServiceStatus{}
					return s
				}()},
			},
			check: func(t *testing.T, tbl *Table) {
				assert.Equal(t, "10.96.0.10:9002", only(t, tbl).Clusters[0].EPP)
				assert.Equal(t, DefaultLocalCluster, only(t, tbl).Clusters[0].Name)
			},
		},
		{
			name: "a local EPP Service that is an ExternalName is reached at that name, and marked as such",
			in: Inputs{
				Routes: oneRef(poolRef("llm", nil)),
				Pools:  []*poolv1.InferencePool{pool("llm", "")},
				Services: []*corev1.Service{func() *corev1.Service {
					s := eppService("llm", "")
					s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "metrics.example.net", Ports: s.Spec.Ports}
					s.Status = corev1.ServiceStatus{}
					return s
				}()},
			},
			check: func(t *testing.T, tbl *Table) {
				c := only(t, tbl).Clusters[0]
				assert.Equal(t, "metrics.example.net:9002", c.EPP)
				assert.True(t, c.Local)
				assert.True(t, c.ExternalName, "the sidecar's own token does not go there unless an operator names it")
			},
		},
		{
			name:        "a backendRef to a missing import is invalid and reported",
			in:          Inputs{Routes: oneRef(importRef("missing", nil))},
			wantReasons: []string{ReasonBackendNotFound},
			check: func(t *testing.T, tbl *Table) {
				assert.Contains(t, only(t, tbl).Invalid, "does not exist")
			},
		},
		{
			name:        "a backendRef to a missing pool is invalid and reported",
			in:          Inputs{Routes: oneRef(poolRef("missing", nil))},
			wantReasons: []string{ReasonBackendNotFound},
			check:       func(t *testing.T, tbl *Table) { assert.NotEmpty(t, only(t, tbl).Invalid) },
		},
		{
			name: "a Service backendRef is a kind the sidecar does not route",
			in: Inputs{Routes: oneRef(gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{
				BackendObjectReference: gatewayv1.BackendObjectReference{Name: "svc", Port: ptr.To[gatewayv1.PortNumber](80)}}})},
			wantReasons: []string{ReasonInvalidKind},
			check:       func(t *testing.T, tbl *Table) { assert.Contains(t, only(t, tbl).Invalid, "InvalidKind") },
		},
		{
			name:        "an InferencePool of the old x-k8s.io group is a kind the sidecar does not know",
			in:          Inputs{Routes: oneRef(backendRef(InferencePoolImportGroup, InferencePoolKind, "llm", nil))},
			wantReasons: []string{ReasonInvalidKind},
		},
		{
			name: "a cross-namespace backendRef is refused",
			in: Inputs{
				Routes: oneRef(func() gatewayv1.HTTPBackendRef {
					r := importRef("llm", nil)
					r.Namespace = ptr.To[gatewayv1.Namespace]("other")
					return r
				}()),
				Imports: []*v1alphaImport{twoClusters},
			},
			wantReasons: []string{ReasonRefNotPermitted},
			check:       func(t *testing.T, tbl *Table) { assert.NotEmpty(t, only(t, tbl).Invalid) },
		},
		{
			name: "an import with no ready cluster is a valid backend without clusters",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{importOf("llm",
				imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse})}},
			wantReasons: []string{ReasonNoReadyClusters},
			check: func(t *testing.T, tbl *Table) {
				assert.Empty(t, only(t, tbl).Invalid)
				assert.Empty(t, only(t, tbl).Clusters)
			},
		},
		{
			name: "a cluster whose Ready is False is left out, one whose Ready is Unknown is kept",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{importOf("llm",
				imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse},
				imported{name: "cluster-c", addr: "127.0.3.1", ready: metav1.ConditionUnknown})}},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, only(t, tbl).Clusters, 1)
				assert.Equal(t, "cluster-c", only(t, tbl).Clusters[0].Name)
			},
		},
		{
			name: "a cluster that rejects mci-apiserver's credentials stays, stale, after the others: its data plane may serve",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse}, imported{name: "cluster-c", addr: "127.0.3.1"})
				imp.Status.Clusters[0].Conditions[0].Reason = v1alpha1.ReasonCredentialsRejected
				return imp
			}()}},
			wantReasons: []string{ReasonClusterUnreachable},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, only(t, tbl).Clusters, 2)
				assert.Equal(t, "cluster-c", only(t, tbl).Clusters[1].Name)
				assert.True(t, only(t, tbl).Clusters[0].Stale)
				assert.Equal(t, "127.0.2.1:9002", only(t, tbl).Clusters[0].EPP, "its last known EPP")
			},
		},
		{
			name: "a cluster that mci-apiserver cannot reach stays, stale, after the others: its EPP may answer",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse}, imported{name: "cluster-c", addr: "127.0.3.1"})
				imp.Status.Clusters[0].Conditions[0].Reason = v1alpha1.ReasonClusterUnreachable
				return imp
			}()}},
			wantReasons: []string{ReasonClusterUnreachable},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, only(t, tbl).Clusters, 2)
				assert.Equal(t, "cluster-a", only(t, tbl).Clusters[0].Name)
				assert.True(t, only(t, tbl).Clusters[0].Stale)
				assert.Equal(t, "127.0.2.1:9002", only(t, tbl).Clusters[0].EPP, "its last known EPP")
				assert.False(t, only(t, tbl).Clusters[1].Stale)
			},
		},
		{
			name: "a cluster without an EPP address is reported and skipped",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"}, imported{name: "cluster-c", addr: "127.0.3.1"})
				imp.Status.Clusters[0].EndpointPicker.Service[0].Addresses = nil
				return imp
			}()}},
			wantReasons: []string{ReasonInvalidImportedCluster},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, only(t, tbl).Clusters, 1)
				assert.Equal(t, "cluster-c", only(t, tbl).Clusters[0].Name)
			},
		},
		{
			name: "an import without any status does not panic",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
			}}},
			wantReasons: []string{ReasonNoReadyClusters},
		},
		{
			name: "a cluster with an unknown routing mode is reported and skipped",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})
				imp.Status.Clusters[0].RoutingMode = "TunnelMode"
				return imp
			}()}},
			wantReasons: []string{ReasonInvalidImportedCluster, ReasonNoReadyClusters},
		},
		{
			name: "an import listing the local cluster never routes to it",
			in: Inputs{LocalCluster: "cluster-b", Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{importOf("llm",
				imported{name: "cluster-b", addr: "127.0.1.1"}, imported{name: "cluster-a", addr: "127.0.2.1"})}},
			wantReasons: []string{ReasonLocalClusterInImport},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, only(t, tbl).Clusters, 1)
				assert.Equal(t, "cluster-a", only(t, tbl).Clusters[0].Name)
			},
		},
		{
			name: "a ParentMode cluster goes to its parent's first address and lowest port",
			in:   Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", parent: "127.0.2.9"})}},
			check: func(t *testing.T, tbl *Table) {
				c := only(t, tbl).Clusters[0]
				assert.Equal(t, v1alpha1.RoutingModeParent, c.Mode)
				assert.Equal(t, "127.0.2.9:80", c.Parent)
				assert.Empty(t, c.EPP)
			},
		},
		{
			name: "a Programmed parent is preferred to one that is not",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := importOf("llm", imported{name: "cluster-a", parent: "127.0.2.9"})
				first := imp.Status.Clusters[0].Parents[0]
				first.Conditions = []metav1.Condition{{Type: string(gatewayv1.GatewayConditionProgrammed), Status: metav1.ConditionFalse}}
				second := *first.DeepCopy()
				second.Service[0].Addresses = []string{"127.0.2.10"}
				second.Conditions = nil
				imp.Status.Clusters[0].Parents = []v1alpha1.ParentImport{first, second}
				return imp
			}()}},
			check: func(t *testing.T, tbl *Table) { assert.Equal(t, "127.0.2.10:80", only(t, tbl).Clusters[0].Parent) },
		},
		{
			name: "a pool whose EPP Service is missing is a valid backend without clusters",
			in:   Inputs{Routes: oneRef(poolRef("llm", nil)), Pools: []*poolv1.InferencePool{pool("llm", "")}},
			// Reported once however many backendRefs name the pool.
			wantReasons: []string{ReasonInvalidEndpointPicker},
			check: func(t *testing.T, tbl *Table) {
				assert.Empty(t, only(t, tbl).Invalid)
				assert.Empty(t, only(t, tbl).Clusters)
			},
		},
		{
			name: "an import gets the same-named local pool for LocalFirst, and its failure mode",
			in: Inputs{
				LocalCluster: "cluster-b", Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{twoClusters},
				Pools: []*poolv1.InferencePool{pool("llm", poolv1.FailOpen)}, Services: []*corev1.Service{eppService("llm", "127.0.1.1")},
			},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				require.NotNil(t, b.Local)
				assert.Equal(t, "cluster-b", b.Local.Name)
				assert.True(t, b.Local.Local)
				assert.Equal(t, poolv1.FailOpen, b.FailureMode)
			},
		},
		{
			name: "route annotations choose the policy, the cluster weights and the import's failure mode",
			in: Inputs{
				Routes: []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))),
					PolicyAnnotation, "Weighted", ClusterWeightsAnnotation, "cluster-a=3, cluster-c=0", FailureModeAnnotation, "FailOpen")},
				Imports: []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				assert.Equal(t, routingpolicy.Weighted, b.Policy.Name)
				assert.Equal(t, poolv1.FailOpen, b.FailureMode)
				assert.EqualValues(t, 3, b.Clusters[0].Weight)
				assert.EqualValues(t, 0, b.Clusters[1].Weight)
			},
		},
		{
			name: "invalid route annotations are reported and ignored",
			in: Inputs{
				DefaultPolicy: routingpolicy.Named()[routingpolicy.LocalFirst],
				Routes: []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))),
					PolicyAnnotation, "Fastest", ClusterWeightsAnnotation, "cluster-a", FailureModeAnnotation, "FailSometimes")},
				Imports: []*v1alphaImport{twoClusters},
			},
			wantReasons: []string{ReasonInvalidAnnotation, ReasonInvalidAnnotation, ReasonInvalidAnnotation},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				assert.Equal(t, routingpolicy.LocalFirst, b.Policy.Name)
				assert.Equal(t, poolv1.FailClose, b.FailureMode)
				assert.EqualValues(t, 1, b.Clusters[0].Weight)
			},
		},
		{
			name: "an import's label chooses its policy when the route does not",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := twoClusters.DeepCopy()
				imp.Labels = map[string]string{PolicyAnnotation: "MetricsBased"}
				return imp
			}()}},
			check: func(t *testing.T, tbl *Table) { assert.Equal(t, routingpolicy.MetricsBased, only(t, tbl).Policy.Name) },
		},
		{
			name: "a route annotation may write a configuration inline",
			in: Inputs{
				Routes:  []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))), PolicyAnnotation, " prefix-cache=3,in-flight=1,pick=two-choices ")},
				Imports: []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				assert.Equal(t, "prefix-cache=3,in-flight=1,pick=two-choices", only(t, tbl).Policy.Name)
			},
		},
		{
			name: "an import's annotation names PrefixAffinity",
			in: Inputs{Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{func() *v1alphaImport {
				imp := twoClusters.DeepCopy()
				imp.Annotations = map[string]string{PolicyAnnotation: "PrefixAffinity"}
				return imp
			}()}},
			check: func(t *testing.T, tbl *Table) {
				assert.Equal(t, routingpolicy.PrefixAffinity, only(t, tbl).Policy.Name)
			},
		},
		{
			name:        "an invalid inline configuration is reported and the default used",
			in:          Inputs{DefaultPolicy: routingpolicy.Named()[routingpolicy.Weighted], Routes: []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))), PolicyAnnotation, "prefix-cache=0")}, Imports: []*v1alphaImport{twoClusters}},
			wantReasons: []string{ReasonInvalidAnnotation},
			check:       func(t *testing.T, tbl *Table) { assert.Equal(t, routingpolicy.Weighted, only(t, tbl).Policy.Name) },
		},
		{
			name: "the route's policy wins over the import's",
			in: Inputs{
				Routes: []*gatewayv1.HTTPRoute{annotate(route("r", 0, nil, rule(nil, importRef("llm", nil))), PolicyAnnotation, "Weighted")},
				Imports: []*v1alphaImport{func() *v1alphaImport {
					imp := twoClusters.DeepCopy()
					imp.Labels = map[string]string{PolicyAnnotation: "MetricsBased"}
					return imp
				}()},
			},
			check: func(t *testing.T, tbl *Table) { assert.Equal(t, routingpolicy.Weighted, only(t, tbl).Policy.Name) },
		},
		{
			name: "only routes attached to the sidecar's gateway are routed",
			in: Inputs{
				ServedGateways: []types.NamespacedName{{Namespace: ns, Name: "inf-gw"}},
				Gateways:       []*gatewayv1.Gateway{gateway("inf-gw", listener("http", 80, "", nil)), gateway("other-gw", listener("http", 80, "", nil))},
				Routes: []*gatewayv1.HTTPRoute{
					func() *gatewayv1.HTTPRoute {
						r := route("mine", 0, nil, rule(nil, importRef("llm", nil)))
						r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "inf-gw"}}
						return r
					}(),
					func() *gatewayv1.HTTPRoute {
						r := route("theirs", 0, nil, rule(nil, importRef("llm", nil)))
						r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "other-gw"}}
						return r
					}(),
				},
				Imports: []*v1alphaImport{twoClusters},
			},
			check: func(t *testing.T, tbl *Table) {
				require.Len(t, tbl.Rules(), 1)
				assert.Equal(t, "mine", tbl.Rules()[0].Route.Name)
			},
		},
		{
			name: "a broken match is reported and ignored, the rule's other matches still apply",
			in: Inputs{
				Routes:  []*gatewayv1.HTTPRoute{route("r", 0, nil, rule([]gatewayv1.HTTPRouteMatch{regex("(unclosed"), prefix("/v1")}, importRef("llm", nil)))},
				Imports: []*v1alphaImport{twoClusters},
			},
			wantReasons: []string{ReasonUnsupportedValue},
			check: func(t *testing.T, tbl *Table) {
				assert.NotNil(t, ruleOf(tbl, &RequestAttrs{Path: "/v1/x"}))
				assert.Nil(t, ruleOf(tbl, &RequestAttrs{Path: "/(unclosed"}))
			},
		},
		{
			name: "a rule without backendRefs and one whose weights are all 0 are reported",
			in: Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil,
				rule([]gatewayv1.HTTPRouteMatch{prefix("/a")}),
				rule([]gatewayv1.HTTPRouteMatch{prefix("/b")}, importRef("llm", ptr.To[int32](0))))},
				Imports: []*v1alphaImport{twoClusters}},
			wantReasons: []string{ReasonNoBackendRefs, ReasonAllWeightsZero},
			check: func(t *testing.T, tbl *Table) {
				assert.Nil(t, ruleOf(tbl, &RequestAttrs{Path: "/a"}).PickBackend())
				assert.Nil(t, ruleOf(tbl, &RequestAttrs{Path: "/b"}).PickBackend())
			},
		},
		{
			name: "a filter the sidecar cannot apply is reported",
			in: Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, gatewayv1.HTTPRouteRule{
				Filters:     []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror}},
				BackendRefs: []gatewayv1.HTTPBackendRef{importRef("llm", nil)},
			})}, Imports: []*v1alphaImport{twoClusters}},
			wantReasons: []string{ReasonUnsupportedFilter},
		},
		{
			name: "an import's problems are reported once however many rules name it",
			in: Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil,
				rule([]gatewayv1.HTTPRouteMatch{prefix("/a")}, importRef("llm", nil)),
				rule([]gatewayv1.HTTPRouteMatch{prefix("/b")}, importRef("llm", nil)))},
				Imports: []*v1alphaImport{importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1", ready: metav1.ConditionFalse})}},
			wantReasons: []string{ReasonNoReadyClusters},
		},
		{
			name: "InferenceModels of the backend give criticality",
			in: Inputs{
				Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{twoClusters},
				Models: []*v1alpha2.InferenceModel{
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"}, Spec: v1alpha2.InferenceModelSpec{
						ModelName: "batch", Criticality: ptr.To(v1alpha2.Sheddable), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}}},
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-pool"}, Spec: v1alpha2.InferenceModelSpec{
						ModelName: "chat", Criticality: ptr.To(v1alpha2.Sheddable), PoolRef: v1alpha2.PoolObjectReference{Name: "other"}}},
				},
			},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				assert.Equal(t, scheduling.Sheddable, b.Criticality("batch", ""))
				assert.Equal(t, scheduling.Standard, b.Criticality("chat", ""), "a model of another pool")
				assert.Equal(t, scheduling.Standard, b.Criticality("", ""))
			},
		},
		{
			name: "InferenceObjectives of the backend, of both groups, give criticality by the objective a request names",
			in: Inputs{
				Routes: oneRef(importRef("llm", nil)), Imports: []*v1alphaImport{twoClusters},
				Models: []*v1alpha2.InferenceModel{
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"}, Spec: v1alpha2.InferenceModelSpec{
						ModelName: "batch", Criticality: ptr.To(v1alpha2.Sheddable), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}}},
				},
				Objectives: []*v1alpha2.InferenceObjective{
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "background"}, Spec: v1alpha2.InferenceObjectiveSpec{
						Priority: ptr.To[int32](-1), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}}},
					requestmodel.ObjectiveFromLLMD(&llmdv1alpha2.InferenceObjective{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "interactive"}, Spec: v1alpha2.InferenceObjectiveSpec{
						Priority: ptr.To[int32](5), PoolRef: v1alpha2.PoolObjectReference{Name: "llm", Group: "inference.networking.k8s.io"}}}),
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "elsewhere"}, Spec: v1alpha2.InferenceObjectiveSpec{
						Priority: ptr.To[int32](-1), PoolRef: v1alpha2.PoolObjectReference{Name: "other"}}},
					{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other-group"}, Spec: v1alpha2.InferenceObjectiveSpec{
						Priority: ptr.To[int32](-1), PoolRef: v1alpha2.PoolObjectReference{Name: "llm", Group: "example.com"}}},
				},
			},
			check: func(t *testing.T, tbl *Table) {
				b := only(t, tbl)
				assert.Equal(t, scheduling.Sheddable, b.Criticality("chat", "background"), "priority below 0")
				assert.Equal(t, scheduling.Critical, b.Criticality("batch", "interactive"), "the objective wins over the InferenceModel")
				assert.Equal(t, scheduling.Sheddable, b.Criticality("batch", "no-such-objective"), "an unknown objective counts as none")
				assert.Equal(t, scheduling.Standard, b.Criticality("chat", "elsewhere"), "an objective of another pool")
				assert.Equal(t, scheduling.Standard, b.Criticality("chat", "other-group"), "an objective whose poolRef is of another group")
			},
		},
		{
			name: "empty inputs build an empty table",
			in:   Inputs{},
			check: func(t *testing.T, tbl *Table) {
				assert.Empty(t, tbl.Rules())
				assert.Nil(t, ruleOf(tbl, &RequestAttrs{Path: "/"}))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl, errs := Build(tt.in)
			assert.Equal(t, tt.wantReasons, reasons(errs), "%v", errs)
			assert.Equal(t, errs, tbl.Errors)
			if tt.check != nil {
				tt.check(t, tbl)
			}
		})
	}
}

func TestBuildIsPure(t *testing.T) {
	imp := importOf("llm", imported{name: "cluster-a", addr: "127.0.2.1"})
	r := annotate(route("r", 0, []string{"My.Model.com"}, rule(nil, importRef("llm", nil))), ClusterWeightsAnnotation, "cluster-a=2")
	before := []any{imp.DeepCopy(), r.DeepCopy()}
	in := Inputs{Routes: []*gatewayv1.HTTPRoute{r}, Imports: []*v1alphaImport{imp}}
	t1, _ := Build(in)
	t2, _ := Build(in)
	assert.Equal(t, before, []any{imp, r}, "inputs are not modified")
	c1, c2 := only(t, t1).Clusters[0], only(t, t2).Clusters[0]
	assert.Equal(t, *c1, *c2)
	assert.NotSame(t, c1, c2, "tables share nothing mutable")
	assert.Equal(t, t1.Rules()[0].wrr.key, t2.Rules()[0].wrr.key)
}

func TestParseClusterWeights(t *testing.T) {
	w, err := parseClusterWeights(" a=1 ,b = 20,, ")
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"a": 1, "b": 20}, w)
	for _, bad := range []string{"a", "=1", "a=-1", "a=x", "a=2000000", "a=1,b=2, a=3"} {
		_, err := parseClusterWeights(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseEndpointPickerAcceptsOnlyServiceNames(t *testing.T) {
	for _, good := range []string{"epp", " epp:9002 ", "epp-1:65535"} {
		_, err := parseEndpointPicker(good)
		assert.NoError(t, err, good)
	}
	for _, bad := range []string{"", ":9002", "ns/epp", "EPP", "epp.other", "a b", "épp", strings.Repeat("a", 64), "epp:", "epp:0", "epp:+80", "epp:65536", "epp:1:2"} {
		_, err := parseEndpointPicker(bad)
		assert.Error(t, err, bad)
	}
}

// TestLocalPoolEPPPortIsTheImportsRule holds the sidecar's local pool to
// the EPP-port rule mci-apiserver uses for the pool's import
// (eppaddr.ResolvePorts), where the two used to differ: the sidecar
// fell back to a port numbered 9002, the import to the only port that is
// neither health nor metrics.
func TestLocalPoolEPPPortIsTheImportsRule(t *testing.T) {
	healthAndMetrics := []corev1.ServicePort{{Name: "grpc-health", Port: 9003}, {Name: "http-metrics", Port: 9090}}
	tests := []struct {
		name  string
		ports []corev1.ServicePort
		want  int32 // 0: unknown, the pool is reported
	}{
		{name: "a port named for ext-proc", ports: []corev1.ServicePort{{Name: "grpc-ext-proc", Port: 9002}}, want: 9002},
		{name: "the only other port, not numbered 9002 (the sidecar used to find none)", ports: []corev1.ServicePort{{Name: "http", Port: 8080}}, want: 8080},
		{name: "two other ports, one numbered 9002 (the sidecar used to take 9002)", ports: []corev1.ServicePort{{Name: "a", Port: 9002}, {Name: "b", Port: 8000}}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := eppService("llm", "127.0.1.1")
			svc.Spec.Ports = append(slices.Clone(tt.ports), healthAndMetrics...)
			p := pool("llm", "")
			p.Spec.EndpointPickerRef.Port = nil
			require.Equal(t, tt.want, eppaddr.ResolvePorts(svc, 0).ExtProc, "the import's rule")

			tbl, errs := Build(Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, poolRef("llm", nil)))},
				Pools: []*poolv1.InferencePool{p}, Services: []*corev1.Service{svc}})
			b := only(t, tbl)
			if tt.want == 0 {
				assert.Empty(t, b.Clusters)
				require.NotEmpty(t, errs)
				assert.Contains(t, errs[0].Error(), "ext-proc port")
				return
			}
			assert.Empty(t, errs)
			require.Len(t, b.Clusters, 1)
			assert.Equal(t, net.JoinHostPort("127.0.1.1", strconv.Itoa(int(tt.want))), b.Clusters[0].EPP)
		})
	}
}
