package promptprefix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// Summary is a compact, bounded set of prompt blocks: a Bloom filter over
// their hashes, which an EPP publishes so that the routers of other
// clusters can tell which prefixes its servers likely hold, traffic they
// did not route themselves included. A block is never missed once added;
// another may be taken for held at the filter's false-positive rate
// (under 1% at summaryBitsPerBlock bits a block), which makes a prefix
// look cached where it is not, as the Index's collisions do.
//
// Its producer and consumer hash blocks the same way, with Blocks and the
// model the request names as the scope (ScopeOfModel), so that a block of
// one side is the same hash on the other.
//
// A Summary is immutable once built (or parsed) and safe for concurrent
// reads.
type Summary struct {
	// words is the filter's bits; its length is a power of two.
	words []uint64
	// blocks is how many blocks were added.
	blocks int
}

const (
	// summaryProbes is how many bits a block sets (k): the optimum for
	// summaryBitsPerBlock bits a block, which gives about 0.8% false
	// positives at a full filter.
	summaryProbes       = 7
	summaryBitsPerBlock = 10
	// summaryMinBits and MaxSummaryBits bound a filter's size; the
	// largest holds MaxSummaryBlocks blocks.
	summaryMinBits = 1 << 13
	// MaxSummaryBits is the largest filter: 32 KiB.
	MaxSummaryBits = 1 << 18
	// MaxSummaryBlocks is the most blocks a Summary is built from: a
	// producer with more sends its most recent ones.
	MaxSummaryBlocks = MaxSummaryBits / summaryBitsPerBlock
	// MaxSummaryBytes bounds an encoded Summary, which a consumer refuses
	// beyond.
	MaxSummaryBytes = summaryHeaderBytes + MaxSummaryBits/8
)

// maxSummaryFill is the share of a filter's bits, in percent, that no
// summary NewSummary sized has set (1 - e^(-probes/bits a block) = 50%
// when full).
const maxSummaryFill = 60

// summaryMagic opens an encoded Summary, its version in the last byte.
var summaryMagic = [4]byte{'m', 'c', 'i', 1}

// summaryHeaderBytes: the magic, the probes (1 byte), log2 of the bits (1
// byte), 2 bytes reserved (zero), the block count (4 bytes).
const summaryHeaderBytes = 12

// SummaryContentType is the media type of an encoded Summary, which a
// consumer asks for (Accept) and checks in the answer.
const SummaryContentType = "application/vnd.mci.prompt-prefix-summary"

// ScopeOfModel is the scope that a Summary's blocks are hashed with: the
// model the request names, as its body names it. Both sides know it; a
// model server caches each model's (and adapter's) prefixes apart.
func ScopeOfModel(model string) string { return "model:" + model }

// NewSummary returns an empty Summary sized for n blocks (at most
// MaxSummaryBlocks count towards its size).
func NewSummary(n int) *Summary {
	m := summaryMinBits
	for m < MaxSummaryBits && m < n*summaryBitsPerBlock {
		m <<= 1
	}
	return &Summary{words: make([]uint64, m/64)}
}

// Add adds a block hash. Only a Summary not yet shared may be added to.
func (s *Summary) Add(block uint64) {
	mask := uint64(len(s.words)*64 - 1)
	h1, h2 := block, block>>32|1 // h2 odd: its probes visit distinct bits
	for i := uint64(0); i < summaryProbes; i++ {
		b := (h1 + i*h2) & mask
		s.words[b/64] |= 1 << (b % 64)
	}
	s.blocks++
}

// Has reports whether the block is (likely) in the summary.
func (s *Summary) Has(block uint64) bool {
	mask := uint64(len(s.words)*64 - 1)
	h1, h2 := block, block>>32|1
	for i := uint64(0); i < summaryProbes; i++ {
		b := (h1 + i*h2) & mask
		if s.words[b/64]&(1<<(b%64)) == 0 {
			return false
		}
	}
	return true
}

