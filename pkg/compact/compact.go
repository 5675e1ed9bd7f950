// Package compact keeps many similar API objects small in memory: each is
// held encoded (CBOR, deterministic) and compressed (DEFLATE with a preset
// dictionary), and decoded again on each read.
//
// Why: a server of a large ClusterSet keeps thousands of computed objects
// (an import per exported pool, its history for resumable watches) that
// differ from each other by a few names and addresses. As Go values each
// costs one to two kilobytes of heap, mostly struct headers, condition
// messages and metadata that every other one repeats; compressed against a
// dictionary that already holds one such object, the same import takes
// about a hundred bytes. A read costs a decode (microseconds): the objects
// are read far less often than they are held.
package compact

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fxamacker/cbor/v2"
)

// Codec encodes and decodes the values of one kind. The first value it
// encodes becomes its dictionary: the others, of the same kind, share most
// of their bytes with it. A Codec is safe for concurrent use.
type Codec struct {
	enc cbor.UserBufferEncMode
	dec cbor.DecMode

	dict    atomic.Pointer[[]byte]
	writers sync.Pool // *flate.Writer, with the dictionary
	readers sync.Pool // io.ReadCloser implementing flate.Resetter
	buffers sync.Pool // *bytes.Buffer
}

// New returns a Codec.
func New() *Codec {
	// Core deterministic encoding: equal values have equal encodings, so
	// that two encodings can be compared as bytes.
	enc, err := cbor.CoreDetEncOptions().UserBufferEncMode()
	if err != nil {
		panic(fmt.Sprintf("compact: CBOR encoding options: %v", err))
	}
	dec, err := cbor.DecOptions{MaxArrayElements: 1 << 20, MaxMapPairs: 1 << 20}.DecMode()
	if err != nil {
		panic(fmt.Sprintf("compact: CBOR decoding options: %v", err))
	}
	return &Codec{enc: enc, dec: dec}
}

// Encode returns v encoded and compressed, as a string: its header is a
// word smaller than a slice's, and nothing changes it.
func (c *Codec) Encode(v any) (string, error) {
	raw, err := c.enc.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encoding %T: %w", v, err)
	}
	c.dict.CompareAndSwap(nil, &raw)
	dict := *c.dict.Load()
	out := c.buffer()
	defer c.buffers.Put(out)
	w, _ := c.writers.Get().(*flate.Writer)
	if w == nil {
		if w, err = flate.NewWriterDict(out, compressionLevel, dict); err != nil {
			return "", fmt.Errorf("compressing %T: %w", v, err)
		}
	} else {
		w.Reset(out)
	}
	defer c.writers.Put(w)
	if _, err := w.Write(raw); err != nil {
		return "", fmt.Errorf("compressing %T: %w", v, err)
	}
	if err := w.Close(); err != nil {
		return "", fmt.Errorf("compressing %T: %w", v, err)
	}
	return out.String(), nil
}

// Digest is a digest of what v holds: the first 128 bits of the SHA-256 of
// its deterministic encoding, so that equal values have equal digests in
// every process that has the same types, whatever its dictionary. It is
// cryptographic because the values hold what other clusters wrote: a
// member must not be able to make two different values share one.
type Digest [16]byte

// Digest returns the digest of v.
func (c *Codec) Digest(v any) (Digest, error) {
	raw := c.buffer()
	defer c.buffers.Put(raw)
	if err := c.enc.MarshalToBuffer(v, raw); err != nil {
		return Digest{}, fmt.Errorf("encoding %T: %w", v, err)
	}
	sum := sha256.Sum256(raw.Bytes())
	return Digest(sum[:16]), nil
}

// Decode decodes data, which Encode returned, into v (a pointer).
func (c *Codec) Decode(data string, v any) error {
	p := c.dict.Load()
	if p == nil {
		return fmt.Errorf("decoding %T: nothing was encoded by this codec", v)
	}
	dict := *p
	r, _ := c.readers.Get().(io.ReadCloser)
	if r == nil {
		r = flate.NewReaderDict(strings.NewReader(data), dict)
	} else if err := r.(flate.Resetter).Reset(strings.NewReader(data), dict); err != nil {
		return fmt.Errorf("decoding %T: %w", v, err)
	}
	defer c.readers.Put(r)
	raw := c.buffer()
	defer c.buffers.Put(raw)
	if _, err := raw.ReadFrom(r); err != nil {
		return fmt.Errorf("decoding %T: decompressing: %w", v, err)
	}
	if err := c.dec.Unmarshal(raw.Bytes(), v); err != nil {
		return fmt.Errorf("decoding %T: %w", v, err)
	}
	return nil
}

func (c *Codec) buffer() *bytes.Buffer {
	b, _ := c.buffers.Get().(*bytes.Buffer)
	if b == nil {
		return &bytes.Buffer{}
	}
	b.Reset()
	return b
}

// compressionLevel is flate's level 3: an import of 1,000 clusters
// compresses about 2.5% larger than at the default level (6) in a third less
// time, and small objects, which the dictionary compresses, no larger.
// Levels below 2 ignore the dictionary (small objects grow ninefold).
const compressionLevel = 3
