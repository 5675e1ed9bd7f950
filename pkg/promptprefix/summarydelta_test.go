package promptprefix

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordRandom records n random blocks in x, as routed prompts leave them.
func recordRandom(x *Index, r *rand.Rand, n int) {
	for i := range n {
		x.Record([]uint64{max(r.Uint64(), 1)}, ClusterID(string(rune('a'+i%3))))
	}
}

// summarizedTwice is the summaries of limit blocks of an index of held
// random blocks, and of the same index once added more were recorded.
func summarizedTwice(r *rand.Rand, held, added, limit int) (before, after *Summary) {
	x := NewIndex(1 << 16)
	recordRandom(x, r, held)
	before = x.Summary(limit)
	recordRandom(x, r, added)
	return before, x.Summary(limit)
}

// TestASummaryDeltaMakesTheNextSummaryFromTheLast: an EPP's summary built
// again after a few seconds of new blocks, its oldest ones dropped, goes
// to a consumer that holds the last one as the bits that flipped, a
// fraction of the filter, and makes exactly the summary sent whole.
func TestASummaryDeltaMakesTheNextSummaryFromTheLast(t *testing.T) {
	for _, tt := range []struct {
		name          string
		held, limit   int
		added         int
		smallerByHalf bool
	}{
		{"a summary that grows", 1500, MaxSummaryBlocks, 100, true},
		{"a summary at its bound, its oldest blocks dropped", 20000, 2000, 100, true},
		{"a summary of the largest size at its bound", 40000, MaxSummaryBlocks, 1000, true},
		{"unchanged", 1000, MaxSummaryBlocks, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base, next := summarizedTwice(rand.New(rand.NewPCG(5, 6)), tt.held, tt.added, tt.limit)
			require.Equal(t, base.Bytes(), next.Bytes(), "the same size")

			delta, ok := next.AppendDelta(nil, base)
			require.True(t, ok)
			if tt.smallerByHalf {
				assert.Less(t, len(delta), next.Bytes()/2, "%d bytes for %d added blocks, against %d whole", len(delta), tt.added, next.Bytes())
			}
			baseEncoded, err := base.AppendBinary(nil)
			require.NoError(t, err)

			made, err := ApplyDelta(base, delta)
			require.NoError(t, err)
			want, err := next.AppendBinary(nil)
			require.NoError(t, err)
			got, err := made.AppendBinary(nil)
			require.NoError(t, err)
			assert.Equal(t, want, got)
			assert.Equal(t, next.Digest(), made.Digest())
			again, err := base.AppendBinary(nil)
			require.NoError(t, err)
			assert.Equal(t, baseEncoded, again, "the base is left as it was")
		})
	}
}

// TestASummaryIsSentWholeWhereADeltaWouldNotBeSmaller: another size, or
// most bits flipped.
func TestASummaryIsSentWholeWhereADeltaWouldNotBeSmaller(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	small, large := summarizedTwice(r, 500, 5000, MaxSummaryBlocks)
	require.NotEqual(t, small.Bytes(), large.Bytes())
	_, ok := large.AppendDelta(nil, small)
	assert.False(t, ok, "another size")
	_, ok = large.AppendDelta(nil, nil)
	assert.False(t, ok, "no base")

	other, _ := summarizedTwice(r, 5000, 0, MaxSummaryBlocks)
	require.Equal(t, large.Bytes(), other.Bytes())
	b, ok := other.AppendDelta([]byte("kept"), large)
	assert.False(t, ok, "two summaries of nothing in common")
	assert.Equal(t, []byte("kept"), b, "nothing appended")
}

// TestApplyDeltaRefusesWhatDoesNotApply: a delta is another cluster's
// EPP's answer, and applies only to the summary it was made from.
func TestApplyDeltaRefusesWhatDoesNotApply(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	base, next := summarizedTwice(r, 1000, 50, MaxSummaryBlocks)
	good, ok := next.AppendDelta(nil, base)
	require.True(t, ok)
	_, err := ApplyDelta(base, good)
	require.NoError(t, err)

	anotherBase, _ := summarizedTwice(r, 1000, 0, MaxSummaryBlocks)
	require.Equal(t, base.Bytes(), anotherBase.Bytes())
	smaller := NewSummary(1)

	// A summary of 8,192 bits, 55% of them set, and a delta to 65%, whose
	// digests are right: a full summary has about half its bits set.
	dense := &Summary{words: make([]uint64, summaryMinBits/64), blocks: 1000}
	for b := 0; b < summaryMinBits*55/100; b++ {
		dense.words[b/64] |= 1 << (b % 64)
	}
	denser := &Summary{words: append([]uint64(nil), dense.words...), blocks: 1200}
	for b := summaryMinBits * 55 / 100; b < summaryMinBits*65/100; b++ {
		denser.words[b/64] |= 1 << (b % 64)
	}
	overfilling, ok := denser.AppendDelta(nil, dense)
	require.True(t, ok)

	change := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, tt := range map[string]struct {
		base *Summary
		data []byte
	}{
		"no base":                     {nil, good},
		"empty":                       {base, nil},
		"a header cut short":          {base, good[:summaryDeltaHeaderBytes-1]},
		"a summary sent whole":        {base, must(next.AppendBinary(nil))},
		"another version":             {base, change(func(b []byte) []byte { b[3] = 2; return b })},
		"other probes":                {base, change(func(b []byte) []byte { b[4] = 3; return b })},
		"reserved bytes set":          {base, change(func(b []byte) []byte { b[7] = 1; return b })},
		"another size":                {smaller, good},
		"another base":                {anotherBase, good},
		"a flip cut short":            {base, good[:len(good)-1]},
		"a byte too many":             {base, append(append([]byte(nil), good...), 0)},
		"more flips listed than sent": {base, change(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[28:], 1<<20); return b })},
		"fewer flips listed than sent": {base, change(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[28:], binary.LittleEndian.Uint32(b[28:])-1)
			return b
		})},
		"a flip past the end": {base, change(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[28:], binary.LittleEndian.Uint32(b[28:])+1)
			return binary.AppendUvarint(b, uint64(len(base.words)*64))
		})},
		"another summary made":   {base, change(func(b []byte) []byte { b[20]++; return b })},
		"another block count":    {base, change(func(b []byte) []byte { b[8]++; return b })},
		"beyond the size bound":  {base, make([]byte, MaxSummaryBytes+1)},
		"a summary overfilled":   {dense, overfilling},
		"a delta from the dense": {base, overfilling},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := ApplyDelta(tt.base, tt.data)
			assert.ErrorIs(t, err, ErrBadSummary)
			assert.Nil(t, s)
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func FuzzApplyDelta(f *testing.F) {
	r := rand.New(rand.NewPCG(11, 12))
	x := NewIndex(1 << 14)
	recordRandom(x, r, 300)
	base := x.Summary(MaxSummaryBlocks)
	recordRandom(x, r, 20)
	good, _ := x.Summary(MaxSummaryBlocks).AppendDelta(nil, base)
	f.Add(good)
	f.Add([]byte("mcd\x01\x07\x0d\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ApplyDelta(base, data)
		if err != nil {
			return
		}
		if s.Digest() != binary.LittleEndian.Uint64(data[20:28]) {
			t.Fatal("a delta applied that does not make the summary it names")
		}
		if _, err := ParseSummary(must(s.AppendBinary(nil))); err != nil {
			t.Fatalf("a delta made a summary that is refused sent whole: %v", err)
		}
	})
}
