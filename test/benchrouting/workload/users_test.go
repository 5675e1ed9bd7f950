package workload

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Populations split a workload by where its users enter: each has its
// share of the arrivals, its own conversations and prompts, and the whole
// is sent in time order.
func TestPopulationsHaveTheirOwnPrefixes(t *testing.T) {
	p := profile()
	p.Users = []Population{{Entry: "", Share: 0.4}, {Entry: "cluster-a", Share: 0.3}, {Entry: "cluster-c", Share: 0.3}}
	reqs, err := Generate(p)
	require.NoError(t, err)
	again, err := Generate(p)
	require.NoError(t, err)
	assert.Equal(t, reqs, again, "seeded")

	count := map[string]int{}
	systems := map[string]map[string]bool{}
	for i, r := range reqs {
		assert.Equal(t, i, r.Index)
		if i > 0 {
			assert.GreaterOrEqual(t, r.At, reqs[i-1].At, "in the order they are sent")
		}
		count[r.Entry]++
		first := strings.Fields(r.Messages[0].Content)[0]
		if r.Entry != "" {
			assert.True(t, strings.HasPrefix(first, r.Entry+"-"), "request %d of %s opens with %q", i, r.Entry, first)
		} else {
			assert.False(t, strings.HasPrefix(first, "cluster-"), "request %d of the first population opens with %q", i, first)
		}
		if r.Group >= 0 {
			if systems[r.Entry] == nil {
				systems[r.Entry] = map[string]bool{}
			}
			systems[r.Entry][r.Messages[0].Content] = true
		}
	}
	n := float64(len(reqs))
	assert.InDelta(t, 1200, n, 150, "the whole keeps the rate")
	assert.InDelta(t, 0.4, float64(count[""])/n, 0.05)
	assert.InDelta(t, 0.3, float64(count["cluster-a"])/n, 0.05)
	assert.InDelta(t, 0.3, float64(count["cluster-c"])/n, 0.05)
	// 4 groups: 0.4 x 4 and 0.3 x 4 round to 2 and 1.
	assert.Len(t, systems[""], 2)
	assert.Len(t, systems["cluster-a"], 1)
	assert.Len(t, systems["cluster-c"], 1)
	for s := range systems["cluster-a"] {
		assert.False(t, systems[""][s] || systems["cluster-c"][s], "a system prompt of two populations")
	}

	single, err := Generate(profile())
	require.NoError(t, err)
	for _, r := range single {
		assert.Empty(t, r.Entry, "no populations, no entry")
	}
}

// With shared system prompts, every population opens its conversations
// with the same groups' prompts, and its messages are its own.
func TestPopulationsMayShareTheirSystemPrompts(t *testing.T) {
	p := profile()
	p.Users = []Population{{Entry: "", Share: 0.4}, {Entry: "cluster-a", Share: 0.3}, {Entry: "cluster-c", Share: 0.3}}
	p.SharedSystemPrompts = true
	reqs, err := Generate(p)
	require.NoError(t, err)
	systems := map[string]map[string]bool{}
	for _, r := range reqs {
		if r.Group < 0 {
			continue
		}
		if systems[r.Entry] == nil {
			systems[r.Entry] = map[string]bool{}
		}
		systems[r.Entry][r.Messages[0].Content] = true
		if len(r.Messages) > 1 && r.Entry != "" {
			assert.True(t, strings.HasPrefix(r.Messages[1].Content, r.Entry+"-"), "its messages are its own")
		}
	}
	for _, entry := range []string{"", "cluster-a", "cluster-c"} {
		assert.Len(t, systems[entry], p.Groups, "%q draws from every group", entry)
		for s := range systems[entry] {
			assert.True(t, systems[""][s], "the same prompts")
		}
	}
}

func TestPopulationsAreValidated(t *testing.T) {
	for name, users := range map[string][]Population{
		"shares not summing to 1": {{Entry: "", Share: 0.5}, {Entry: "b", Share: 0.2}},
		"a share of 0":            {{Entry: "", Share: 1}, {Entry: "b", Share: 0}},
		"two in one place":        {{Entry: "b", Share: 0.5}, {Entry: "b", Share: 0.5}},
	} {
		t.Run(name, func(t *testing.T) {
			p := profile()
			p.Users = users
			_, err := Generate(p)
			assert.Error(t, err)
		})
	}
}
