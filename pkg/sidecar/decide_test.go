package sidecar

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha2"
	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
	"github.com/mci-dev/mci/pkg/extproc"
	"github.com/mci-dev/mci/pkg/routetable"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/sidecar/sidecartest"
)

// decided is what a test reads of a decision: the sidecar's own answer,
// or the clusters tried in turn.
type decided struct {
	outcome  string
	code     int
	details  string // a part of the own answer's details
	order    []string
	failOpen bool
	fallback []string
}

func summarize(d decision) decided {
	names := func(cs []*routetable.Cluster) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return out
	}
	return decided{outcome: d.outcome, code: d.code, details: d.details, order: names(d.order), failOpen: d.failOpen, fallback: names(d.fallback)}
}

// request is a request of the gateway for host and path, with headers as
// name/value pairs.
func request(host, path string, body []byte, headers ...string) *extproc.Request {
	h := map[string][]string{":authority": {host}, ":path": {path}, ":method": {"POST"}}
	for i := 0; i+1 < len(headers); i += 2 {
		h[headers[i]] = append(h[headers[i]], headers[i+1])
	}
	return &extproc.Request{Headers: h, Body: body}
}

// TestDecide is the specification of where a request goes, decided before
// anything is sent: the route, the backendRef, the clusters in order and
// what FailOpen adds; or the sidecar's own answer.
func TestDecide(t *testing.T) {
	const host = "my.model.com"
	route := func(name, prefix string, refs ...gatewayv1.HTTPBackendRef) *gatewayv1.HTTPRoute {
		return sidecartest.Route(name, 0, []string{host}, sidecartest.Rule([]gatewayv1.HTTPRouteMatch{sidecartest.Prefix(prefix)}, refs...))
	}
	redirect := route("old", "/old")
	redirect.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{StatusCode: ptr.To(301)}}}
	mirrored := route("mirrored", "/mirrored", sidecartest.ImportRef("llm", nil))
	mirrored.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{}}}
	// Each case decides with tables of its own: a backend's weighted
	// round-robin turns with each decision.
	routes := routetable.Inputs{
		Routes: []*gatewayv1.HTTPRoute{
			route("llm", "/v1", sidecartest.ImportRef("llm", nil)),
			sidecartest.Annotate(route("open", "/open", sidecartest.ImportRef("llm", nil)), routetable.FailureModeAnnotation, "FailOpen"),
			sidecartest.Annotate(route("batch", "/batch", sidecartest.ImportRef("llm", nil)), routetable.PolicyAnnotation, "MetricsBased"),
			redirect, mirrored,
			route("missing", "/missing", sidecartest.ImportRef("nope", nil)),
			route("weightless", "/weightless", sidecartest.ImportRef("llm", ptr.To[int32](0))),
		},
		Imports: []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"}, sidecartest.Imported{Name: "cluster-c", Addr: "127.0.2.3"})},
		Models: []*v1alpha2.InferenceModel{{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"},
			Spec:       v1alpha2.InferenceModelSpec{ModelName: "batch", Criticality: ptr.To(v1alpha2.Sheddable), PoolRef: v1alpha2.PoolObjectReference{Name: "llm"}},
		}},
	}
	// shim is the table of a sidecar that is the EPP of the pool llm, whose
	// own EPP is llm-epp, and which cluster-a and cluster-c export too.
	shimmed := shimPool("llm", "llm-epp")
	shim := routetable.Inputs{
		EndpointPickerServices: []types.NamespacedName{sidecarService},
		LocalCluster:           "cluster-b",
		Pools:                  []*poolv1.InferencePool{shimmed},
		Services:               []*corev1.Service{sidecartest.EPPService("llm", "127.0.1.1")},
		Imports:                []*v1alpha1.InferencePoolImport{sidecartest.Import("llm", sidecartest.Imported{Name: "cluster-a", Addr: "127.0.2.1"})},
	}
	now := time.Now()
	healthy := &fakeState{health: map[string]Health{"cluster-a": HealthServing, "cluster-c": HealthServing}}
	aDown := &fakeState{health: map[string]Health{"cluster-a": HealthNotServing, "cluster-c": HealthServing}}
	saturated := func(queue float64) *PoolMetrics {
		return &PoolMetrics{AverageQueue: queue, AverageKVCache: 0.9, ReadyPods: 2, UpdatedAt: now.Add(time.Hour)}
	}
	full := &fakeState{metrics: map[string]*PoolMetrics{"cluster-a": saturated(20), "cluster-c": saturated(30)}}
	batch := []byte(`{"model":"batch","prompt":"x"}`)

	tests := []struct {
		name  string
		shim  bool // the shim table, else routes'
		req   *extproc.Request
		state State // nil: healthy
		want  decided
	}{
		{
			name: "a request no rule matches is 404",
			req:  request(host, "/elsewhere", chatBody),
			want: decided{outcome: OutcomeNoRoute, code: http.StatusNotFound, details: `no HTTPRoute rule matches host "my.model.com" path "/elsewhere"`},
		},
		{
			name: "a rule's redirect answers with its status, and no cluster is tried",
			req:  request(host, "/old/models", nil),
			want: decided{outcome: OutcomeRedirected, code: http.StatusMovedPermanently},
		},
		{
			name: "a rule with a filter the sidecar cannot apply is 500",
			req:  request(host, "/mirrored", chatBody),
			want: decided{outcome: OutcomeInvalidBackend, code: http.StatusInternalServerError, details: "RequestMirror"},
		},
		{
			name: "a backendRef to a missing object is 500",
			req:  request(host, "/missing", chatBody),
			want: decided{outcome: OutcomeInvalidBackend, code: http.StatusInternalServerError, details: "nope"},
		},
		{
			name: "a rule whose backendRefs all weigh 0 is 500",
			req:  request(host, "/weightless", chatBody),
			want: decided{outcome: OutcomeInvalidBackend, code: http.StatusInternalServerError, details: "no backendRef with a weight"},
		},
		{
			name: "the backend's clusters go in the policy's order",
			req:  request(host, "/v1/completions", chatBody),
			want: decided{order: []string{"cluster-a", "cluster-c"}},
		},
		{
			name:  "FailClose leaves out a cluster known to be down",
			req:   request(host, "/v1/completions", chatBody),
			state: aDown,
			want:  decided{order: []string{"cluster-c"}},
		},
		{
			name:  "FailOpen tries the clusters left out after the order",
			req:   request(host, "/open/completions", chatBody),
			state: aDown,
			want:  decided{order: []string{"cluster-c"}, failOpen: true, fallback: []string{"cluster-a"}},
		},
		{
			name:  "a sheddable request is shed when every cluster is measured and saturated",
			req:   request(host, "/batch", batch),
			state: full,
			want:  decided{outcome: OutcomeShed, code: http.StatusTooManyRequests, details: "saturated"},
		},
		{
			name:  "a standard request is never shed: it goes to the saturated clusters, the least loaded first",
			req:   request(host, "/batch", chatBody),
			state: full,
			want:  decided{order: []string{"cluster-a", "cluster-c"}},
		},
		{
			name: "in shim mode a request without a route goes to the only shim pool: the import's clusters and the local EPP, serving ones first",
			shim: true,
			req:  request("anything", "/v1/completions", chatBody),
			want: decided{order: []string{"cluster-a", "cluster-b"}},
		},
		{
			name: "in shim mode a request another cluster's sidecar relayed goes to the local EPP only",
			shim: true,
			req:  request("anything", "/v1/completions", chatBody, extproc.RelayedHeader, "cluster-a"),
			want: decided{order: []string{"cluster-b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, st := routes, tt.state
			if tt.shim {
				in = shim
			}
			table, _ := publishTable(routetable.NewRouter(), in)
			if st == nil {
				st = healthy
			}
			dc := decider{state: st}
			got := summarize(dc.decide(table, tt.req, routetable.Arrival{Main: true}, now, false))
			want := tt.want
			if want.details != "" {
				assert.Contains(t, got.details, want.details)
				got.details, want.details = "", ""
			}
			assert.Equal(t, want, got)
		})
	}
}

