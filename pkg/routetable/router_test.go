package routetable

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/mci-dev/mci/pkg/clusterscore"
	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// tableWith builds a table whose one rule splits between imports "x<gen>"
// and "y<gen>" 1:1; every cluster of import x<gen> is named c<gen>, so a
// reader can tell whether what it sees belongs to one table.
func tableWith(t testing.TB, gen int) *Table {
	x, y := fmt.Sprintf("x%d", gen), fmt.Sprintf("y%d", gen)
	c := fmt.Sprintf("c%d", gen)
	tbl, errs := Build(Inputs{
		Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef(x, nil), importRef(y, nil)))},
		Imports: []*v1alphaImport{
			importOf(x, imported{name: c, addr: "127.0.2.1"}, imported{name: c, addr: "127.0.2.2"}),
			importOf(y, imported{name: c, addr: "127.0.3.1"}),
		},
	})
	require.Empty(t, errs)
	return tbl
}

func TestRouterSwapsUnderConcurrentReaders(t *testing.T) {
	r := NewRouter()
	assert.Zero(t, r.Table().Generation)
	assert.Nil(t, ruleOf(r.Table(), &RequestAttrs{Path: "/"}), "the empty table matches nothing")

	ctx, cancel := context.WithCancel(context.Background())
	var reads atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var lastGen uint64
			for ctx.Err() == nil {
				tbl := r.Table()
				if tbl.Generation < lastGen {
					t.Errorf("generation went back from %d to %d", lastGen, tbl.Generation)
					return
				}
				lastGen = tbl.Generation
				rl, _ := tbl.Match(&RequestAttrs{Host: "h", Path: "/v1/completions"})
				if rl == nil {
					continue
				}
				b := rl.PickBackend()
				// Every cluster of the table this request loaded belongs
				// to that table: a request never sees a half-built one.
				want := b.Clusters[0].Name
				for _, c := range b.Clusters {
					if c.Name != want || b.Name[1:] != want[1:] {
						t.Errorf("backend %s of generation %d has cluster %s", b.Name, tbl.Generation, c.Name)
						return
					}
				}
				reads.Add(1)
			}
		})
	}
	for gen := 1; gen <= 200; gen++ {
		r.Publish(tableWith(t, gen))
		if gen%20 == 0 {
			time.Sleep(time.Millisecond) // lets the readers run between publications
		}
	}
	// Let the readers see the last table.
	require.Eventually(t, func() bool { return reads.Load() > 100 }, 5*time.Second, time.Millisecond)
	cancel()
	wg.Wait()
	assert.EqualValues(t, 200, r.Table().Generation)
}

func TestRouterCarriesWeightedStateOver(t *testing.T) {
	build := func(weights ...int32) *Table {
		var refs []gatewayv1.HTTPBackendRef
		var imports []*v1alphaImport
		for i, w := range weights {
			name := fmt.Sprintf("p%d", i)
			refs = append(refs, importRef(name, ptr.To(w)))
			imports = append(imports, importOf(name, imported{name: "c", addr: "127.0.2.1"}))
		}
		tbl, _ := Build(Inputs{Routes: []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, refs...))}, Imports: imports})
		return tbl
	}
	pick := func(r *Router) string { return ruleOf(r.Table(), &RequestAttrs{Path: "/"}).PickBackend().Name }

	t.Run("a rebuild between every request keeps the split exact", func(t *testing.T) {
		r := NewRouter()
		counts := map[string]int{}
		for range 300 {
			r.Publish(build(1, 2))
			counts[pick(r)]++
		}
		assert.Equal(t, map[string]int{"p0": 100, "p1": 200}, counts)
	})

	t.Run("changed weights start afresh", func(t *testing.T) {
		r := NewRouter()
		r.Publish(build(1, 1))
		first := r.Table().Rules()[0].wrr
		r.Publish(build(1, 1))
		assert.Same(t, first, r.Table().Rules()[0].wrr)
		r.Publish(build(1, 3))
		assert.NotSame(t, first, r.Table().Rules()[0].wrr)
	})
}

// BenchmarkBuild rebuilds a table of 200 HTTPRoutes over 100 imports of
// three clusters each and 100 local pools: the cost of one informer event.
func BenchmarkBuild(b *testing.B) {
	in := benchInputs()
	r := NewRouter()
	b.ReportAllocs()
	for b.Loop() {
		t, errs := Build(in)
		if len(errs) > 0 {
			b.Fatal(errs)
		}
		r.Publish(t)
	}
}

