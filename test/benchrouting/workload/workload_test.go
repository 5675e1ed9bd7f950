package workload

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func profile() Profile {
	return Profile{
		Seed: 7, Duration: time.Minute, Rate: 20,
		Groups: 4, SystemTokens: 300, ActiveConversations: 20, Turns: 6, UserTokens: 30, OutputTokens: 20,
		OneShotShare: 0.2, OneShotTokens: 200,
	}
}

func TestGenerateIsSeeded(t *testing.T) {
	a, err := Generate(profile())
	require.NoError(t, err)
	b, err := Generate(profile())
	require.NoError(t, err)
	assert.Equal(t, a, b, "the same profile, the same requests")
	p := profile()
	p.Seed = 8
	c, err := Generate(p)
	require.NoError(t, err)
	assert.NotEqual(t, a, c)
}

func TestGenerateShape(t *testing.T) {
	reqs, err := Generate(profile())
	require.NoError(t, err)
	// Poisson arrivals: 1200 expected, standard deviation about 35.
	assert.InDelta(t, 1200, len(reqs), 150)
	oneShots := 0
	last := map[int]Request{}
	systems := map[int]string{}
	for i, r := range reqs {
		assert.Equal(t, i, r.Index)
		if i > 0 {
			assert.GreaterOrEqual(t, r.At, reqs[i-1].At, "sent in order")
		}
		assert.Less(t, r.At, time.Minute)
		assert.Equal(t, 20, r.MaxTokens)
		if r.Conversation < 0 {
			oneShots++
			assert.Len(t, r.Messages, 1)
			assert.Equal(t, 200, r.PromptTokens())
			continue
		}
		require.Equal(t, "system", r.Messages[0].Role)
		if s, ok := systems[r.Group]; ok {
			assert.Equal(t, s, r.Messages[0].Content, "a group shares its system prompt")
		}
		systems[r.Group] = r.Messages[0].Content
		assert.Equal(t, "user", r.Messages[len(r.Messages)-1].Role)
		assert.LessOrEqual(t, r.Turn, 6)
		assert.Len(t, r.Messages, 2*r.Turn)
		assert.Equal(t, 300+30*r.Turn+20*(r.Turn-1), r.PromptTokens())
		if prev, ok := last[r.Conversation]; ok {
			assert.Equal(t, prev.Turn+1, r.Turn)
			assert.Equal(t, prev.Messages, r.Messages[:len(prev.Messages)], "a turn resends the history")
			assert.Equal(t, "assistant", r.Messages[len(prev.Messages)].Role)
		} else {
			assert.Equal(t, 1, r.Turn, "a conversation starts at turn 1")
		}
		last[r.Conversation] = r
	}
	assert.InDelta(t, 0.2, float64(oneShots)/float64(len(reqs)), 0.05)
	assert.Len(t, systems, 4)
	assert.NotEqual(t, systems[0], systems[1])
}