// Held is how many leading blocks of a prompt (Blocks) the summary holds:
// its longest held prefix. Each block's hash stands for the whole prefix
// up to it, so the blocks held are a leading run and a binary search finds
// its end in a few probes rather than one a block.
func (s *Summary) Held(blocks []uint64) int {
	// Most summaries a router asks do not hold a given prompt at all:
	// its first block settles that in a probe or two.
	if s == nil || s.blocks == 0 || len(blocks) == 0 || !s.Has(blocks[0]) {
		return 0
	}
	lo, hi := 1, len(blocks) // blocks[:lo] held; blocks[hi:] not
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.Has(blocks[mid]) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Blocks is how many blocks were added.
func (s *Summary) Blocks() int { return s.blocks }

// Bytes is the size of the summary encoded.
func (s *Summary) Bytes() int { return summaryHeaderBytes + len(s.words)*8 }

// AppendBinary appends the encoded summary to b: the header
// (summaryHeaderBytes), then the filter's words, little-endian.
func (s *Summary) AppendBinary(b []byte) ([]byte, error) {
	b = s.appendHeader(b, summaryMagic)
	for _, w := range s.words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b, nil
}

// appendHeader appends the summary's header (summaryHeaderBytes), which
// a summary and a delta open with, each with its magic.
func (s *Summary) appendHeader(b []byte, magic [4]byte) []byte {
	b = append(b, magic[:]...)
	b = append(b, summaryProbes, byte(bits.TrailingZeros(uint(len(s.words)*64))), 0, 0)
	return binary.LittleEndian.AppendUint32(b, uint32(min(s.blocks, math.MaxUint32)))
}

// ErrBadSummary wraps the reasons an encoded summary is refused.
var ErrBadSummary = errors.New("not a prompt prefix summary")

// ParseSummary reads an encoded summary, checking every field: a summary
// comes from another cluster's EPP, untrusted.
func ParseSummary(data []byte) (*Summary, error) {
	logBits, err := readHeader(data, summaryMagic, summaryHeaderBytes)
	if err != nil {
		return nil, err
	}
	words := 1 << logBits / 64
	if len(data) != summaryHeaderBytes+8*words {
		return nil, fmt.Errorf("%w: %d bytes for 2^%d bits", ErrBadSummary, len(data), logBits)
	}
	s := &Summary{words: make([]uint64, words), blocks: int(binary.LittleEndian.Uint32(data[8:12]))}
	for i := range s.words {
		s.words[i] = binary.LittleEndian.Uint64(data[summaryHeaderBytes+8*i:])
	}
	if err := s.checkFill(); err != nil {
		return nil, err
	}
	return s, nil
}

// readHeader checks the header that an encoded summary or delta opens
// with (its magic), the encoding at least minLen bytes long, and returns
// log2 of its bits.
func readHeader(data []byte, magic [4]byte, minLen int) (logBits int, err error) {
	switch {
	case len(data) < minLen:
		return 0, fmt.Errorf("%w: %d bytes", ErrBadSummary, len(data))
	case len(data) > MaxSummaryBytes:
		return 0, fmt.Errorf("%w: %d bytes, beyond %d", ErrBadSummary, len(data), MaxSummaryBytes)
	case [4]byte(data[:4]) != magic:
		return 0, fmt.Errorf("%w: it opens with %q, not %q", ErrBadSummary, data[:4], magic[:])
	case data[4] != summaryProbes:
		return 0, fmt.Errorf("%w: %d probes a block, not %d", ErrBadSummary, data[4], summaryProbes)
	case data[6] != 0 || data[7] != 0:
		return 0, fmt.Errorf("%w: reserved bytes set", ErrBadSummary)
	}
	logBits = int(data[5])
	if logBits < bits.TrailingZeros(summaryMinBits) || logBits > bits.TrailingZeros(MaxSummaryBits) {
		return 0, fmt.Errorf("%w: 2^%d bits", ErrBadSummary, logBits)
	}
	return logBits, nil
}

// checkFill refuses a summary with more of its bits set than a full one
// has. A filter built as NewSummary sizes it (at least
// summaryBitsPerBlock bits a block) has about half its bits set when full.
// One with many more claims nearly every prompt: an EPP that sent it would
// draw every new prompt to itself.
func (s *Summary) checkFill() error {
	set := 0
	for _, w := range s.words {
		set += bits.OnesCount64(w)
	}
	if set > len(s.words)*64*maxSummaryFill/100 {
		return fmt.Errorf("%w: %d%% of its bits set, beyond the %d%% of a full summary", ErrBadSummary, set*100/(len(s.words)*64), maxSummaryFill)
	}
	return nil
}

// Rescoped appends to dst the blocks of a prompt hashed under one scope
// (Blocks), moved to another: each hashed again with the scope's hash.
// Each still stands for its whole prefix, under both scopes, and is never
// 0. A router that hashed a prompt once under the model's scope, to match
// the EPPs' summaries, keeps its own index under the pool's without
// hashing the prompt again.
func Rescoped(dst, blocks []uint64, scope string) []uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[8:], xxhash.Sum64String(scope))
	for _, h := range blocks {
		binary.LittleEndian.PutUint64(b[:8], h)
		dst = append(dst, max(xxhash.Sum64(b[:]), 1))
	}
	return dst
}

// Summary is the index's most recently recorded blocks, at most max (and
// at most MaxSummaryBlocks), whichever clusters or servers hold them: what
// an EPP's servers likely hold, as one set. It reads every entry under its
// shard's lock, a few milliseconds for the largest index; a producer
// builds it at most once an interval, not per request.
func (x *Index) Summary(limit int) *Summary {
	limit = min(max(limit, 0), MaxSummaryBlocks)
	perShard := uint32(limit / indexShards)
	var keys []uint64
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for j := range sh.entries {
			// The clock moves once for each block recorded, so the entries
			// used within the last perShard ticks are the shard's most
			// recent, and there are at most perShard of them.
			if e := &sh.entries[j]; e.key != 0 && sh.clock-e.used < perShard {
				keys = append(keys, e.key)
			}
		}
		sh.mu.RUnlock()
	}
	s := NewSummary(len(keys))
	for _, k := range keys {
		s.Add(k)
	}
	return s
}
