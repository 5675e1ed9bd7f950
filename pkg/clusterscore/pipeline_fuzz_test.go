package clusterscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// FuzzCompile: every configuration routingpolicy.Parse accepts compiles
// and picks without error or panic.
func FuzzCompile(f *testing.F) {
	for _, s := range append([]string{"queue=1", "prefix-cache=3,session=2,pick=two-choices,filters=health+ready", "in-flight=1,home-bound=100,queue-margin=0",
		"pick=chain,filters=local-first", "queue=1,pick=round-robin", "latency=1,errors=1,affinity-margin=off"}, routingpolicy.Names...) {
		f.Add(s)
	}
	mem := NewMemory(MemoryOptions{PrefixBlocks: 1, Sessions: 1})
	cands := []Candidate{{Name: "a", Weight: 1}, {Name: "b", Weight: 2, Health: HealthServing}}
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := routingpolicy.Parse(s)
		if err != nil {
			return
		}
		p, err := New(cfg, scheduling.DefaultConfig(), mem)
		require.NoError(t, err)
		order, err := p.Pick(&Request{Now: epoch}, cands, NewRotation(cands), nil, &Explanation{})
		require.NoError(t, err)
		assert.LessOrEqual(t, len(order), len(cands))
	})
}

func TestNamedConfigurationsCompile(t *testing.T) {
	for _, name := range routingpolicy.Names {
		_, err := New(routingpolicy.Named()[name], scheduling.DefaultConfig(), NewMemory(DefaultMemoryOptions()))
		require.NoError(t, err, name)
	}
	_, err := New(routingpolicy.Named()[routingpolicy.PrefixAffinity], scheduling.DefaultConfig(), nil)
	assert.ErrorContains(t, err, "needs the affinity memory")
	_, err = New(routingpolicy.Named()[routingpolicy.MetricsBased], scheduling.Config{SheddableKVCacheThreshold: 2}, nil)
	assert.ErrorContains(t, err, "not between 0 and 1")
}