func TestNoSharedPrefixes(t *testing.T) {
	p := profile()
	p.OneShotShare = 1
	reqs, err := Generate(p)
	require.NoError(t, err)
	firstWords := map[string]bool{}
	for _, r := range reqs {
		require.Equal(t, -1, r.Conversation)
		w := strings.Fields(r.Messages[0].Content)[0]
		assert.False(t, firstWords[w], "requests share no prefix")
		firstWords[w] = true
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Profile)
		want   string
	}{
		{"no duration", func(p *Profile) { p.Duration = 0 }, "duration"},
		{"no rate", func(p *Profile) { p.Rate = 0 }, "rate"},
		{"NaN rate", func(p *Profile) { p.Rate = math.NaN() }, "rate"},
		{"share above 1", func(p *Profile) { p.OneShotShare = 1.5 }, "one-shot share"},
		{"no groups", func(p *Profile) { p.Groups = 0 }, "groups 0"},
		{"no output", func(p *Profile) { p.OutputTokens = 0 }, "output tokens"},
		{"too many requests", func(p *Profile) { p.Rate = 9000; p.Duration = time.Hour }, "a million"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := profile()
			tt.change(&p)
			_, err := Generate(p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("one-shot only needs no conversations", func(t *testing.T) {
		_, err := Generate(Profile{Seed: 1, Duration: time.Second, Rate: 5, OneShotShare: 1, OneShotTokens: 10, OutputTokens: 4})
		assert.NoError(t, err)
	})
}

func TestCapacity(t *testing.T) {
	reqs := []Request{
		{Messages: []Message{{Content: strings.Repeat("w ", 100)}}, MaxTokens: 11},
		{Messages: []Message{{Content: strings.Repeat("w ", 300)}}, MaxTokens: 11},
	}
	c := Cost{Base: 10 * time.Millisecond, PrefillPerToken: time.Millisecond, DecodePerToken: 5 * time.Millisecond}
	// Mean: 10 + 200 + 50 = 260 ms.
	assert.Equal(t, 260*time.Millisecond, ServiceTime(reqs, c))
	assert.InDelta(t, 8/0.26, Capacity(reqs, c, 8), 1e-9)
	assert.Zero(t, Capacity(nil, c, 8))
	assert.Zero(t, Capacity(reqs, Cost{}, 8))

	p, capacity, err := Calibrate(profile(), c, 12, 0.7)
	require.NoError(t, err)
	got, err := Generate(p)
	require.NoError(t, err)
	assert.InDelta(t, 0.7, p.Rate/Capacity(got, c, 12), 0.05, "the rate loads the capacity to 70%%")
	assert.InDelta(t, capacity, Capacity(got, c, 12), capacity*0.05)
	_, _, err = Calibrate(profile(), c, 12, 0)
	assert.Error(t, err)
	_, _, err = Calibrate(profile(), c, 12, 2.5)
	assert.Error(t, err, "more than twice the capacity")

	p, _, err = Calibrate(profile(), c, 12, 1.2)
	require.NoError(t, err, "past saturation")
	got, err = Generate(p)
	require.NoError(t, err)
	assert.InDelta(t, 1.2, p.Rate/Capacity(got, c, 12), 0.06, "the rate passes the capacity by 20%%")
}

// saltedPair generates a small profile's requests without a salt and
// with the one salt sets, arrival for arrival.
func saltedPair(t *testing.T, salt func(*Profile)) (a, b []Request) {
	t.Helper()
	p := Profile{Seed: 3, Duration: 5 * time.Second, Rate: 20, Groups: 2, SystemTokens: 50, ActiveConversations: 3, Turns: 3,
		UserTokens: 5, OutputTokens: 4, OneShotShare: 0.5, OneShotTokens: 20}
	a, err := Generate(p)
	require.NoError(t, err)
	salt(&p)
	b, err = Generate(p)
	require.NoError(t, err)
	require.Equal(t, len(a), len(b))
	for i := range a {
		assert.Equal(t, a[i].At, b[i].At)
		assert.Equal(t, a[i].Group, b[i].Group)
		require.Len(t, b[i].Messages, len(a[i].Messages))
	}
	return a, b
}

// differs asserts that message m of request i of a and b has other text
// of as many words, in the same role.
func differs(t *testing.T, a, b []Request, i, m int) {
	t.Helper()
	x, y := a[i].Messages[m], b[i].Messages[m]
	assert.Equal(t, x.Role, y.Role)
	assert.NotEqual(t, x.Content[:8], y.Content[:8], "request %d, message %d", i, m)
	assert.Equal(t, len(strings.Fields(x.Content)), len(strings.Fields(y.Content)))
}

// A salt makes the one-shot requests of two runs share nothing, and
// changes nothing else: arrivals, conversations and lengths.
func TestOneShotSalt(t *testing.T) {
	a, b := saltedPair(t, func(p *Profile) { p.OneShotSalt = "r2-" })
	oneShots := 0
	for i := range a {
		if a[i].Conversation >= 0 {
			assert.Equal(t, a[i].Messages, b[i].Messages, "request %d: a conversation's turn", i)
			continue
		}
		oneShots++
		differs(t, a, b, i, 0)
	}
	assert.Positive(t, oneShots)
}

// A conversation salt makes two runs' conversations share nothing but
// their groups' system prompts, and changes nothing else.
func TestConversationSalt(t *testing.T) {
	a, b := saltedPair(t, func(p *Profile) { p.ConversationSalt = "r2-" })
	turns := 0
	for i := range a {
		if a[i].Conversation < 0 {
			assert.Equal(t, a[i].Messages, b[i].Messages, "request %d: a one-shot request", i)
			continue
		}
		turns++
		assert.Equal(t, a[i].Messages[0], b[i].Messages[0], "request %d: the group's system prompt", i)
		for m := 1; m < len(a[i].Messages); m++ {
			differs(t, a, b, i, m)
		}
	}
	assert.Positive(t, turns)
}

func TestWordsCountsAsFields(t *testing.T) {
	for _, s := range []string{"", " ", "one", " two  words ", "tabs\tand\nnewlines\u00a0and a no-break space", "sys0-0 sys0-1 sys0-2", "ünï cödé"} {
		assert.Equal(t, len(strings.Fields(s)), words(s), "%q", s)
	}
	assert.Equal(t, "p0 p1 p2", text("p", 3))
	assert.Empty(t, text("p", 0))
}
