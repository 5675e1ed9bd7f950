package promptprefix

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// A summary delta says how a summary differs from an earlier one of the
// same size: the positions of the bits that differ. An EPP's summary is
// built anew from its most recent blocks, so between two asks a few
// seconds apart most of its bits stay: a consumer that holds the earlier
// summary is sent the bits that flipped, a few bytes each, instead of the
// whole filter again. The delta names both summaries by their digest, so
// that it applies only to the base it was made from, and the summary it
// makes is checked whole, as a summary sent whole is.

// SummaryDeltaContentType is the media type of an encoded summary delta.
// A consumer that holds a summary lists it in Accept after
// SummaryContentType; a producer that holds the consumer's summary (its
// ETag in If-None-Match) may answer with a delta instead of the summary.
const SummaryDeltaContentType = "application/vnd.mci.prompt-prefix-summary-delta"

// summaryDeltaMagic opens an encoded delta, its version in the last byte.
var summaryDeltaMagic = [4]byte{'m', 'c', 'd', 1}

// summaryDeltaHeaderBytes: the magic, the probes (1 byte), log2 of the
// bits (1 byte), 2 bytes reserved (zero), the new summary's block count
// (4 bytes), the base's digest and the new summary's (8 bytes each), the
// count of flipped bits (4 bytes).
const summaryDeltaHeaderBytes = 32

// Digest is the xxhash of the summary's encoding (AppendBinary), by which
// a delta names the summaries it goes between.
func (s *Summary) Digest() uint64 {
	encoded, _ := s.AppendBinary(make([]byte, 0, s.Bytes()))
	return xxhash.Sum64(encoded)
}

// AppendDelta appends to b the delta that makes s from base, and reports
// whether it did: not when the two differ in size, nor when the delta
// would not be smaller than s sent whole (then s is sent whole).
func (s *Summary) AppendDelta(b []byte, base *Summary) ([]byte, bool) {
	if base == nil || len(base.words) != len(s.words) {
		return b, false
	}
	flips := 0
	for i, w := range s.words {
		flips += bits.OnesCount64(w ^ base.words[i])
	}
	// Each flip takes at least a byte: a delta of as many flips as the
	// whole filter has bytes is no smaller.
	if summaryDeltaHeaderBytes+flips >= s.Bytes() {
		return b, false
	}
	start := len(b)
	b = s.appendHeader(b, summaryDeltaMagic)
	b = binary.LittleEndian.AppendUint64(b, base.Digest())
	b = binary.LittleEndian.AppendUint64(b, s.Digest())
	b = binary.LittleEndian.AppendUint32(b, uint32(flips))
	// Each flipped bit as its distance from the bit after the last one.
	next := 0
	for i, w := range s.words {
		for x := w ^ base.words[i]; x != 0; x &= x - 1 {
			at := i*64 + bits.TrailingZeros64(x)
			b = binary.AppendUvarint(b, uint64(at-next))
			next = at + 1
		}
	}
	if len(b)-start >= s.Bytes() {
		return b[:start], false
	}
	return b, true
}

// ApplyDelta returns the summary that the encoded delta makes from base,
// checking every field, the digests and the summary it makes as
// ParseSummary checks one sent whole: a delta comes from another
// cluster's EPP, untrusted. base is left as it was.
func ApplyDelta(base *Summary, data []byte) (*Summary, error) {
	if base == nil {
		return nil, fmt.Errorf("%w: a delta without the summary it applies to", ErrBadSummary)
	}
	logBits, err := readHeader(data, summaryDeltaMagic, summaryDeltaHeaderBytes)
	switch {
	case err != nil:
		return nil, fmt.Errorf("a delta: %w", err)
	case logBits != bits.TrailingZeros(uint(len(base.words)*64)):
		return nil, fmt.Errorf("%w: a delta of 2^%d bits for a summary of %d", ErrBadSummary, logBits, len(base.words)*64)
	case binary.LittleEndian.Uint64(data[12:20]) != base.Digest():
		return nil, fmt.Errorf("%w: a delta from another summary than the one held", ErrBadSummary)
	}
	s := &Summary{words: append([]uint64(nil), base.words...), blocks: int(binary.LittleEndian.Uint32(data[8:12]))}
	want, flips := binary.LittleEndian.Uint64(data[20:28]), binary.LittleEndian.Uint32(data[28:32])
	size := uint64(len(s.words) * 64)
	rest, next := data[summaryDeltaHeaderBytes:], uint64(0)
	for range flips {
		gap, n := binary.Uvarint(rest)
		if n <= 0 || gap >= size-next {
			return nil, fmt.Errorf("%w: a delta's flipped bits run past the summary's %d", ErrBadSummary, size)
		}
		at := next + gap
		s.words[at/64] ^= 1 << (at % 64)
		rest, next = rest[n:], at+1
	}
	switch {
	case len(rest) > 0:
		return nil, fmt.Errorf("%w: %d bytes after a delta's %d flipped bits", ErrBadSummary, len(rest), flips)
	case s.Digest() != want:
		return nil, fmt.Errorf("%w: a delta that does not make the summary it names", ErrBadSummary)
	}
	if err := s.checkFill(); err != nil {
		return nil, err
	}
	return s, nil
}
