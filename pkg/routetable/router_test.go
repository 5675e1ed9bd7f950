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
