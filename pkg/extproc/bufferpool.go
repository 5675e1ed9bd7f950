package extproc

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// Buffers that are not cleared. gRPC's default buffer pool clears the
// whole capacity of every buffer it hands out, and its tiers jump from 32
// KiB to 1 MiB, so that a request body of 40 KiB had a megabyte cleared
// for each message read (the frames gathered to decode it) and written:
// the largest single cost of a request through the sidecar. Every user of
// FramePool writes each byte of a buffer before it reads it (a frame read
// off the connection, a message marshalled into it or copied into it to
// decode), so clearing buys nothing.

// Buffers of FramePool are powers of two from 1 KiB (gRPC does not pool
// smaller ones) to 8 MiB; a larger one is allocated and dropped.
const (
	minPoolShift = 10
	maxPoolShift = 23
)

// framePool is a mem.BufferPool of power-of-two size classes, whose
// buffers are handed out as they were put back.
type framePool struct {
	classes [maxPoolShift - minPoolShift + 1]sync.Pool
}

// FramePool is the buffer pool of the sidecar's gRPC connections to the
// gateway and to EPPs, and of FrameCodec.
var FramePool mem.BufferPool = &framePool{}

// Get returns a buffer of length n, its contents whatever they were.
func (p *framePool) Get(n int) *[]byte {
	shift := max(bits.Len(uint(max(n, 1)-1)), minPoolShift)
	if shift > maxPoolShift {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.classes[shift-minPoolShift].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<shift)
	return &b
}

// Put keeps b for a later Get if its capacity is one of the pool's sizes.
func (p *framePool) Put(b *[]byte) {
	c := cap(*b)
	shift := bits.Len(uint(c)) - 1
	if shift < minPoolShift || shift > maxPoolShift || c != 1<<shift {
		return
	}
	p.classes[shift-minPoolShift].Put(b)
}

// ServerBuffers is the server option that has a gRPC server read frames
// into FramePool's buffers.
func ServerBuffers() grpc.ServerOption { return experimental.BufferPool(FramePool) }

// DialBuffers is the dial option that has a gRPC client read frames into
// FramePool's buffers.
func DialBuffers() grpc.DialOption { return experimental.WithBufferPool(FramePool) }
