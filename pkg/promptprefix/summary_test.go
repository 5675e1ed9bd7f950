package promptprefix

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestASummaryHoldsWhatWasAddedAndSaysHowLongAPrefix(t *testing.T) {
	held := chatBody(t, text("You are a helpful assistant.", 3000), text("What is", 1000))
	other := chatBody(t, text("You are a terse assistant.", 3000), text("What is", 1000))
	heldBlocks, err := Blocks(nil, ScopeOfModel("llm"), held)
	require.NoError(t, err)
	s := NewSummary(len(heldBlocks))
	for _, b := range heldBlocks {
		s.Add(b)
	}
	encoded, err := s.AppendBinary(nil)
	require.NoError(t, err)
	assert.Equal(t, s.Bytes(), len(encoded))
	parsed, err := ParseSummary(encoded)
	require.NoError(t, err)
	assert.Equal(t, len(heldBlocks), parsed.Blocks())

	for _, c := range []struct {
		name  string
		body  []byte
		model string
		want  int
	}{
		{"the prompt added", held, "llm", len(heldBlocks)},
		// The same system prompt, another question: the shared leading
		// blocks.
		{"a longer prompt of the same opening", chatBody(t, text("You are a helpful assistant.", 3000), text("Tell me", 5000)), "llm", 3000 / BlockBytes},
		{"another opening", other, "llm", 0},
		// Another model's prefix cache is another cache.
		{"the same prompt for another model", held, "llm-2", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			blocks, err := Blocks(nil, ScopeOfModel(c.model), c.body)
			require.NoError(t, err)
			// The false positives of a filter this empty are about none;
			// the shared opening may end a block later, where its last
			// block straddles the two prompts.
			got := parsed.Held(blocks)
			assert.GreaterOrEqual(t, got, c.want)
			assert.LessOrEqual(t, got, c.want+1)
		})
	}
	assert.Zero(t, (*Summary)(nil).Held(heldBlocks), "no summary holds nothing")
}

// TestASummaryFalsePositivesStayUnderOnePercentWhenFull: the rate the
// producer's size bound is chosen for.
func TestASummaryFalsePositivesStayUnderOnePercentWhenFull(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := NewSummary(MaxSummaryBlocks)
	for range MaxSummaryBlocks {
		s.Add(max(r.Uint64(), 1))
	}
	assert.Equal(t, MaxSummaryBytes, s.Bytes())
	encoded, err := s.AppendBinary(nil)
	require.NoError(t, err)
	_, err = ParseSummary(encoded)
	require.NoError(t, err, "a full summary is read")
	falsePositives := 0
	const probes = 200_000
	for range probes {
		if s.Has(max(r.Uint64(), 1)) {
			falsePositives++
		}
	}
	assert.Less(t, float64(falsePositives)/probes, 0.01)
}

func TestASummarySizesToItsBlocks(t *testing.T) {
	assert.Equal(t, summaryHeaderBytes+summaryMinBits/8, NewSummary(0).Bytes(), "the smallest filter")
	assert.Equal(t, summaryHeaderBytes+(1<<15)/8, NewSummary(2000).Bytes(), "10 bits a block, rounded up to a power of two")
	assert.Equal(t, MaxSummaryBytes, NewSummary(10*MaxSummaryBlocks).Bytes(), "never beyond the largest")
}

// TestParseSummaryRefusesWhatIsNotOne: a summary is another cluster's
// EPP's answer.
func TestParseSummaryRefusesWhatIsNotOne(t *testing.T) {
	good, err := NewSummary(100).AppendBinary(nil)
	require.NoError(t, err)
	change := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, data := range map[string][]byte{
		"empty":                   nil,
		"a header cut short":      good[:summaryHeaderBytes-1],
		"Prometheus text":         []byte("# HELP inference_pool_average_queue_size\n"),
		"another version":         change(func(b []byte) []byte { b[3] = 2; return b }),
		"other probes":            change(func(b []byte) []byte { b[4] = 3; return b }),
		"reserved bytes set":      change(func(b []byte) []byte { b[6] = 1; return b }),
		"too few bits":            change(func(b []byte) []byte { b[5] = 12; return b }),
		"too many bits":           change(func(b []byte) []byte { b[5] = 19; return b }),
		"bits the words disagree": change(func(b []byte) []byte { b[5]++; return b }),
		"a word cut short":        good[:len(good)-1],
		"a word too many":         append(append([]byte(nil), good...), make([]byte, 8)...),
		"beyond the size bound":   make([]byte, MaxSummaryBytes+1),
		// An EPP that claims every prompt would draw every new one.
		"every bit set": change(func(b []byte) []byte {
			for i := summaryHeaderBytes; i < len(b); i++ {
				b[i] = 0xff
			}
			return b
		}),
	} {
		t.Run(name, func(t *testing.T) {
			s, err := ParseSummary(data)
			assert.ErrorIs(t, err, ErrBadSummary)
			assert.Nil(t, s)
		})
	}
}