func TestDecideExplainsOnlyWhenAsked(t *testing.T) {
	tbl := testTable(routingpolicy.HealthBased, false, []string{"cluster-a", "cluster-c"})
	dc := decider{state: &fakeState{health: map[string]Health{"cluster-a": HealthServing}}}
	req := request("", "/", chatBody)
	assert.Empty(t, dc.decide(tbl, req, routetable.Arrival{Main: true}, time.Now(), false).explanation)
	explained := dc.decide(tbl, req, routetable.Arrival{Main: true}, time.Now(), true).explanation
	assert.Contains(t, explained, "cluster-a")
	assert.Contains(t, explained, "cluster-c")
}

func TestDecideSaysWhyAPromptCannotBeRead(t *testing.T) {
	tbl := testTable(routingpolicy.PrefixAffinity, false, []string{"cluster-a", "cluster-c"})
	dc := decider{state: &fakeState{}}
	d := dc.decide(tbl, request("", "/", []byte(`{"model":`)), routetable.Arrival{Main: true}, time.Now(), false)
	assert.Error(t, d.promptErr, "routed without prefix affinity")
	assert.Len(t, d.order, 2, "routed all the same")
	d = dc.decide(tbl, request("", "/", []byte(`{"model":"chat"}`)), routetable.Arrival{Main: true}, time.Now(), false)
	assert.NoError(t, d.promptErr, "a body without a prompt has no prefix, and nothing wrong")
}
