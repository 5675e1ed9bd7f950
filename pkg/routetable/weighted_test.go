package routetable

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	poolv1 "github.com/mci-dev/mci/pkg/apis/inferencepool/v1"
)

// TestFiftyFiftySplit is the proposal's example: an HTTPRoute rule with an
// InferencePool and an InferencePoolImport backendRef of weight 50 each
// MUST split traffic equally. Over 2,000 picks the split must be within the
// statistical bounds of a fair coin (3 standard deviations: 1000 ± 67);
// smooth weighted round-robin makes it exact.
func TestFiftyFiftySplit(t *testing.T) {
	tbl, errs := Build(Inputs{
		Routes: []*gatewayv1.HTTPRoute{route("llm-route", 0, []string{"my.model.com"},
			rule([]gatewayv1.HTTPRouteMatch{prefix("/completions")},
				poolRef("llm-pool", ptr.To[int32](50)),
				importRef("llm-pool", ptr.To[int32](50))))},
		Pools:    []*poolv1.InferencePool{pool("llm-pool", poolv1.FailClose)},
		Services: []*corev1.Service{eppService("llm-pool", "127.0.1.1")},
		Imports:  []*v1alphaImport{importOf("llm-pool", imported{name: "cluster-a", addr: "127.0.2.1"})},
	})
	require.Empty(t, errs)
	r, _ := tbl.Match(&RequestAttrs{Host: "my.model.com", Path: "/completions"})
	require.NotNil(t, r)

	const n = 2000
	counts := map[BackendKind]int{}
	for range n {
		counts[r.PickBackend().Kind]++
	}
	bound := 3 * math.Sqrt(n*0.5*0.5)
	for _, k := range []BackendKind{BackendInferencePool, BackendInferencePoolImport} {
		assert.InDelta(t, n/2, counts[k], bound, "%s got %d of %d", k, counts[k], n)
	}
	assert.Equal(t, n/2, counts[BackendInferencePool], "smooth weighted round-robin splits exactly")
}

func TestBackendWeights(t *testing.T) {
	tests := []struct {
		name    string
		weights []*int32
		want    []int // picks per backendRef over 120 requests; nil when none is picked
	}{
		{name: "no weight means 1", weights: []*int32{nil, nil}, want: []int{60, 60}},
		{name: "weights are proportions, not percentages", weights: []*int32{ptr.To[int32](1), ptr.To[int32](2)}, want: []int{40, 80}},
		{name: "weight 0 is never picked", weights: []*int32{ptr.To[int32](0), ptr.To[int32](7)}, want: []int{0, 120}},
		{name: "a single backendRef takes everything", weights: []*int32{ptr.To[int32](5)}, want: []int{120}},
		{name: "every weight 0 picks nothing", weights: []*int32{ptr.To[int32](0), ptr.To[int32](0)}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var refs []gatewayv1.HTTPBackendRef
			var imports []*v1alphaImport
			for i, w := range tt.weights {
				name := fmt.Sprintf("p%d", i)
				refs = append(refs, importRef(name, w))
				imports = append(imports, importOf(name, imported{name: "c", addr: "127.0.2.1"}))
			}
			tbl, _ := Build(Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, refs...))}, Imports: imports})
			r, _ := tbl.Match(&RequestAttrs{Path: "/"})
			require.NotNil(t, r)
			if tt.want == nil {
				assert.Nil(t, r.PickBackend())
				return
			}
			got := make([]int, len(refs))
			for range 120 {
				b := r.PickBackend()
				got[int(b.Name[1]-'0')]++
			}
			assert.Equal(t, tt.want, got)
		})
	}
}
