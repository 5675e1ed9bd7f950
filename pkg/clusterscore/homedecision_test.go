package clusterscore

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDecideHome states home placement's lead decision as its table: each
// row is a request's situation and where the rule sends it.
func TestDecideHome(t *testing.T) {
	const home, second, spill, dealt = 0, 1, 2, 3
	to := func(i int) func() int { return func() int { return i } }
	never := func() int { panic("the rule asked where it should not have") }
	tests := []struct {
		name        string
		rule        homeRule
		wantOutcome HomeOutcome
		wantLead    int
	}{
		{
			name:        "a request without a full prompt block has no home: the picker leads",
			rule:        homeRule{deal: never, second: never, spill: never},
			wantOutcome: HomeNoKey, wantLead: -1,
		},
		{
			name:        "a key new to the sidecar is dealt by the rotation, even when its home would take it",
			rule:        homeRule{key: true, inFirstTier: true, withinBound: true, home: home, deal: to(dealt), second: never, spill: never},
			wantOutcome: HomeDealt, wantLead: dealt,
		},
		{
			name:        "a key new to the sidecar with no candidate within the bound keeps the score order",
			rule:        homeRule{key: true, deal: to(-1), second: never, spill: never, order: to(-1)},
			wantOutcome: HomeScoreOrder, wantLead: -1,
		},
		{
			name:        "a key new to the sidecar whose prefix a candidate's EPP reports holding goes to that candidate, not where the rotation would deal it",
			rule:        homeRule{key: true, reported: true, inFirstTier: true, withinBound: true, home: home, deal: never, second: never, spill: never},
			wantOutcome: HomeReported, wantLead: home,
		},
		{
			name:        "... as an established key's home: beyond its bound and waiting, to its second home",
			rule:        homeRule{key: true, reported: true, inFirstTier: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeSecond, wantLead: second,
		},
		{
			name:        "... and queued, to its second home, saying queued",
			rule:        homeRule{key: true, reported: true, inFirstTier: true, withinBound: true, queued: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeQueued, wantLead: second,
		},
		{
			name:        "an established key goes home while its home is in the first tier, within the bound and not queued",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, home: home, deal: never, second: never, spill: never},
			wantOutcome: HomeAtHome, wantLead: home,
		},
		{
			name:        "a home beyond its bound whose servers queue no more than the least queued candidate's keeps the request: a move saves no wait and costs a cold prefill",
			rule:        homeRule{key: true, established: true, inFirstTier: true, noWait: true, home: home, deal: never, second: never, spill: never},
			wantOutcome: HomeNoWait, wantLead: home,
		},
		{
			name:        "a home out of the first tier is left whatever its queue",
			rule:        homeRule{key: true, established: true, noWait: true, home: 5, deal: never, second: to(second), spill: never},
			wantOutcome: HomeSecond, wantLead: second,
		},
		{
			name:        "a home beyond its bound sends the request to its second home when that one takes it",
			rule:        homeRule{key: true, established: true, inFirstTier: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeSecond, wantLead: second,
		},
		{
			name:        "a home out of the first tier (saturated, stale) sends the request to its second home",
			rule:        homeRule{key: true, established: true, withinBound: true, home: 5, deal: never, second: to(second), spill: never},
			wantOutcome: HomeSecond, wantLead: second,
		},
		{
			name:        "a request its home and second home cannot take spills to the best scored candidate within the bound",
			rule:        homeRule{key: true, established: true, inFirstTier: true, home: home, deal: never, second: to(-1), spill: to(spill)},
			wantOutcome: HomeSpill, wantLead: spill,
		},
		{
			name:        "a request that nothing within the bound takes keeps the score order",
			rule:        homeRule{key: true, established: true, inFirstTier: true, home: home, deal: never, second: to(-1), spill: to(-1), order: to(-1)},
			wantOutcome: HomeScoreOrder, wantLead: -1,
		},
		{
			name:        "... led by the best scored candidate without a request overdue when the score order's first has one",
			rule:        homeRule{key: true, established: true, inFirstTier: true, home: home, deal: never, second: to(-1), spill: to(-1), order: to(spill)},
			wantOutcome: HomeScoreOrder, wantLead: spill,
		},
		{
			name:        "a home queued beyond the queue margin is left for its second home, whatever its bound, and says queued",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, queued: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeQueued, wantLead: second,
		},
		{
			name:        "a home with a request overdue for its first byte is left for its second home, whatever its bound and its scraped queue, and says overdue",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, noWait: true, overdue: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeOverdue, wantLead: second,
		},
		{
			name:        "a home whose batch is full while a request there waits past its average first byte is left for its second home, whatever its bound and queue, and says filled",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, noWait: true, filled: true, home: home, deal: never, second: to(second), spill: never},
			wantOutcome: HomeFilled, wantLead: second,
		},
		{
			name:        "a request whose conversation went elsewhere before follows it there when that cluster takes it, its home within its bound or not",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, home: home, deal: never, second: never, spill: never, follow: to(spill)},
			wantOutcome: HomeFollowed, wantLead: spill,
		},
		{
			name:        "a conversation opening at a home over its share goes to the cluster furthest below its own",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, overShare: true, home: home, deal: never, second: never, spill: never, split: to(second)},
			wantOutcome: HomeSplit, wantLead: second,
		},
		{
			name:        "a conversation opening at a home over its share stays home when no other cluster below its share takes it",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, overShare: true, home: home, deal: never, second: never, spill: never, split: to(-1)},
			wantOutcome: HomeAtHome, wantLead: home,
		},
		{
			name:        "a home over its share but within its bound is not left by a conversation's later turn",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, home: home, deal: never, second: never, spill: never, split: never},
			wantOutcome: HomeAtHome, wantLead: home,
		},
		{
			name:        "a filled home whose second home cannot take the request spills it, and says filled",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, filled: true, home: home, deal: never, second: to(-1), spill: to(spill)},
			wantOutcome: HomeFilled, wantLead: spill,
		},
		{
			name:        "a queued home whose second home cannot take the request spills it, and says queued",
			rule:        homeRule{key: true, established: true, inFirstTier: true, withinBound: true, queued: true, home: home, deal: never, second: to(-1), spill: to(spill)},
			wantOutcome: HomeQueued, wantLead: spill,
		},
	}
	seen := map[HomeOutcome]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Most rows are of a request no other cluster holds more of
			// than its home, opening no conversation at a home over its
			// share.
			if tt.rule.follow == nil {
				tt.rule.follow = to(-1)
			}
			if tt.rule.split == nil {
				tt.rule.split = to(-1)
			}
			outcome, lead := decideHome(tt.rule)
			assert.Equal(t, tt.wantOutcome, outcome, "outcome %s", outcome)
			assert.Equal(t, tt.wantLead, lead, "lead")
			seen[outcome] = true
		})
	}
	for _, o := range HomeOutcomes() {
		assert.True(t, seen[o], "the table has no row for %s", o)
	}
}

func TestHomeOutcomeNames(t *testing.T) {
	var names []string
	for _, o := range HomeOutcomes() {
		names = append(names, o.String())
	}
	assert.Equal(t, []string{"no_key", "dealt", "reported", "home", "followed", "split", "home_no_wait", "second_home", "queued", "overdue", "filled", "spill", "score_order"}, names)
	assert.Equal(t, "none", HomeNone.String())
	assert.Equal(t, "HomeOutcome(200)", HomeOutcome(200).String())
}