// TestPublishCompilesEachPolicyOnce: Publish gives every backend its policy
// compiled, one pipeline per policy text for the whole table and for the
// tables after it that still name it, so that no request compiles one.
func TestPublishCompilesEachPolicyOnce(t *testing.T) {
	in := func(policyY string) Inputs {
		return Inputs{
			Routes: []*gatewayv1.HTTPRoute{
				annotate(route("r", 0, nil, rule(nil, importRef("x", nil), importRef("y", nil))), PolicyAnnotation, "PrefixAffinity"),
				route("s", 0, []string{"s.example.com"}, rule(nil, importRef("y", nil))),
			},
			Imports: []*v1alphaImport{
				importOf("x", imported{name: "a", addr: "127.0.2.1"}),
				annotate(importOf("y", imported{name: "a", addr: "127.0.3.1"}), PolicyAnnotation, policyY),
			},
		}
	}
	backends := func(tbl *Table) []*Backend {
		var out []*Backend
		for b := range tbl.Backends {
			out = append(out, b)
		}
		return out
	}
	r := NewRouter()
	first, errs := Build(in("queue=1, kv-cache=1"))
	require.Empty(t, errs)
	for _, b := range backends(first) {
		assert.Nil(t, b.Scoring(), "a table not yet published has nothing compiled")
	}
	r.Publish(first)
	bs := backends(first)
	require.Len(t, bs, 3)
	for _, b := range bs {
		require.NotNil(t, b.Scoring(), b.String())
		assert.Equal(t, b.Policy, b.Scoring().Config(), b.String())
	}
	assert.Equal(t, routingpolicy.PrefixAffinity, bs[0].Policy.Name, "the route's policy wins")
	assert.Same(t, bs[0].Scoring(), bs[1].Scoring(), "one pipeline per policy")
	assert.Equal(t, "queue=1, kv-cache=1", bs[2].Policy.Name, "the import's policy")
	assert.Same(t, r.Memory(), bs[0].Scoring().Memory(), "the policies share the router's memory")

	second, _ := Build(in("HubReference"))
	r.Publish(second)
	again := backends(second)
	assert.Same(t, bs[0].Scoring(), again[0].Scoring(), "a policy the next table still names is not compiled again")
	assert.Equal(t, routingpolicy.HubReference, again[2].Scoring().Config().Name)
}

// TestPublishReportsAPolicyThatDoesNotCompile: only a configuration written
// in code can fail to compile (Parse accepts what Validate does); its
// backend answers 500 and the table says why once, rather than routing by
// a policy nobody chose.
func TestPublishReportsAPolicyThatDoesNotCompile(t *testing.T) {
	bad := routingpolicy.Named()[routingpolicy.Weighted]
	bad.Name, bad.Filters = "no-filters", nil
	tbl, errs := Build(Inputs{
		DefaultPolicy: bad,
		Routes:        []*gatewayv1.HTTPRoute{route("r", 0, nil, rule(nil, importRef("x", nil), importRef("y", nil)))},
		Imports:       []*v1alphaImport{importOf("x", imported{name: "a", addr: "127.0.2.1"}), importOf("y", imported{name: "a", addr: "127.0.3.1"})},
	})
	require.Empty(t, errs)
	NewRouter().Publish(tbl)
	require.Len(t, tbl.Errors, 1, "reported once for the policy")
	assert.ErrorContains(t, tbl.Errors[0], "cluster policy does not compile")
	for b := range tbl.Backends {
		assert.Contains(t, b.Invalid, `cluster policy "no-filters" does not compile`)
		assert.NotNil(t, b.Scoring(), "a published backend always has a policy, never asked")
	}
}

func TestInvalidPolicyCompiles(t *testing.T) {
	require.NotNil(t, invalidPolicy)
}

func TestSetScoringIsRefusedOnceATableIsPublishedOrWithBadThresholds(t *testing.T) {
	r := NewRouter()
	assert.ErrorContains(t, r.SetScoring(Scoring{Thresholds: scheduling.Config{SheddableKVCacheThreshold: 2}}), "not between 0 and 1")
	mem := clusterscore.NewMemory(clusterscore.DefaultMemoryOptions())
	require.NoError(t, r.SetScoring(Scoring{Thresholds: scheduling.DefaultConfig(), Memory: mem}))
	assert.Same(t, mem, r.Memory())
	r.Publish(tableWith(t, 1))
	assert.ErrorContains(t, r.SetScoring(Scoring{Thresholds: scheduling.DefaultConfig()}), "after a routing table was published")
}