func FuzzParseSummary(f *testing.F) {
	good, _ := NewSummary(100).AppendBinary(nil)
	f.Add(good)
	f.Add([]byte("mci\x01\x07\x0d\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSummary(data)
		if err != nil {
			return
		}
		again, err := s.AppendBinary(nil)
		if err != nil || string(again) != string(data) {
			t.Fatalf("a summary parsed does not encode as it came: %v", err)
		}
		s.Held([]uint64{1, 2, 3})
	})
}

// TestAnIndexSummarizesItsMostRecentBlocks: a producer with more blocks
// than it may send sends those recorded last.
func TestAnIndexSummarizesItsMostRecentBlocks(t *testing.T) {
	x := NewIndex(1 << 14)
	r := rand.New(rand.NewPCG(3, 4))
	var old, recent []uint64
	for i := range 4000 {
		b := max(r.Uint64(), 1) // as Blocks' hashes: uniform, never 0
		if i < 2000 {
			old = append(old, b)
		} else {
			recent = append(recent, b)
		}
		x.Record([]uint64{b}, ClusterID(string(rune('a'+i%3))))
	}
	s := x.Summary(2000)
	assert.LessOrEqual(t, s.Blocks(), 2000)
	heldRecent, heldOld := 0, 0
	for _, b := range recent {
		if s.Has(b) {
			heldRecent++
		}
	}
	for _, b := range old {
		if s.Has(b) {
			heldOld++
		}
	}
	// Each shard keeps its share of the limit: the shards' blocks are not
	// spread evenly, so a few of the most recent fall out and a few of the
	// older stay in.
	assert.Greater(t, heldRecent, 1800, "the most recent blocks")
	assert.Less(t, heldOld, 200, "the older blocks")

	all := x.Summary(MaxSummaryBlocks)
	assert.Equal(t, 4000, all.Blocks())
	for _, b := range append(old, recent...) {
		require.True(t, all.Has(b))
	}
}

// TestRescopedBlocksKeepTheirPrefixesApartByScope: one hashing of the
// prompt serves the summaries' scope and the router's own.
func TestRescopedBlocksKeepTheirPrefixesApartByScope(t *testing.T) {
	a := chatBody(t, text("You are a helpful assistant.", 3000), text("What is", 1000))
	b := chatBody(t, text("You are a helpful assistant.", 3000), text("Tell me", 1000))
	byModelA, err := Blocks(nil, ScopeOfModel("llm"), a)
	require.NoError(t, err)
	byModelB, err := Blocks(nil, ScopeOfModel("llm"), b)
	require.NoError(t, err)
	poolA, poolB := Rescoped(nil, byModelA, "ns/llm"), Rescoped(nil, byModelB, "ns/llm")
	require.Len(t, poolA, len(byModelA))
	shared := 3000 / BlockBytes
	assert.Equal(t, poolA[:shared], poolB[:shared], "a shared prefix stays shared")
	assert.NotEqual(t, poolA[shared+1], poolB[shared+1], "and apart where the prompts part")
	other := Rescoped(nil, byModelA, "ns/llm-2")
	for i := range poolA {
		assert.NotEqual(t, poolA[i], other[i], "another pool's block %d", i)
		assert.NotEqual(t, byModelA[i], poolA[i], "the model's scope's block %d", i)
		assert.NotZero(t, poolA[i])
	}
	assert.Equal(t, poolA, Rescoped(nil, byModelA, "ns/llm"), "the same each time")
}
