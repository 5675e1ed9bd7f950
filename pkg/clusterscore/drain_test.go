package clusterscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mci-dev/mci/pkg/routingpolicy"
	"github.com/mci-dev/mci/pkg/scheduling"
)

// A draining cluster takes no new request under any named configuration,
// however idle it is; it keeps the requests of the sessions pinned to it
// and of the prompts it holds, and takes requests when every cluster
// drains rather than leave them with none.
func TestADrainingClusterTakesOnlyWhatItHolds(t *testing.T) {
	prompt := []uint64{11, 12, 13, 14}
	for name, cfg := range routingpolicy.Named() {
		if name == routingpolicy.LocalFirst {
			continue // the local pool leads whatever the others are
		}
		t.Run(name, func(t *testing.T) {
			mem := NewMemory(DefaultMemoryOptions())
			p, err := New(cfg, scheduling.DefaultConfig(), mem)
			require.NoError(t, err)
			cands := []Candidate{
				{Name: "a", Weight: 1, Health: HealthServing, Pool: freshPool(0, 0.1), Draining: true},
				{Name: "b", Weight: 1, Health: HealthServing, Pool: freshPool(3, 0.5)},
			}
			rot := NewRotation(cands)
			pick := func(req Request) []int {
				req.Now, req.Scope, req.Criticality = epoch, scope, scheduling.Standard
				order, err := p.Pick(&req, cands, rot, nil, nil)
				require.NoError(t, err)
				return order
			}
			for range 4 {
				assert.Equal(t, []int{1}, pick(Request{}), "a new request never goes to the draining cluster")
				assert.Equal(t, []int{1}, pick(Request{Session: "new", Blocks: []uint64{21, 22}}), "nor a new session's or prompt's")
			}

			mem.Sessions.Pin(scope, "s1", "a", epoch)
			assert.Contains(t, pick(Request{Session: "s1"}), 0, "a session pinned to the draining cluster may stay there")

			mem.Served(&Request{Scope: scope, Blocks: prompt, Now: epoch}, "a")
			assert.Contains(t, pick(Request{Blocks: append(prompt, 15)}), 0, "a conversation the draining cluster holds may stay there")
			assert.Equal(t, []int{1}, pick(Request{Blocks: []uint64{11, 31, 32, 33}}), "a prompt sharing only its first block goes elsewhere")

			cands[1].Draining = true
			assert.ElementsMatch(t, []int{0, 1}, pick(Request{}), "when every cluster drains, they still take requests")
		})
	}
}
