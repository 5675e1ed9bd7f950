package clusterscore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// The named configurations' cases are clusterscoretest's, which the
// sidecar's ClusterPolicy is held to as well (policies_test.go); these are
// the helpers of the package's own tests.

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// backend is candidates with their rotation, as the sidecar's adapter
// passes them.
type backend struct {
	cands []Candidate
	rot   *Rotation
}

// newBackend is the candidates of these names, weighing 1 each, with
// their health.
func newBackend(names []string, health map[string]Health) *backend {
	b := &backend{}
	for _, n := range names {
		b.cands = append(b.cands, Candidate{Name: n, Weight: 1, Health: health[n]})
	}
	b.rot = NewRotation(b.cands)
	return b
}

func mustPipeline(t testing.TB, name string) *Pipeline {
	t.Helper()
	cfg, err := routingpolicy.Parse(name)
	require.NoError(t, err)
	p, err := New(cfg, scheduling.DefaultConfig(), NewMemory(DefaultMemoryOptions()))
	require.NoError(t, err)
	return p
}

func (b *backend) order(t testing.TB, p *Pipeline, req Request) ([]string, error) {
	t.Helper()
	idx, err := p.Pick(&req, b.cands, b.rot, nil, nil)
	out := []string{}
	for _, i := range idx {
		out = append(out, b.cands[i].Name)
	}
	return out, err
}

// TestLocalFirstShimLocalLeads: a shim pool's local EPP, one of the
// rotation (clusterscoretest's cases have it outside), still leads and is
// not tried twice.
func TestLocalFirstShimLocalLeads(t *testing.T) {
	p := mustPipeline(t, routingpolicy.LocalFirst)
	b := newBackend([]string{"local", "a"}, map[string]Health{"local": HealthServing, "a": HealthServing})
	b.cands[0].Local = true
	for range 4 {
		order, err := b.order(t, p, Request{})
		require.NoError(t, err)
		assert.Equal(t, []string{"local", "a"}, order)
	}
}
